"""Every OTLP attribute key and metric name rankecho puts on the wire, and how Echo maps them to columns.

OpenTelemetry semantic-convention keys are used where one exists; everything else lives under the
``rankecho.`` namespace. The one exception is ``causal_chain_id``: it is kept bare because the seed's
queries read ``json_extract_string(attrs_json, '$.causal_chain_id')`` and seed-style producers send it.
``docs/contract.md`` renders this module as a table; keep the two in step.

Usage::

    from rankecho.shared import contract as c
    resource = {c.CLUSTER_NAME: "demo", c.NODE_NAME: "node-a", c.RANK: 5, c.NRANKS: 8}
"""

from __future__ import annotations

import hashlib
from typing import Final

# --- Resource attributes: semantic conventions --------------------------------------------------
CLUSTER_NAME: Final = "k8s.cluster.name"
NODE_NAME: Final = "k8s.node.name"
HOST_NAME: Final = "host.name"
SERVICE_NAME: Final = "service.name"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
PROCESS_PID: Final = "process.pid"
K8S_POD_NAME: Final = "k8s.pod.name"
K8S_NAMESPACE_NAME: Final = "k8s.namespace.name"

# --- Resource attributes: rankecho namespace ---------------------------------------------------
RANK: Final = "rankecho.rank"
NRANKS: Final = "rankecho.nranks"
LOCAL_RANK: Final = "rankecho.local_rank"
GPU_MODEL: Final = "rankecho.gpu.model"
GPU_UUID: Final = "rankecho.gpu.uuid"
PROCESS_START_NS: Final = "rankecho.process.start_ns"
JOB_ID: Final = "rankecho.job.id"
"""Which job the process belongs to (see :mod:`rankecho.agent.jobid`); absent from older agents."""
JOB_SOURCE: Final = "rankecho.job.source"
"""The rule that gave ``rankecho.job.id``: explicit, torchelastic, slurm, k8s, rendezvous or local."""

# --- Plain keys sent by seed-style producers (accepted by Echo, never sent by the agent) --------
PLAIN_CLUSTER_ID: Final = "cluster_id"
PLAIN_NODE_ID: Final = "node_id"
PLAIN_RANK: Final = "rank"
PLAIN_NRANKS: Final = "nranks"

