"""The agent's event mix for a whole fleet, without the fleet: synthetic BPF records fed to the agent's own
:class:`rankecho.agent.tracker.Tracker`, so every point carries exactly what a real agent would send (metric
names, resource and point attributes, event ids, causal-chain ids, health scores).

One :class:`NodeModel` stands for one node's agent (one tracker, ``ranks_per_node`` traced processes). Each
simulated step a rank does what a ``rankecho sim`` rank of the seed scenario does, as the agent sees it
(measured on ``sim/scenarios/diagnosis/seed-rank5.yaml``: ~23 points per rank per step): a host-to-device
copy, a stream sync waiting for compute, ``buckets`` all-reduces on the world communicator, a stream sync
that completes them (the tracker then emits the collectives and the step's health score), a launch count,
and ~14 off-CPU intervals (the main thread asleep in the syncs, the NCCL progress and bootstrap threads,
an occasional preemption). A planted straggler stalls in ``cudaMalloc`` before the step's collectives
(the seed scenario's ``alloc_stall``) every ``every`` steps; its peers wait for it inside the collective,
and the whole step takes that much longer.

Usage::

    shape = AgentShape("fleet", "gpu", ranks=64, step_ns=90_000_000, start_ns=time.time_ns())
    nodes = [NodeModel(shape, n) for n in range(shape.nodes)]
    for node in nodes:
        node.step(0, shape.start_ns)
        body, points = node.flush()     # one OTLP request, as the node's agent would send it
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from rankecho.agent.clock import ClockConverter
from rankecho.agent.events import (
    FN,
    PAYLOAD_SIZE,
    STACK_SOURCE,
    CallRecord,
    InitRecord,
    OffCpuRecord,
    StackRecord,
)
from rankecho.agent.export import encode_batch
from rankecho.agent.identity import EnvIdentity, ProcessInfo
from rankecho.agent.jobid import TORCHELASTIC, JobEnv
from rankecho.agent.procstate import ProcKey
from rankecho.agent.settings import Settings
from rankecho.agent.stacks import StackKeeper
from rankecho.agent.tracker import DATATYPES, REDUCE_OPS, Tracker
from rankecho.shared import contract as c
from rankecho.shared.otlp import AttrValue, Point

SERVICE = "rankecho-agent"
"""The agent's service name: the generated points are the agent's, not the stress tool's."""
MS = 1_000_000
COUNT = 8_388_608
"""Elements per all-reduce bucket (bfloat16: 16 MiB), as the seed scenario's 64 MiB in 4 buckets."""
DTYPE = DATATYPES.index("bfloat16")
COLL_A3 = DTYPE | (REDUCE_OPS.index("sum") << 8)
STREAM = 0x5645_2A3B_1000
COPY_BYTES = 4 * 1024 * 1024
KERNELS_PER_STEP = 44
MALLOCS_PER_STALL = 8
MALLOC_BYTES = 362_300_000
PROGRESS_SLEEPS = 7
"""Off-CPU intervals per step of the NCCL progress thread (measured: 6.9)."""
GPU_MODEL = "NVIDIA H100 80GB HBM3"
PID_STRIDE = 10
ALLOC_STALL_STEPS = 3.2
"""A planted stall lasts this many steps (the seed scenario: 290 ms at 90 ms steps)."""
SYMBOLS = {0x1000: "ncclAllReduce", 0x1100: "cudaStreamSynchronize", 0x1200: "cudaMalloc",
           0x1300: "__clock_nanosleep", 0x1400: "cudaMemcpyAsync", 0x2000: "backward", 0x2100: "forward",
           0x2200: "allocate_cache", 0x2300: "optimizer_step", 0x2400: "fetch_batch", 0x3000: "run_step",
           0x3100: "main"}  # fmt: skip
