"""Turns decoded BPF records into contract points: identity, sequence numbers, completion, steps.

Pure apart from two injected readers (process identity and thread names), so tests drive it with
synthetic records. One :class:`Tracker` per agent; points go to ``sink(process_key, point)`` where
``process_key`` is ``(pid, start_ticks)`` (``None`` for node-level points).

The tracker dispatches records, keeps the traced processes and their resources, stamps every point
(event id, chain id, thread name) and turns CUDA calls and stacks into points; the NCCL path
(communicators, collectives, the syncs that complete them, steps) is :mod:`rankecho.agent.collectives`,
off-CPU intervals :mod:`rankecho.agent.offcpu` and kernel-launch counts :mod:`rankecho.agent.launches`,
each holding a reference to its tracker.

Usage::

    tracker = Tracker(node_id="n1", clock=ClockConverter(), read_proc=lambda pid: read_process("/proc", pid),
                      sink=lambda key, point: batch.append((key, point)))
    tracker.handle(decode(raw))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from rankecho.agent.clock import ClockConverter
from rankecho.agent.collectives import (
    DATATYPE_BYTES,
    DATATYPES,
    HEALTH_MOVE,
    PENDING_TIMEOUT_NS,
    REDUCE_OPS,
    Collectives,
)
from rankecho.agent.events import (
    COLLECTIVES,
    FN,
    P2P,
    STACK_SOURCE,
    SYMBOLS,
    SYNCS,
    CallRecord,
    ExitRecord,
    InitRecord,
    OffCpuRecord,
    Record,
    StackRecord,
)
from rankecho.agent.identity import ProcessInfo, short_hash
from rankecho.agent.jobid import JobIds
from rankecho.agent.journal import CommJournal
from rankecho.agent.launches import LAUNCH_QUIET_NS, Launches
from rankecho.agent.offcpu import OffCpu
from rankecho.agent.procstate import Proc, ProcKey
from rankecho.agent.stacks import StackKeeper
from rankecho.agent.window import WindowKeeper
from rankecho.shared import contract as c
from rankecho.shared.otlp import AttrValue, Point

Sink = Callable[[ProcKey | None, Point], None]

__all__ = [
    "DATATYPES", "DATATYPE_BYTES", "HEALTH_MOVE", "LAUNCH_QUIET_NS", "MEMCPY_KINDS", "PENDING_TIMEOUT_NS",
    "REDUCE_OPS", "SIMPLE_CALLS", "ProcKey", "Sink", "Tracker",
]
"""Also the constants of the tracker's parts, importable from here as before the split."""

STACKS_HELD = 4096
"""Stack ids held for the record they precede before the table starts over (a thread whose next record
never came, e.g. one that exited, must not grow it forever)."""
MEMCPY_KINDS = ("host_to_host", "host_to_device", "device_to_host", "device_to_device", "default")
SIMPLE_CALLS: dict[FN, str] = {
    FN.MALLOC: c.M_CUDA_MALLOC,
    FN.FREE: c.M_CUDA_FREE,
    FN.MEMCPY: c.M_CUDA_MEMCPY,
    FN.MEMCPY_ASYNC: c.M_CUDA_MEMCPY,
}


