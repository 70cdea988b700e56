"""Pipeline stages and FSDP-like collectives in a scenario's step (sim/scenario.py calls it): validation,
the rank options, and the ground truth of the send/recv pairs.

    step: {compute_ms: 30, pipeline_stages: 3, activation_mb: 8}    # stage i sends to stage i + 1
    step: {compute_ms: 30, allgather_mb: 32, reducescatter_mb: 32}  # gather before, scatter after

With ``pipeline_stages: S`` the world's ranks form S contiguous stages (stage = rank // (world / S)); each
rank's pipeline communicator ``pp`` holds one rank per stage, in stage order. Every step each stage sends
``activation_mb`` to the next stage after its forward kernels (ncclSend/ncclRecv) and the gradients back
before its backward ones, each exchange followed by a stream sync (sim/src/simrank_pipeline.c). The
all-gather and reduce-scatter run on the world communicator (their size: the gathered / reduced total).
Settings that could never take effect are refused with the fix, as everywhere in the scenario format.
"""

from __future__ import annotations

from typing import Any

from rankecho.sim.scenario import Scenario, ScenarioError
from rankecho.sim.scenario import _number as number

PIPELINE_COMM = "pp"
"""The pipeline communicator's name in rank logs and the ground truth (a split may not take it)."""
LAT_US, BUS_GBPS = 20.0, 80.0
"""The fake libnccl's per-op latency and default bus bandwidth (sim/src/simint.h)."""


def pipeline_fields(d: dict[str, Any]) -> None:
    """Validate the step's pipeline and FSDP keys in place (``d``: the raw ``step`` mapping)."""
    if "pipeline_stages" in d:
        d["pipeline_stages"] = number("step.pipeline_stages", d["pipeline_stages"], minimum=1, integer=True)
    if "activation_mb" in d:
        d["activation_mb"] = float(number("step.activation_mb", d["activation_mb"], positive=True))
        if d.get("pipeline_stages", 1) < 2:
            raise ScenarioError(
                "step.activation_mb: there is no pipeline to carry it; set step.pipeline_stages "
                ">= 2 or remove activation_mb"
            )
    for key in ("allgather_mb", "reducescatter_mb"):
        if key in d:
            d[key] = float(number(f"step.{key}", d[key], positive=True))


def check_pipeline(sc: Scenario) -> None:
    """Refuse stages that do not divide the world, pipeline or FSDP collectives in the Python rank or on a
    one-rank world (nothing to exchange), and a split named like the pipeline communicator."""
    st, world = sc.step, sc.world_size
    fsdp = st.allgather_mb > 0 or st.reducescatter_mb > 0
    if (st.pipeline_stages > 1 or fsdp) and sc.program != "c":
        raise ScenarioError(
            "step: only the C rank simulates pipeline stages, allgather_mb and reducescatter_mb; "
            "use program: c"
        )
    if world % st.pipeline_stages:
        divisors = [k for k in range(2, world + 1) if world % k == 0]
        raise ScenarioError(
            f"step.pipeline_stages: {st.pipeline_stages} does not divide the world size {world}; "
            f"pick one of {divisors}"
        )
    if fsdp and world < 2:
        raise ScenarioError(
            "step: a one-rank world gathers and scatters nothing; use at least 2 ranks or drop "
            "allgather_mb / reducescatter_mb"
        )
    for i, c in enumerate(sc.communicators):
        if c.name == PIPELINE_COMM and st.pipeline_stages > 1:
            raise ScenarioError(
                f"communicators[{i}].name: {PIPELINE_COMM!r} is the pipeline's communicator; "
                "pick another name"
            )


def pipeline_argv(sc: Scenario) -> list[str]:
    """simrank's options for the step's pipeline and FSDP collectives (nothing when it has neither)."""
    st = sc.step
    argv = []
    if st.pipeline_stages > 1:
        argv += ["--pipeline", f"{st.pipeline_stages}:{int(st.activation_mb * 2**20) // 2 * 2}"]
    if st.allgather_mb > 0:
        argv += ["--allgather-bytes", str(int(st.allgather_mb * 2**20))]
    if st.reducescatter_mb > 0:
        argv += ["--reducescatter-bytes", str(int(st.reducescatter_mb * 2**20))]
    return argv


def stage_of(sc: Scenario, rank: int) -> int:
    return rank // (sc.world_size // sc.step.pipeline_stages)


def p2p_transfer_ms(sc: Scenario, nbytes: int, slow: float = 1.0) -> float:
    """The fake libnccl's send/recv transfer (comm.c transfer_ns): latency plus the bytes at the bus
    bandwidth divided by ``slow``."""
    return round((LAT_US * 1000 + nbytes * slow / (sc.bus_gbps or BUS_GBPS)) / 1e6, 3)


def pipeline_pairs(sc: Scenario) -> list[dict[str, Any]]:
    """Every send/recv pair of one step, forward then backward: src and dst world ranks, their stages and
    nodes, and its true transfer time (ms, healthy)."""
    if sc.step.pipeline_stages < 2:
        return []
    node_of = {rank: node.id for rank, node, _ in sc.rank_layout()}
    per = sc.world_size // sc.step.pipeline_stages
    nbytes = int(sc.step.activation_mb * 2**20) // 2 * 2
    out = []
    for direction, step in (("forward", 1), ("backward", -1)):
        for src in range(sc.world_size):
            dst = src + step * per
            if 0 <= dst < sc.world_size:
                out.append(
                    {
                        "src": src,
                        "dst": dst,
                        "direction": direction,
                        "src_stage": stage_of(sc, src),
                        "dst_stage": stage_of(sc, dst),
                        "nodes": [node_of[src], node_of[dst]],
                        "inter_node": node_of[src] != node_of[dst],
                        "bytes": nbytes,
                        "transfer_ms": p2p_transfer_ms(sc, nbytes),
                    }
                )
    return out


def pipeline_truth(sc: Scenario) -> dict[str, Any] | None:
    """The ground truth's ``pipeline`` section (None for a step without stages or FSDP collectives)."""
    st = sc.step
    if st.pipeline_stages < 2 and not st.allgather_mb and not st.reducescatter_mb:
        return None
    per = sc.world_size // st.pipeline_stages
    return {
        "stages": st.pipeline_stages,
        "stage_ranks": [list(range(k * per, (k + 1) * per)) for k in range(st.pipeline_stages)],
        "pairs": pipeline_pairs(sc),
        "allgather_bytes": int(st.allgather_mb * 2**20),
        "reducescatter_bytes": int(st.reducescatter_mb * 2**20),
    }


def slowed_pairs(sc: Scenario, struck: set[int], nic: bool, factor: float) -> list[dict[str, Any]]:
    """The send/recv pairs a slow_link on ``struck`` slows (a NIC: only pairs between two nodes), each with
    its true transfer healthy and slowed."""
    return [
        {**p, "slow_transfer_ms": p2p_transfer_ms(sc, p["bytes"], factor)}
        for p in pipeline_pairs(sc)
        if {p["src"], p["dst"]} & struck and (p["inter_node"] or not nic)
    ]