"""The rank program's functions, as the agent's stacks name them (``agent/stacks.py`` looks up addr - 1)."""
STACKS = {
    FN.ALL_REDUCE: (0x1000, 0x2001, 0x3001, 0x3101),
    FN.MALLOC: (0x1200, 0x2201, 0x3001, 0x3101),
    "sync_forward": (0x1300, 0x1101, 0x2101, 0x3001, 0x3101),
    "sync_step": (0x1300, 0x1101, 0x2301, 0x3001, 0x3101),
    "between_steps": (0x1300, 0x2401, 0x3001, 0x3101),
    "sample": (0x2000, 0x3001, 0x3101),
}
"""Where the agent takes each stack of a step: at the collectives' and long calls' entry, at the main
thread's switch-outs, and the on-CPU sampler's (one sample a step, in backward)."""


def _symbols(pid: int, start: int, addrs: list[int]) -> list[str | None]:
    return [SYMBOLS.get(a & ~0xFF) for a in addrs]


@dataclass(frozen=True)
class Planted:
    """A rank made late on purpose: ``cudaMalloc`` for ``stall_ns`` before the step's collectives, on
    steps ``start_step``, ``start_step + every``, ..."""

    rank: int
    every: int
    start_step: int
    stall_ns: int
    cause: str = "alloc_stall"

    def late(self, step: int) -> bool:
        return step >= self.start_step and (step - self.start_step) % self.every == 0


