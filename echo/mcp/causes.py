"""The diagnosis's cause classes: what each means and what to do next, in one table keyed by cause.

Every answer that names a cause (find_stragglers' summaries and ``next_step``, explain_straggler, the
``rankecho diagnose`` text) reads its words from here, so the advice cannot drift between front ends.

Usage::

    CAUSE_TEXT["allocator"]                    # "in cudaMalloc/cudaFree (allocator)"
    next_step("allocator", "rank", node_id="node-b", rank=5, causal_chain_id="comm1:7")
"""

from __future__ import annotations

CATEGORIES = ("allocator", "slow_gpu", "memcpy", "cpu_contention", "sleeping", "host_compute")
"""The cause classes of a late call, in the order the analysis ranks them on a tie."""
CAUSE_TEXT = {
    "allocator": "in cudaMalloc/cudaFree (allocator)",
    "slow_gpu": "waiting in its own sync for its busy GPU (slow GPU)",
    "memcpy": "in blocking copies",
    "cpu_contention": "off the CPU while runnable (CPU contention)",
    "sleeping": "sleeping off the CPU outside CUDA calls (data loader, I/O or a lock)",
    "host_compute": "on the CPU in its own code (host compute)",
}
"""What each cause class means, in the words the summaries use."""
NEXT_STEPS = {
    "allocator": "pre-allocate buffers once and reuse them, or let the caching allocator keep memory "
    "(PyTorch: no torch.cuda.empty_cache() in the loop; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
    "slow_gpu": "check that GPU's clocks, temperature, power cap and errors (nvidia-smi -q -d "
    "CLOCK,PERFORMANCE,TEMPERATURE,POWER; XID errors in dmesg; NVML health) and compare with its peers",
    "memcpy": "use pinned host memory and non_blocking copies, and move copies off the critical path",
    "cpu_contention": "pin the rank's process to its own cores (taskset / numactl, the launcher's CPU "
    "binding) and move other work off them (isolate the cores, lower other processes' priority)",
    "sleeping": "if it is the data loader: more workers, prefetch and pinned memory; else find the lock "
    "or I/O it waits on (py-spy dump on that rank)",
    "host_compute": "profile that rank's own Python/CPU work before the collective (py-spy record) and "
    "move it off the step or spread it evenly over ranks",
}
"""What to do next about each cause, one sentence a person can act on."""
NODE_STEP = (
    "most ranks of the node were late together: look at the node itself (CPU frequency and load, PCIe "
    "and NIC errors, storage, daemons), then"
)
"""Prefixed to the cause's step when the straggler is a whole node."""
UNKNOWN_STEP = "look at the pre-call timeline of one late call to see what the rank was doing"


def next_step(
    cause: str | None, kind: str, node_id: str, rank: int | None, causal_chain_id: str | None = None
) -> str:
    """What to do next about a straggler: the cause's step, and where to see one late call in detail."""
    step = NEXT_STEPS.get(cause or "", UNKNOWN_STEP)
    if kind == "node":
        step = f"{NODE_STEP} {step}"
    if rank is not None and causal_chain_id:
        step += (
            f"; the pre-call timeline of its latest late call: rankecho explain --node-id {node_id} --rank "
            f"{rank} --causal-chain-id '{causal_chain_id}' (MCP: fleet.cluster.explain_straggler)"
        )
    return step