# --- Point attributes -----------------------------------------------------------------------
CAUSAL_CHAIN_ID: Final = "causal_chain_id"
"""``<comm_id>:<seq>``; identical on every rank for the same collective instance."""
EVENT_ID: Final = "rankecho.event_id"
"""Producer-chosen id; Echo stores a resent event once. Without it Echo hashes the content."""
COMM_ID: Final = "rankecho.nccl.comm_id"
SEQ: Final = "rankecho.nccl.seq"
SEQ_ALIGNED: Final = "rankecho.nccl.seq_aligned"
"""False when the agent attached mid-run, so ``seq`` counts from attach, not from comm init."""
OP: Final = "rankecho.nccl.op"
BYTES: Final = "rankecho.bytes"
COUNT: Final = "rankecho.nccl.count"
DATATYPE: Final = "rankecho.nccl.datatype"
PEER: Final = "rankecho.nccl.peer"
PARENT_COMM_ID: Final = "rankecho.nccl.parent_comm_id"
ENTER_NS: Final = "rankecho.enter_ns"
RETURN_NS: Final = "rankecho.return_ns"
COMPLETE_NS: Final = "rankecho.complete_ns"
CUDA_CALL: Final = "rankecho.cuda.call"
CALL_IN_FLIGHT: Final = "rankecho.call_in_flight"
TID: Final = "thread.id"
THREAD_NAME: Final = "thread.name"
OFFCPU_STATE: Final = "rankecho.sched.state"
"""``sleeping`` (blocked, left the CPU voluntarily) or ``preempted`` (runnable, pushed off)."""
WINDOW_NS: Final = "rankecho.window_ns"
GPU_INDEX: Final = "rankecho.gpu.index"
COMM_RANK: Final = "rankecho.nccl.comm_rank"
"""This rank's position in the communicator of the event (differs from the resource rank in split comms)."""
COMM_NRANKS: Final = "rankecho.nccl.comm_nranks"
REDUCE_OP: Final = "rankecho.nccl.reduce_op"
"""``sum``, ``prod``, ``max``, ``min`` or ``avg`` for reducing collectives."""
IN_GROUP: Final = "rankecho.nccl.in_group"
"""True when the call sat between ncclGroupStart and ncclGroupEnd (it was only enqueued)."""
STREAM: Final = "rankecho.cuda.stream"
"""The cudaStream_t handle as an integer: equal values on one process mean the same stream."""
MEMCPY_KIND: Final = "rankecho.cuda.memcpy_kind"
PREEMPTED_BY: Final = "rankecho.sched.preempted_by"
"""Of a preempted interval: ``job`` (a thread of a traced process took the CPU: the node's ranks compete
for its CPUs) or ``other`` (another workload, a daemon or the kernel did)."""
RUNQ_MS: Final = "rankecho.sched.runq_ms"
"""Of an off-CPU interval, the ms between wakeup and running again (waiting for a CPU)."""
HEALTH_COMPUTE_MS: Final = "rankecho.health.compute_ms"
"""Of a health point: ms from the previous collective's completion to this collective's enter."""
HEALTH_BASELINE_MS: Final = "rankecho.health.baseline_ms"
"""Of a health point: the rank's median compute_ms over its recent steps."""
PRE_WINDOW_MS: Final = "rankecho.pre.window_ms"
"""Of a collective: the length of its rank's pre-call window, summarised by the agent (docs/contract.md):
from the previous call on the communicator (its completion when a sync had waited for it before this call,
else its return; 500 ms when there was none) to this call's enter. Its presence says the point carries
the breakdown below; a class the window did not contain is left out (0)."""
PRE_CLASSES: Final = ("allocator", "slow_gpu", "memcpy", "cpu_contention", "sleeping")
"""The cause classes the window is broken down into, as Echo's staging categorises raw intervals."""
PRE_PREFIX: Final = "rankecho.pre."
"""``rankecho.pre.<class>_ms`` (time in that class inside the window) for each of ``PRE_CLASSES``."""
PRE_PRESYNC_MS: Final = "rankecho.pre.presync_ms"
"""Of a collective whose window began at the previous call's completion: ms blocked in syncs in the
window, less the run-queue waits behind other work that ended them (the GPU rule's input)."""
LAUNCHES: Final = "rankecho.cuda.launches"
"""Of a step's first collective: cudaLaunchKernel calls by its thread since the previous count."""
STACK_ID: Final = "rankecho.stack.id"
"""Of a collective (its enter), a raw interval (a long CUDA call's entry, an off-CPU switch-out) or a
stack point: 16 lowercase hex digits, a content hash of the symbolised frames (``stack_id`` in
:mod:`rankecho.shared.stacks`), so equal stacks have equal ids on every node and across restarts."""
STACK_FRAMES: Final = "rankecho.stack.frames"
"""Of a stack point: the frames, innermost (callee) first, joined by newlines. A native frame
is its function (``cudaMalloc``; GCC clone suffixes such as ``.constprop.0`` dropped; ``[unknown]`` when
no symbol covers it); a Python frame is ``<file basename>:<function>:<line>`` (``train.py:forward:88``)."""
STACK_TRUNCATED: Final = "rankecho.stack.truncated"
"""Of a stack point: true when the walk stopped early (a binary without frame pointers, or the depth
cap), so the outer frames are missing rather than absent."""
PRE_STACK_SUFFIX: Final = "_stack"
"""``rankecho.pre.<class>_stack``: of a collective with the breakdown, the id of the stack that carried
the most time of that class in the window (one per class present)."""
PRE_ONCPU_STACK: Final = "rankecho.pre.oncpu_stack"
"""Of a collective with the breakdown: the stack the low-rate on-CPU sampler saw most in the window (the
host-compute share's stack); absent when no sample fell in the window."""
PRE_ONCPU_SAMPLES: Final = "rankecho.pre.oncpu_samples"
"""Of a collective with ``PRE_ONCPU_STACK``: the number of on-CPU samples of the window."""
EXIT_STATUS: Final = "rankecho.process.exit_status"
"""Of a process exit: the status it passed to exit_group (0..255); absent when it died another way (a
signal) or the agent missed the call."""
STATE_CALL: Final = "rankecho.state.call"
"""Of a rank-state point: the traced function its collective-calling thread is inside now (absent: none)."""
STATE_CALL_SINCE_NS: Final = "rankecho.state.call_since_ns"
"""Of a rank-state point with ``STATE_CALL``: when that call was entered (unix ns, node clock)."""
STATE_OFFCPU_SINCE_NS: Final = "rankecho.state.offcpu_since_ns"
"""Of a rank-state point: when the thread went off the CPU, if it is off it now (unix ns, node clock)."""
STATE_SLEEPING: Final = "rankecho.state.sleeping"
"""Of a rank-state point with ``STATE_OFFCPU_SINCE_NS``: true when the thread blocked (sleep, poll, a lock),
false when it was preempted and waits for a CPU."""
DROP_SOURCE: Final = "rankecho.agent.drop_source"
"""Of a drop count: ``ringbuf`` (kernel side full) or ``spool`` (disk spool over its size bound)."""