def plant(ranks: int, count: int, step_ns: int, every: int = 14) -> tuple[Planted, ...]:
    """``count`` stragglers spread over the job (never two on one node when there is room), with start
    steps staggered so no two stall on the same step: each step has one cause to find."""
    count = max(0, min(count, ranks - 1, every))
    stall = int(ALLOC_STALL_STEPS * step_ns)
    return tuple(
        Planted(rank=(2 * i + 1) * ranks // (2 * count) | 1 if ranks > 1 else 0, every=every,
                start_step=7 + i * (every // max(count, 1)), stall_ns=stall)
        for i in range(count)
    )


@dataclass(frozen=True)
class AgentShape:
    """Everything that fixes a generated job (same shape -> same points, same event ids)."""

    cluster_id: str
    node_prefix: str
    ranks: int
    step_ns: int
    start_ns: int
    ranks_per_node: int = 8
    buckets: int = 4
    run_id: str = "r0"
    """Part of the communicator id and of the agents' instance ids: a new run id is a new job."""
    planted: tuple[Planted, ...] = ()
    flush_ns: int = 500 * MS
    """How much job time one node's request covers (the agent flushes every 0.5 s)."""
    gpus: bool = False
    """Each rank owns an NVML-visible GPU: its resource names it, and every window (1 s) the agent's six
    GPU gauges are sent for it (the simulator's ranks, and so the checked real run, have none)."""

    def __post_init__(self) -> None:
        for name in ("ranks", "step_ns", "ranks_per_node", "buckets", "flush_ns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.step_ns < 10 * MS:
            raise ValueError(f"--step-ms must be >= 10 (a step has phases), got {self.step_ns / MS:g}")
        for p in self.planted:
            if not 0 <= p.rank < self.ranks:
                raise ValueError(f"planted rank {p.rank} is outside 0..{self.ranks - 1}")

    @property
    def nodes(self) -> int:
        return -(-self.ranks // self.ranks_per_node)

    def node_id(self, node: int) -> str:
        return f"{self.node_prefix}-{node}"

    def node_ranks(self, node: int) -> range:
        return range(node * self.ranks_per_node, min(self.ranks, (node + 1) * self.ranks_per_node))

    def stall_ns(self, step: int) -> int:
        """How much later than its nominal length step ``step`` ends (the longest planted stall)."""
        return max((p.stall_ns for p in self.planted if p.late(step)), default=0)

    def planted_ranks(self) -> list[int]:
        return sorted(p.rank for p in self.planted)

    def unique_id(self) -> bytes:
        """The ncclUniqueId every rank passes to ncclCommInitRank (so every rank names the comm alike)."""
        seed = f"{self.cluster_id}/{self.node_prefix}/{self.run_id}".encode()
        return hashlib.shake_256(seed).digest(PAYLOAD_SIZE)


def _pid(rank: int) -> int:
    """The process id of ``rank``; its threads are ``pid + 1`` (NCCL bootstrap), ``pid + 2`` (progress)."""
    return 100_000 + PID_STRIDE * rank


def _handle(rank: int) -> int:
    """The ncclComm_t of ``rank``'s world communicator (any stable non-zero value)."""
    return 0x7F00_0000 + rank


def _fixed_clock() -> ClockConverter:
    """BPF time = Unix time: the generator writes Unix ns into the records it feeds the tracker."""
    return ClockConverter(samples=1, realtime=lambda: 0, monotonic=lambda: 0)


@dataclass
class _Rank:
    rank: int
    pid: int
    launches: int = 0


@dataclass
class NodeModel:
    """One node's agent: its tracker, its ranks' processes, the points waiting for the next flush."""

    shape: AgentShape
    node: int
    points: list[tuple[ProcKey | None, Point]] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.shape
        self.node_id = s.node_id(self.node)
        self.ranks = [_Rank(r, _pid(r)) for r in s.node_ranks(self.node)]
        self._late = {p.rank: p for p in s.planted}
        infos = {
            r.pid: ProcessInfo(r.pid, 4242 + r.rank, EnvIdentity(r.rank, s.ranks, r.rank % s.ranks_per_node,
                                                                  job_key=f"{s.cluster_id}:{s.run_id}",
                                                                  job=JobEnv(f"torchelastic:{s.run_id}",
                                                                             TORCHELASTIC)),
                               "simrank", s.start_ns - 50 * MS)
            for r in self.ranks
        }
        names = {0: "simrank", 1: "NCCL Bootstrap", 2: "NCCL Progress"}
        self.tracker = Tracker(
            self.node_id, _fixed_clock(), read_proc=infos.get, sink=self._sink, gpu_resource=self._gpu,
            thread_name=lambda pid, tid: names.get(tid - pid, ""),
            thread_group=lambda tid: tid - tid % PID_STRIDE if tid >= _pid(0) else None,
            raw_interval_ns=Settings.raw_interval_ns, health_every=Settings.health_every,
            stacks=StackKeeper(_symbols),
        )
        self.base: dict[str, AttrValue] = {
            c.SERVICE_NAME: SERVICE, c.SERVICE_INSTANCE_ID: f"{self.node_id}/{os.getpid()}/{s.run_id}",
            c.CLUSTER_NAME: s.cluster_id, c.NODE_NAME: self.node_id, c.HOST_NAME: self.node_id,
        }
        self._resources: dict[ProcKey | None, dict[str, AttrValue]] = {}
        self._started = False
        self._gpu_due = 0
        """Unix ns when the next GPU gauges go out."""

    def _sink(self, key: ProcKey | None, point: Point) -> None:
        self.points.append((key, point))
        if key is not None:
            self._resources[key] = self.tracker.resources[key]

    def flush(self) -> tuple[bytes, int]:
        """The points since the last flush as one OTLP request (the agent's own encoder)."""
        items, self.points = self.points, []
        resources: dict[ProcKey | None, dict[str, AttrValue]] = {**self._resources, None: {}}
        self._resources = {}
        batch = encode_batch(resources, items, self.base)
        return batch.data, batch.points

    # --- the job's life -------------------------------------------------------------------------
    def start(self, t: int) -> None:
        """Comm init and the start-up allocations, before step 0."""
        uid = self.shape.unique_id()
        for r in self.ranks:
            h = self.tracker.handle
            for i in range(10):
                ts = t - 40 * MS + i * MS
                h(CallRecord(r.pid, r.pid, FN.MALLOC, ts, ts + MS // 2, 0, 0, 8 * 1024 * 1024, 0, 0))
            init = CallRecord(r.pid, r.pid, FN.COMM_INIT_RANK, t - 20 * MS, t - 10 * MS, 0, self.shape.ranks,
                              r.rank, _handle(r.rank), 0)
            h(InitRecord(init, uid))
        self._started = True

    def finish(self, t: int) -> None:
        """Frees, comm destroy, process exit, the launches no collective carried and the drop counters
        the agent reports when it stops."""
        self.tracker.launch_counts({r.pid: (r.pid, r.launches) for r in self.ranks}, t, final=True)
        for r in self.ranks:
            h = self.tracker.handle
            for i in range(3):
                h(CallRecord(r.pid, r.pid, FN.FREE, t + i * MS, t + i * MS + 50_000, 0, 0, 0, 0, 0))
            h(CallRecord(r.pid, r.pid, FN.COMM_DESTROY, t + 5 * MS, t + 6 * MS, _handle(r.rank), 0, 0, 0, 0))
        self.tracker.close()
        for source in ("ringbuf", "spool"):
            attrs: dict[str, AttrValue] = {c.DROP_SOURCE: source}
            self._sink(None, Point(c.M_AGENT_DROPS, t + 7 * MS, 0, attrs))

    def _gpu(self, info: ProcessInfo) -> dict[str, AttrValue]:
        """The GPU resource attributes the agent adds when NVML sees the rank's device."""
        if not self.shape.gpus or info.env.local_rank is None:
            return {}
        idx = info.env.local_rank
        return {c.GPU_MODEL: GPU_MODEL, c.GPU_UUID: f"GPU-{self.node_id}-{idx}", c.GPU_INDEX: idx}

    def window(self, t: int) -> None:
        """The agent's periodic work (every second): the launch counters, and the GPU gauges every
        ``Settings.gpu_interval_s`` when the ranks have GPUs (the metrics and attributes of
        ``agent.gpu_watch.GpuWatch.sample``)."""
        self.tracker.launch_counts({r.pid: (r.pid, r.launches) for r in self.ranks}, t)
        if not self.shape.gpus or t < self._gpu_due:
            return
        self._gpu_due = t + int(Settings.gpu_interval_s * 1e9)
        for r in self.ranks:
            proc = self.tracker.procs.get(r.pid)
            if proc is None:
                continue
            gpu = self._gpu(proc.info)
            attrs = {c.GPU_INDEX: gpu[c.GPU_INDEX], c.GPU_UUID: gpu[c.GPU_UUID], c.GPU_MODEL: GPU_MODEL}
            for metric, value in (
                (c.M_GPU_UTIL, 97.0), (c.M_GPU_MEM_USED, 61_000_000_000 + r.rank), (c.M_GPU_SM_CLOCK, 1980),
                (c.M_GPU_TEMP, 64), (c.M_GPU_POWER, 612.5), (c.M_GPU_THROTTLE, 0),
            ):
                self._sink(proc.key, Point(metric, t, value, dict(attrs)))

    def step(self, k: int, t: int) -> None:
        """Step ``k`` of every rank on this node, starting at Unix ns ``t``."""
        if not self._started:
            self.start(t)
        s, h = self.shape, self.tracker.handle
        S = s.step_ns
        stall = s.stall_ns(k)
        enter = t + int(0.35 * S)
        done = t + int(0.97 * S) + stall  # every rank's collectives complete once the last rank entered
        for r in self.ranks:
            pid, main, boot, prog = r.pid, r.pid, r.pid + 1, r.pid + 2
            other_rank = _pid(r.rank ^ 1 if r.rank ^ 1 < s.ranks else r.rank)  # a neighbour: "job"
            # data loader: one host-to-device copy
            c0 = t + S // 200
            h(CallRecord(pid, main, FN.MEMCPY_ASYNC, c0, c0 + 4000, 0, STREAM, COPY_BYTES, 1, 0))
            r.launches += KERNELS_PER_STEP
            # compute: the host waits for the GPU in a stream sync, asleep
            s1 = t + S // 100
            self._stack(pid, main, s1, STACK_SOURCE.CALL, FN.STREAM_SYNC, "sync_forward")
            h(CallRecord(pid, main, FN.STREAM_SYNC, s1, enter - 200_000, 0, STREAM, 0, 0, 0))
            self._off(pid, main, s1 + 50_000, t + int(0.2 * S), FN.STREAM_SYNC, prog, "sync_forward")
            self._off(pid, main, t + int(0.2 * S) + 30_000, enter - 250_000, FN.STREAM_SYNC, 1,
                      "sync_forward")
            late = self._late.get(r.rank)
            my_enter = enter
            if late is not None and late.late(k):
                # the planted cause: large allocations right before the collectives
                each = late.stall_ns // MALLOCS_PER_STALL
                for i in range(MALLOCS_PER_STALL):
                    m0 = enter - 100_000 + i * each
                    self._stack(pid, main, m0, STACK_SOURCE.CALL, FN.MALLOC, FN.MALLOC)
                    h(CallRecord(pid, main, FN.MALLOC, m0, m0 + each - 20_000, 0, 0, MALLOC_BYTES, 0, 0))
                    self._off(pid, main, m0 + 30_000, m0 + each - 40_000, FN.MALLOC, 1, FN.MALLOC)
                my_enter = enter + late.stall_ns
            self._stack(pid, main, my_enter - 2 * MS, STACK_SOURCE.SAMPLE, FN.NONE, "sample")
            for b in range(s.buckets):
                e0 = my_enter + b * 25_000
                self._stack(pid, main, e0, STACK_SOURCE.CALL, FN.ALL_REDUCE, FN.ALL_REDUCE)
                h(CallRecord(pid, main, FN.ALL_REDUCE, e0, e0 + 18_000, _handle(r.rank), STREAM, COUNT,
                             COLL_A3, 0, r.launches))
            r.launches += 2  # optimizer kernels after the collectives (the window read counts them)
            s2 = my_enter + s.buckets * 25_000 + 500_000
            self._stack(pid, main, s2, STACK_SOURCE.CALL, FN.STREAM_SYNC, "sync_step")
            h(CallRecord(pid, main, FN.STREAM_SYNC, s2, done, 0, STREAM, 0, 0, 0))
            third = max(1, (done - s2) // 3)
            for i in range(3):
                self._off(pid, main, s2 + i * third + 20_000, s2 + (i + 1) * third - 20_000, FN.STREAM_SYNC,
                          other_rank if i == 1 else 1, "sync_step")
            # the main thread between steps, the NCCL helper threads, a rare preemption
            self._off(pid, main, done + 50_000, done + 350_000, FN.NONE, other_rank, "between_steps")
            gap = (S + stall) // PROGRESS_SLEEPS
            for i in range(PROGRESS_SLEEPS):
                self._off(pid, prog, t + i * gap + 100_000, t + (i + 1) * gap - 100_000, FN.NONE,
                          other_rank if i % 2 else 1)
            if (k + r.rank) % 5:
                self._off(pid, boot, t + S // 3, t + S // 3 + S // 4, FN.NONE, 1)
            if (k + r.rank) % 7 == 3:
                self._stack(pid, main, t + S // 2, STACK_SOURCE.OFFCPU, FN.NONE, "sample")
                h(OffCpuRecord(pid, main, t + S // 2, t + S // 2 + 3 * MS, 0, False, FN.NONE, 1))

    def _stack(self, pid: int, tid: int, ts: int, source: STACK_SOURCE, call: FN, where: object) -> None:
        """The stack BPF takes at ``ts`` (it precedes the call or off-CPU record it belongs to)."""
        self.tracker.handle(StackRecord(pid, tid, ts, source, call, STACKS[where]))

    def _off(self, pid: int, tid: int, out: int, back: int, call: FN, by: int, where: object = None) -> None:
        """A thread asleep from ``out`` to ``back`` (woken 3 us before it ran again, behind ``by``); the
        main thread's (``where`` its stack) carry the stack taken at the switch-out when long enough."""
        back = max(back, out + 1000)
        if where is not None and back - out >= Settings.offcpu_min_ns:
            self._stack(pid, tid, out, STACK_SOURCE.OFFCPU, call, where)
        self.tracker.handle(OffCpuRecord(pid, tid, out, back, back - 3000, True, call, by))