class Tracker:
    """One agent's record handler: dispatches each record to the part that makes points of it."""

    def __init__(
        self,
        node_id: str,
        clock: ClockConverter,
        read_proc: Callable[[int], ProcessInfo | None],
        sink: Sink,
        thread_name: Callable[[int, int], str] = lambda pid, tid: "",
        thread_group: Callable[[int], int | None] = lambda tid: None,
        throttled: Callable[[ProcessInfo], bool] = lambda info: False,
        gpu_resource: Callable[[ProcessInfo], dict[str, AttrValue]] = lambda info: {},
        pending_timeout_ns: int = PENDING_TIMEOUT_NS,
        journal: CommJournal | None = None,
        raw_interval_ns: int = 0,
        health_every: int = 1,
        stacks: StackKeeper | None = None,
        launch_quiet_ns: int = LAUNCH_QUIET_NS,
    ) -> None:
        """``raw_interval_ns``: which raw intervals go out besides each collective's pre-call breakdown
        (:mod:`rankecho.agent.window`; 0 = all of them). ``health_every``: send every Nth step's health
        score (and any that moved by ``HEALTH_MOVE``)."""
        self.node_id = node_id
        self.windows = WindowKeeper(raw_interval_ns)
        self.journal = journal
        """Communicators seen created, on disk: a restarted agent names them as its predecessor did."""
        self.clock = clock
        self._read_proc = read_proc
        self._thread_name = thread_name
        self._gpu_resource = gpu_resource
        self._sink = sink
        self.procs: dict[int, Proc] = {}
        self.exited: dict[int, Proc] = {}
        """Processes whose exit was seen; kept until their last launch counts are read."""
        self.resources: dict[ProcKey, dict[str, AttrValue]] = {}
        """Resource attributes of every process a point was emitted for (read when batching)."""
        self._retired: list[ProcKey] = []
        self.jobs = JobIds(node_id)
        """Job id of every traced process (rendezvous generations are per agent)."""
        self.stacks = stacks
        """Symbolises stack records and remembers which stacks went out (None: stack records ignored)."""
        self._stack_of: dict[int, tuple[int, str]] = {}
        """tid -> (ts, stack id) of the stack record preceding that thread's next call or off-CPU record."""
        self.collectives = Collectives(self, throttled, pending_timeout_ns, health_every)
        """Communicators, collectives, their completion by syncs, steps and health scores."""
        self.offcpu = OffCpu(self, thread_group)
        self.launches = Launches(self, launch_quiet_ns)

    # --- processes ------------------------------------------------------------------------------
    def track(self, info: ProcessInfo) -> Proc:
        """Start (or continue) tracking a process; a new start time under a known pid replaces it."""
        proc = self.procs.get(info.pid)
        if proc is not None and proc.info.start_ticks in (info.start_ticks, 0):
            return proc
        if proc is not None:
            self._finish(proc)
        proc = Proc(info, rank=info.env.rank, nranks=info.env.world_size)
        self.procs[info.pid] = proc
        return proc

    def proc_of(self, pid: int) -> Proc:
        """The process a record of ``pid`` belongs to (tracked from its first record)."""
        proc = self.procs.get(pid)
        if proc is not None:
            return proc
        info = self._read_proc(pid)
        old = self.exited.get(pid)
        if old is not None and (info is None or info.start_ticks == old.info.start_ticks):
            # A record of a process whose exit was already seen (a thread switching in to die): it
            # belongs to that process, not to a new one; a zombie's environ reads empty.
            return old
        return self.track(info or ProcessInfo(pid, 0))

    def _resource(self, proc: Proc) -> dict[str, AttrValue]:
        """Resource attributes of one traced process (rank, nranks, local rank, pid, k8s)."""
        attrs: dict[str, AttrValue] = {c.PROCESS_PID: proc.info.pid}
        if proc.info.start_ns:
            attrs[c.PROCESS_START_NS] = proc.info.start_ns
        env = proc.info.env
        for name, value in (
            (c.RANK, proc.rank),
            (c.NRANKS, proc.nranks),
            (c.LOCAL_RANK, env.local_rank),
            (c.K8S_POD_NAME, env.pod),
            (c.K8S_NAMESPACE_NAME, env.namespace),
        ):
            if value is not None:
                attrs[name] = value
        job = self.jobs.job_of(proc.key, env.job, proc.info.start_ns)
        attrs[c.JOB_ID] = job.id
        attrs[c.JOB_SOURCE] = job.source
        attrs.update(self._gpu_resource(proc.info))
        return attrs

    # --- records --------------------------------------------------------------------------------
    def handle(self, rec: Record) -> None:
        """One decoded BPF record: to the part that makes points of it."""
        if isinstance(rec, CallRecord):
            self._call(rec)
        elif isinstance(rec, InitRecord):
            self.collectives.comm_init(rec)
        elif isinstance(rec, OffCpuRecord):
            self.offcpu.record(rec)
        elif isinstance(rec, StackRecord):
            self._stack(rec)
        elif isinstance(rec, ExitRecord):
            proc = self.procs.get(rec.pid)
            if proc is not None:
                self._finish(proc)
                self._exited(proc, rec)

    def emit(self, proc: Proc | None, metric: str, ts: int, value: float | int,
             attrs: dict[str, AttrValue], tid: int = 0, chain: str | None = None) -> None:
        """Send one point (``ts`` monotonic) of a traced process (None: the agent's own), as every part of
        the tracker does: stamped with the process's resource, its causal chain id (``chain``, else the
        process's current step's), thread id and name, and its event id."""
        key = proc.key if proc else None
        if proc is not None and (proc.resource_stale or proc.key not in self.resources):
            self.resources[proc.key] = self._resource(proc)
            proc.resource_stale = False
        if chain is None and proc is not None:
            chain = proc.step_chain()
        if chain is not None:
            attrs[c.CAUSAL_CHAIN_ID] = chain
        if tid:
            attrs[c.TID] = tid
            if proc is not None:
                name = proc.threads.get(tid)
                if name is None:
                    name = proc.threads[tid] = self._thread_name(proc.info.pid, tid)
                if name:
                    attrs[c.THREAD_NAME] = name
        unix_ns = self.clock.to_unix(ts)
        chain_sent = attrs.get(c.CAUSAL_CHAIN_ID)
        if proc is not None and proc.info.start_ns:  # an id Echo recomputes from the typed row: not stored
            chain_str = chain_sent if isinstance(chain_sent, str) else None
            attrs[c.EVENT_ID] = c.event_id(self.node_id, proc.info.pid, proc.info.start_ns, metric, tid,
                                           unix_ns, chain_str)  # fmt: skip
        else:  # the agent's own points, or a process whose start time is unknown (its key: pid, start ticks)
            attrs[c.EVENT_ID] = short_hash(self.node_id, key, metric, tid, ts, chain_sent or "")
        self._sink(key, Point(metric, unix_ns, value, attrs))

    def ship_stack(self, proc: Proc, rec: StackRecord) -> str | None:
        """Name a captured stack and ship it the first time this agent sees it; its id (None: no symbols)."""
        if self.stacks is None:
            return None
        info = self.stacks.stack(rec, proc.info.start_ticks)
        if info is None:
            return None
        if info.new:
            attrs: dict[str, AttrValue] = {c.STACK_ID: info.id, c.STACK_FRAMES: "\n".join(info.frames),
                                           c.STACK_TRUNCATED: info.truncated}
            self.emit(proc, c.M_STACK, rec.ts, len(info.frames), attrs)
        return info.id

    def _stack(self, rec: StackRecord) -> None:
        """Ship a captured stack and hold its id for the record it precedes (or put a sample in its
        thread's window)."""
        if self.stacks is None:
            return
        sid = self.ship_stack(self.proc_of(rec.pid), rec)
        if sid is None:
            return
        if rec.source == STACK_SOURCE.SAMPLE:
            self.windows.sample(rec.pid, rec.tid, rec.ts, sid)
            return
        if len(self._stack_of) >= STACKS_HELD:
            self._stack_of.clear()
        self._stack_of[rec.tid] = (rec.ts, sid)

    def stack_for(self, tid: int, ts: int) -> str | None:
        """The id of the stack taken at ``ts`` by ``tid`` (its record came just before this one)."""
        held = self._stack_of.pop(tid, None)
        return held[1] if held is not None and held[0] == ts else None

    def _call(self, rec: CallRecord) -> None:
        """A returned NCCL or CUDA call: NCCL calls and syncs to :attr:`collectives`, the rest here."""
        proc = self.proc_of(rec.pid)
        fn = rec.fn
        if fn in COLLECTIVES or fn in P2P:
            self.collectives.collective(proc, rec)
        elif fn in SYNCS:
            self.collectives.sync(proc, rec)
        elif fn in (FN.GROUP_START, FN.GROUP_END):
            self.collectives.group(proc, rec.tid, fn == FN.GROUP_START)
        elif fn in (FN.COMM_DESTROY, FN.COMM_ABORT):
            self.collectives.destroy(proc, rec)
        elif fn in SIMPLE_CALLS:
            self._cuda_call(proc, rec)

    def _cuda_call(self, proc: Proc, rec: CallRecord) -> None:
        """cudaMalloc, cudaFree, cudaMemcpy(Async): an interval of the calling thread."""
        fn = rec.fn
        attrs: dict[str, AttrValue] = {c.CUDA_CALL: SYMBOLS[fn], c.ENTER_NS: self.clock.to_unix(rec.ts),
                                       c.RETURN_NS: self.clock.to_unix(rec.ts2)}
        if fn != FN.FREE:
            attrs[c.BYTES] = rec.a2
        if fn in (FN.MEMCPY, FN.MEMCPY_ASYNC):
            attrs[c.MEMCPY_KIND] = MEMCPY_KINDS[rec.a3] if rec.a3 < len(MEMCPY_KINDS) else str(rec.a3)
        if fn == FN.MEMCPY_ASYNC:
            attrs[c.STREAM] = rec.a1
        kind = "malloc" if fn == FN.MALLOC else "free" if fn == FN.FREE else "memcpy"
        self.interval(proc, kind, SIMPLE_CALLS[fn], rec.ts, rec.ts2, attrs, rec.tid)

    def interval(self, proc: Proc, kind: str, metric: str, start: int, end: int,
                 attrs: dict[str, AttrValue], tid: int) -> None:
        """A CUDA call's interval: into the thread's window ring; out as a raw point if it is evidence."""
        chain = proc.step_chain()
        stack = self.stack_for(tid, start)
        if stack is not None:
            attrs[c.STACK_ID] = stack

        def ship() -> None:
            self.emit(proc, metric, start, (end - start) / 1e6, attrs, tid, chain=chain)

        self.windows.call(proc.info.pid, tid, kind, start, end, ship, stack)

    # --- periodic -------------------------------------------------------------------------------
    def launch_counts(self, counts: Mapping[int, tuple[int, int]], now_ns: int, final: bool = False) -> None:
        """Cumulative cudaLaunchKernel counts per thread (tid -> (pid, count)) read from BPF: see
        :meth:`rankecho.agent.launches.Launches.read`."""
        self.launches.read(counts, now_ns, final)

    def sweep(self, now_ns: int) -> list[int]:
        """Send collectives no sync waited for within the timeout; return pids safe to forget in BPF."""
        for proc in self.procs.values():
            self.collectives.sweep(proc, now_ns)
        gone = list(self.exited)
        for key in self._retired:
            self.resources.pop(key, None)
            self.jobs.forget(key)
        self._retired = [p.key for p in self.exited.values()]
        self.exited.clear()
        return gone

    def _finish(self, proc: Proc) -> None:
        """A process gone (or replaced under its pid): its pending collectives go out, its state is
        forgotten, and it is kept as exited until its last launch counts are read."""
        self.collectives.flush(proc)
        self.windows.forget(proc.info.pid)
        if self.stacks is not None:
            self.stacks.forget(proc.info.pid)
        if self.procs.get(proc.info.pid) is proc:
            del self.procs[proc.info.pid]
        self.jobs.exited(proc.key, time.time_ns())
        self.exited[proc.info.pid] = proc

    def _exited(self, proc: Proc, rec: ExitRecord) -> None:
        """The exit of a rank (a process that used a communicator): Echo names the first rank to exit
        while the job still needed it (a crash), with its status when the kernel showed it."""
        if not proc.comms:
            return
        attrs: dict[str, AttrValue] = {}
        if rec.status is not None:
            attrs[c.EXIT_STATUS] = rec.status
        status = -1 if rec.status is None else rec.status
        self.emit(proc, c.M_PROCESS_EXIT, rec.ts, status, attrs, chain=proc.step_chain())

    def close(self) -> None:
        """The agent stops: every pending collective goes out without completion."""
        for proc in list(self.procs.values()):
            self.collectives.flush(proc)