# --- Metric names (the ``metric_name`` column) ---------------------------------------------------
M_COLLECTIVE: Final = "rankecho.nccl.collective"
"""One per collective per rank. timestamp = enter; value_double = ms from enter to completion."""
M_COMM_INIT: Final = "rankecho.nccl.comm_init"
M_COMM_DESTROY: Final = "rankecho.nccl.comm_destroy"
M_CUDA_SYNC: Final = "rankecho.cuda.sync"
"""value_double = ms the host thread was blocked in a stream/event/device sync."""
M_KERNEL_LAUNCHES: Final = "rankecho.cuda.kernel_launches"
"""value_int = cudaLaunchKernel calls in the window ``rankecho.window_ns`` ending at timestamp."""
M_CUDA_MALLOC: Final = "rankecho.cuda.malloc"
M_CUDA_FREE: Final = "rankecho.cuda.free"
M_CUDA_MEMCPY: Final = "rankecho.cuda.memcpy"
M_OFFCPU: Final = "rankecho.sched.offcpu"
"""timestamp = switch-out; value_double = ms off CPU; state and call in flight as attributes."""
M_HEALTH: Final = "rankecho.health.score"
"""Per-rank health in [0, 1]; formula in docs/health.md. The stress tool's synthetic metric too."""
M_STACK: Final = "rankecho.stack"
"""One per distinct stack per agent (shipped once per node, then referenced by ``rankecho.stack.id``).
timestamp = first seen; value_int = number of frames; attributes ``STACK_ID``, ``STACK_FRAMES``,
``STACK_TRUNCATED``."""
M_PROCESS_EXIT: Final = "rankecho.process.exit"
"""One per traced process that exits while its agent runs. timestamp = exit; value_int = the exit status
(``rankecho.process.exit_status``), -1 when unknown."""
M_RANK_STATE: Final = "rankecho.rank.state"
"""What a quiet rank is doing now: sent every heartbeat (agent ``--heartbeat-s``) for each rank that has
entered no collective for that long. timestamp = now; value_double = seconds since its last collective
entry; ``STATE_*`` attributes, ``STACK_ID`` of its switch-out stack when off the CPU, the last heartbeat's
time by cause class as ``rankecho.pre.*`` (``PRE_WINDOW_MS`` long), and the instance it is to enter next as
``CAUSAL_CHAIN_ID``. Hang analysis: ``fleet.cluster.find_hangs`` (``doing``)."""
M_GPU_UTIL: Final = "rankecho.gpu.utilization"
M_GPU_MEM_USED: Final = "rankecho.gpu.memory.used"
M_GPU_SM_CLOCK: Final = "rankecho.gpu.clock.sm"
M_GPU_TEMP: Final = "rankecho.gpu.temperature"
M_GPU_POWER: Final = "rankecho.gpu.power"
M_GPU_THROTTLE: Final = "rankecho.gpu.throttle_reasons"
M_AGENT_DROPS: Final = "rankecho.agent.dropped_events"
M_AGENT_SPOOL_POINTS: Final = "rankecho.agent.spool.points"
"""value_int = points waiting in the agent's disk spool (Echo unreachable, or the spool draining)."""
M_AGENT_SPOOL_AGE: Final = "rankecho.agent.spool.age_s"
"""value_double = seconds since the oldest spooled request was written (0 when the spool is empty)."""

# --- How Echo turns resource/point attributes into columns ---------------------------------------
# First key present wins; resource attributes are consulted before point attributes (docs/contract.md).
COLUMN_SOURCES: Final[dict[str, tuple[str, ...]]] = {
    "cluster_id": (CLUSTER_NAME, PLAIN_CLUSTER_ID),
    "node_id": (NODE_NAME, PLAIN_NODE_ID, HOST_NAME),
    "rank": (RANK, PLAIN_RANK),
    "nranks": (NRANKS, PLAIN_NRANKS),
}
"""Keys consumed into a column are left out of ``attrs_json``; every other key goes there."""

PROMOTED_COPIES: Final[dict[str, str]] = {"causal_chain_id": CAUSAL_CHAIN_ID}
"""Columns copied from an attribute that also stays in ``attrs_json`` (the seed's queries read it there)."""


def causal_chain_id(comm_id: str, seq: int) -> str:
    """The cross-rank id of one collective instance: the same string on every rank of the communicator."""
    return f"{comm_id}:{seq}"


def event_id(
    node_id: str, pid: int, process_start_ns: int | None, metric: str, tid: int | None, timestamp_ns: int,
    chain: str | None,
) -> str:
    """The ``rankecho.event_id`` the node agent gives a traced process's point: 16 hex characters of MD5
    over what the point itself carries (node, process, metric, thread, time, causal chain). Echo rebuilds
    it from a typed row's columns (``echo/store/typed_events.py``, ``derived_id``), so a collective or
    raw interval need not store its id; MD5 because DuckDB computes it too (not for security)."""
    parts = (node_id, pid, process_start_ns or "", metric, tid or "", timestamp_ns, chain or "")
    return hashlib.md5("\x1f".join(map(str, parts)).encode(), usedforsecurity=False).hexdigest()[:16]
