"""Turns decoded BPF records into contract points: identity, sequence numbers, completion, steps.

Pure apart from two injected readers (process identity and thread names), so tests drive it with
synthetic records. One :class:`Tracker` per agent; points go to ``sink(process_key, point)`` where
``process_key`` is ``(pid, start_ticks)`` (``None`` for node-level points).

Usage::

    tracker = Tracker(node_id="n1", clock=ClockConverter(), read_proc=lambda pid: read_process("/proc", pid),
                      sink=lambda key, point: batch.append((key, point)))
    tracker.handle(decode(raw))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from rankecho.agent.clock import ClockConverter
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
    unpack_collective,
)
from rankecho.agent.identity import (
    ProcessInfo,
    short_hash,
    split_child_id,
    unaligned_comm_id,
    unique_id_hash,
)
from rankecho.agent.jobid import JobIds
from rankecho.agent.journal import CommJournal
from rankecho.agent.procstate import Comm, Pending, Proc, ProcKey
from rankecho.agent.stacks import StackKeeper
from rankecho.agent.window import DEFAULT_WINDOW_NS, WindowKeeper
from rankecho.shared import contract as c
from rankecho.shared.otlp import AttrValue, Point

Sink = Callable[[ProcKey | None, Point], None]

DATATYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
             "bfloat16", "float8e4m3", "float8e5m2")
DATATYPE_BYTES = (1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1)
REDUCE_OPS = ("sum", "prod", "max", "min", "avg")
MEMCPY_KINDS = ("host_to_host", "host_to_device", "device_to_host", "device_to_device", "default")
PENDING_TIMEOUT_NS = 10_000_000_000
LAUNCH_QUIET_NS = 10_000_000_000
"""A thread's kernel launches go out as a point of their own only when no collective has carried them
for this long (a thread that calls no collective, a rank stuck in compute): every step's first collective
carries its thread's launches, and a point per thread per window was ~1 event per rank-step that no
analysis reads."""
HEALTH_MOVE = 0.2
"""A health score this far from the last one sent goes out at once, whatever ``health_every`` says."""
"""A collective no sync has waited for after this long is sent without a completion time."""
SIMPLE_CALLS: dict[FN, str] = {
    FN.MALLOC: c.M_CUDA_MALLOC,
    FN.FREE: c.M_CUDA_FREE,
    FN.MEMCPY: c.M_CUDA_MEMCPY,
    FN.MEMCPY_ASYNC: c.M_CUDA_MEMCPY,
}


class Tracker:
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
        self._health_every = max(1, health_every)
        self._launch_quiet_ns = launch_quiet_ns
        self.journal = journal
        """Communicators seen created, on disk: a restarted agent names them as its predecessor did."""
        self.clock = clock
        self._read_proc = read_proc
        self._thread_name = thread_name
        self._thread_group = thread_group
        self._groups: dict[int, int | None] = {}
        """tid -> tgid of threads that preempted a traced thread (bounded; see _preemptor)."""
        self._throttled = throttled
        self._gpu_resource = gpu_resource
        self._sink = sink
        self._pending_timeout = pending_timeout_ns
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

    def _proc(self, pid: int) -> Proc:
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
        if isinstance(rec, CallRecord):
            self._call(rec)
        elif isinstance(rec, InitRecord):
            self._init(rec)
        elif isinstance(rec, OffCpuRecord):
            self._offcpu(rec)
        elif isinstance(rec, StackRecord):
            self._stack(rec)
        elif isinstance(rec, ExitRecord):
            proc = self.procs.get(rec.pid)
            if proc is not None:
                self._finish(proc)
                self._exited(proc, rec)

    def _emit(self, proc: Proc | None, metric: str, ts: int, value: float | int,
              attrs: dict[str, AttrValue], tid: int = 0, chain: str | None = None) -> None:
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

    def emit(self, proc: Proc, metric: str, ts: int, value: float | int, attrs: dict[str, AttrValue],
             tid: int = 0) -> None:
        """Send one point of a traced process (``ts`` monotonic), as the record handlers do."""
        self._emit(proc, metric, ts, value, attrs, tid)

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
            self._emit(proc, c.M_STACK, rec.ts, len(info.frames), attrs)
        return info.id

    def _stack(self, rec: StackRecord) -> None:
        """Ship a captured stack and hold its id for the record it precedes (or put a sample in its
        thread's window)."""
        if self.stacks is None:
            return
        sid = self.ship_stack(self._proc(rec.pid), rec)
        if sid is None:
            return
        if rec.source == STACK_SOURCE.SAMPLE:
            self.windows.sample(rec.pid, rec.tid, rec.ts, sid)
            return
        if len(self._stack_of) >= 4096:
            self._stack_of.clear()
        self._stack_of[rec.tid] = (rec.ts, sid)

    def _stack_for(self, tid: int, ts: int) -> str | None:
        """The id of the stack taken at ``ts`` by ``tid`` (its record came just before this one)."""
        held = self._stack_of.pop(tid, None)
        return held[1] if held is not None and held[0] == ts else None

    def _comm(self, proc: Proc, handle: int) -> Comm:
        comm = proc.comms.get(handle)
        if comm is None:
            # Created before the agent attached: sequence counted from now; id, rank and size from the
            # journal when an earlier agent saw the creation (a restart), else guessed from the environment.
            known = self.journal.lookup(proc.key, handle) if self.journal is not None else None
            env = proc.info.env
            guess = unaligned_comm_id(env.job_key, env.world_size, proc.unknown_comms)
            proc.unknown_comms += 1
            if known is not None:
                # The id is exact, the seq is not: chain ids keep the guessed id, so raw joins on
                # causal_chain_id never pair this rank's calls with other instances (the analysis
                # realigns by comm id and timing instead).
                comm = Comm(known.comm_id, known.rank, known.nranks, aligned=False, parent_id=known.parent_id,
                            splits=known.splits, id_restored=True, chain_comm=guess)  # fmt: skip
            else:
                comm = Comm(guess, env.rank, env.world_size, aligned=False)
            proc.comms[handle] = comm
            if proc.primary is None or (known is not None and known.primary):
                proc.primary = comm
                if known is not None:
                    proc.rank, proc.nranks = comm.rank, comm.nranks
                    proc.resource_stale = True
        return comm

    def _init(self, rec: InitRecord) -> None:
        call = rec.call
        proc = self._proc(call.pid)
        comms: list[tuple[int, Comm]] = []
        parent_id: str | None = None
        if call.fn in (FN.COMM_INIT_RANK, FN.COMM_INIT_RANK_CONFIG):
            comms.append((call.a3, Comm(unique_id_hash(rec.payload), call.a2, call.a1, aligned=True)))
        elif call.fn == FN.COMM_INIT_ALL:
            # One process drives every device: the handles form one communicator, rank = array index.
            ndev = min(call.a1, 16)
            group_id = short_hash("init-all", self.node_id, proc.key)
            for i in range(ndev):
                handle = int.from_bytes(rec.payload[8 * i : 8 * i + 8], "little")
                comms.append((handle, Comm(group_id, i, ndev, aligned=True)))
        elif call.fn == FN.COMM_SPLIT:
            parent = self._comm(proc, call.a0)
            parent_id = parent.comm_id
            color = call.a1 - (1 << 32) if call.a1 >= 1 << 31 else call.a1
            child_id = split_child_id(parent.comm_id, parent.splits, color)
            parent.splits += 1
            self._journal(proc, call.a0, parent)
            if call.a3 and color >= 0:
                # Seen created, so counted from 0: aligned when the parent's id is exact.
                exact = parent.aligned or parent.id_restored
                comms.append((call.a3, Comm(child_id, None, None, exact, parent_id=parent_id)))
        for handle, comm in comms:
            if not handle or call.rc != 0:
                continue
            proc.comms[handle] = comm
            if call.fn in (FN.COMM_INIT_RANK, FN.COMM_INIT_RANK_CONFIG, FN.COMM_INIT_ALL) and (
                proc.primary is None or not proc.primary.aligned
            ):
                proc.primary = comm
                proc.rank, proc.nranks = comm.rank, comm.nranks
                proc.resource_stale = True
                proc.step_seq = 0
            self._journal(proc, handle, comm)
        for handle, comm in comms:
            attrs: dict[str, AttrValue] = {
                c.COMM_ID: comm.comm_id, c.CUDA_CALL: SYMBOLS[call.fn],
                c.ENTER_NS: self.clock.to_unix(call.ts), c.RETURN_NS: self.clock.to_unix(call.ts2),
            }
            if comm.rank is not None:
                attrs[c.COMM_RANK] = comm.rank
            if comm.nranks is not None:
                attrs[c.COMM_NRANKS] = comm.nranks
            if comm.parent_id:
                attrs[c.PARENT_COMM_ID] = comm.parent_id
            self._emit(proc, c.M_COMM_INIT, call.ts, (call.ts2 - call.ts) / 1e6, attrs, call.tid,
                       chain=c.causal_chain_id(comm.comm_id, 0) if handle else None)

    def _journal(self, proc: Proc, handle: int, comm: Comm) -> None:
        """Write down a communicator whose id is exact (seen created, or restored from the journal)."""
        if self.journal is not None and (comm.aligned or comm.id_restored):
            primary = proc.primary is comm
            self.journal.record(proc.key, handle, comm.comm_id, comm.rank, comm.nranks, primary,
                                comm.splits, comm.parent_id)  # fmt: skip

    def _call(self, rec: CallRecord) -> None:
        proc = self._proc(rec.pid)
        fn = rec.fn
        if fn in COLLECTIVES or fn in P2P:
            self._collective(proc, rec)
        elif fn in SYNCS:
            self._sync(proc, rec)
        elif fn == FN.GROUP_START:
            proc.group_depth[rec.tid] = proc.group_depth.get(rec.tid, 0) + 1
        elif fn == FN.GROUP_END:
            proc.group_depth[rec.tid] = max(0, proc.group_depth.get(rec.tid, 0) - 1)
        elif fn in (FN.COMM_DESTROY, FN.COMM_ABORT):
            comm = proc.comms.pop(rec.a0, None)
            attrs: dict[str, AttrValue] = {c.CUDA_CALL: SYMBOLS[fn]}
            if comm is not None:
                attrs[c.COMM_ID] = comm.comm_id
                attrs[c.SEQ] = comm.seq
            self._emit(proc, c.M_COMM_DESTROY, rec.ts, (rec.ts2 - rec.ts) / 1e6, attrs, rec.tid)
        elif fn in SIMPLE_CALLS:
            attrs = {c.CUDA_CALL: SYMBOLS[fn], c.ENTER_NS: self.clock.to_unix(rec.ts),
                     c.RETURN_NS: self.clock.to_unix(rec.ts2)}
            if fn != FN.FREE:
                attrs[c.BYTES] = rec.a2
            if fn in (FN.MEMCPY, FN.MEMCPY_ASYNC):
                attrs[c.MEMCPY_KIND] = MEMCPY_KINDS[rec.a3] if rec.a3 < len(MEMCPY_KINDS) else str(rec.a3)
            if fn == FN.MEMCPY_ASYNC:
                attrs[c.STREAM] = rec.a1
            kind = "malloc" if fn == FN.MALLOC else "free" if fn == FN.FREE else "memcpy"
            self._interval(proc, kind, SIMPLE_CALLS[fn], rec.ts, rec.ts2, attrs, rec.tid)

    def _interval(self, proc: Proc, kind: str, metric: str, start: int, end: int,
                  attrs: dict[str, AttrValue], tid: int) -> None:
        """A CUDA call's interval: into the thread's window ring; out as a raw point if it is evidence."""
        chain = proc.step_chain()
        stack = self._stack_for(tid, start)
        if stack is not None:
            attrs[c.STACK_ID] = stack

        def ship() -> None:
            self._emit(proc, metric, start, (end - start) / 1e6, attrs, tid, chain=chain)

        self.windows.call(proc.info.pid, tid, kind, start, end, ship, stack)

    def _collective(self, proc: Proc, rec: CallRecord) -> None:
        comm = self._comm(proc, rec.a0)
        dtype, op, peer = unpack_collective(rec.a3)
        attrs: dict[str, AttrValue] = {
            c.OP: SYMBOLS[rec.fn], c.COMM_ID: comm.comm_id, c.SEQ_ALIGNED: comm.aligned, c.COUNT: rec.a2,
            c.DATATYPE: DATATYPES[dtype] if dtype < len(DATATYPES) else str(dtype), c.STREAM: rec.a1,
            c.ENTER_NS: self.clock.to_unix(rec.ts), c.RETURN_NS: self.clock.to_unix(rec.ts2),
        }
        stack = self._stack_for(rec.tid, rec.ts)
        if stack is not None:
            attrs[c.STACK_ID] = stack
        attrs.update(self._pre_window(proc, comm, rec))
        if dtype < len(DATATYPE_BYTES):
            attrs[c.BYTES] = rec.a2 * DATATYPE_BYTES[dtype]
        if comm.rank is not None:
            attrs[c.COMM_RANK] = comm.rank
        if comm.nranks is not None:
            attrs[c.COMM_NRANKS] = comm.nranks
        if proc.group_depth.get(rec.tid, 0) > 0:
            attrs[c.IN_GROUP] = True
        if rec.fn in P2P:
            # Each ordered (sender, receiver) pair has its own sequence, equal on both ends.
            me = comm.rank if comm.rank is not None else -1
            pair = (me, peer) if rec.fn == FN.SEND else (peer, me)
            n = comm.p2p.get(pair, 0)
            comm.p2p[pair] = n + 1
            attrs[c.PEER] = peer
            attrs[c.SEQ] = n
            chain = c.causal_chain_id(f"{comm.chain_base}.{pair[0]}>{pair[1]}", n)
            primary = False
        else:
            if rec.fn in (FN.BROADCAST, FN.BCAST, FN.REDUCE):
                attrs[c.PEER] = peer
            if rec.fn in (FN.ALL_REDUCE, FN.REDUCE_SCATTER, FN.REDUCE) and op < len(REDUCE_OPS):
                attrs[c.REDUCE_OP] = REDUCE_OPS[op]
            attrs[c.SEQ] = comm.seq
            chain = c.causal_chain_id(comm.chain_base, comm.seq)
            primary = comm is proc.primary
            if primary and comm.seq == proc.step_seq:
                self._launches(proc, rec.tid, rec.launches, rec.ts, chain, ride=attrs)
            comm.seq += 1
        proc.pending.append(Pending(rec, chain, attrs, primary, comm))
        proc.caller_tid, proc.last_enter_ns = rec.tid, rec.ts

    def _pre_window(self, proc: Proc, comm: Comm, rec: CallRecord) -> dict[str, float | int | str]:
        """The call's pre-call window broken down by cause class, as Echo's analysis would from raw
        intervals: from the previous call on this communicator (its completion when a sync had waited
        for it before this call, else its return) to this call's enter."""
        done = comm.last_complete_ns
        from_completion = done is not None and done <= rec.ts
        if from_completion:
            assert done is not None
            start = done
        elif comm.last_return_ns is not None:
            start = comm.last_return_ns
        else:
            start = rec.ts - DEFAULT_WINDOW_NS
        comm.last_return_ns, comm.last_complete_ns = rec.ts2, None
        return self.windows.close(proc.info.pid, rec.tid, start, rec.ts, from_completion).attributes()

    def _sync(self, proc: Proc, rec: CallRecord) -> None:
        stream = rec.a1
        attrs: dict[str, AttrValue] = {c.CUDA_CALL: SYMBOLS[rec.fn], c.ENTER_NS: self.clock.to_unix(rec.ts),
                                       c.RETURN_NS: self.clock.to_unix(rec.ts2)}
        if rec.fn == FN.STREAM_SYNC:
            attrs[c.STREAM] = stream
        self._interval(proc, "sync", c.M_CUDA_SYNC, rec.ts, rec.ts2, attrs, rec.tid)
        # A stream sync waits for that stream (stream 0, the legacy default stream, for all blocking
        # streams); device and event syncs are taken to wait for everything the process enqueued.
        done = [p for p in proc.pending
                if p.rec.ts2 <= rec.ts2 and (rec.fn != FN.STREAM_SYNC or stream == 0 or p.rec.a1 == stream)]
        if done:
            proc.pending = [p for p in proc.pending if p not in done]
            for p in done:
                self._complete(proc, p, rec.ts2)
            primary = [p for p in done if p.primary]
            if primary:
                self._step_done(proc, primary[0], primary[-1], rec.ts2)

    def _complete(self, proc: Proc, p: Pending, complete_ns: int | None) -> None:
        rec = p.rec
        attrs = dict(p.attrs)
        end = rec.ts2
        if complete_ns is not None:
            attrs[c.COMPLETE_NS] = self.clock.to_unix(complete_ns)
            end = complete_ns
            if p.comm is not None and rec.ts2 == p.comm.last_return_ns:  # the comm's latest call
                p.comm.last_complete_ns = complete_ns
        self._emit(proc, c.M_COLLECTIVE, rec.ts, (end - rec.ts) / 1e6, attrs, rec.tid, chain=p.chain)

    def _step_done(self, proc: Proc, first: Pending, last: Pending, complete_ns: int) -> None:
        """A sync completed the step's collectives on the primary comm (one or several buckets):
        score the step by its first collective, then start the next step."""
        if proc.last_completion_ns is not None:
            compute = max(0, first.rec.ts - proc.last_completion_ns)
            s = proc.health.step(compute, proc.preempted_ns, self._throttled(proc.info))
            proc.health_steps += 1
            moved = proc.health_sent is None or abs(s.score - proc.health_sent) >= HEALTH_MOVE
            if moved or proc.health_steps % self._health_every == 0:
                attrs: dict[str, AttrValue] = {c.HEALTH_COMPUTE_MS: s.compute_ns / 1e6,
                                               c.HEALTH_BASELINE_MS: s.baseline_ns / 1e6}
                self._emit(proc, c.M_HEALTH, complete_ns, s.score, attrs, chain=first.chain)
                proc.health_sent = s.score
        proc.last_completion_ns = complete_ns
        proc.preempted_ns = 0
        proc.step_seq = int(last.attrs[c.SEQ]) + 1

    def _offcpu(self, rec: OffCpuRecord) -> None:
        proc = self._proc(rec.pid)
        attrs: dict[str, AttrValue] = {c.OFFCPU_STATE: "sleeping" if rec.sleeping else "preempted",
                                       c.CALL_IN_FLIGHT: SYMBOLS.get(rec.call, "")}
        if rec.ts_wake:
            attrs[c.RUNQ_MS] = max(0, rec.ts_in - rec.ts_wake) / 1e6
        if not rec.sleeping:
            proc.preempted_ns += rec.ts_in - rec.ts_out
        by: str | None = None
        if rec.preempted_by:  # preempted: who took the CPU; woken: who it waited behind in the run queue
            by = attrs[c.PREEMPTED_BY] = self._preemptor(rec.preempted_by)
        chain = proc.step_chain()
        stack = self._stack_for(rec.tid, rec.ts_out)
        if stack is not None:
            attrs[c.STACK_ID] = stack

        def ship() -> None:
            ms = (rec.ts_in - rec.ts_out) / 1e6
            self._emit(proc, c.M_OFFCPU, rec.ts_out, ms, attrs, rec.tid, chain=chain)

        runq = rec.ts_in - rec.ts_wake if rec.ts_wake else 0
        self.windows.offcpu(proc.info.pid, rec.tid, rec.ts_out, rec.ts_in, rec.sleeping, by,
                            str(attrs[c.CALL_IN_FLIGHT]), runq, ship, stack)

    def _preemptor(self, tid: int) -> str:
        """'job' when the thread that took the CPU belongs to a traced process that uses a communicator
        (a rank: the node's ranks compete for its CPUs), else 'other' (another workload, a helper
        process that merely maps the CUDA libraries, a daemon, the kernel)."""
        if tid not in self._groups:
            if len(self._groups) >= 4096:
                self._groups.clear()
            self._groups[tid] = self._thread_group(tid)
        tgid = self._groups[tid]
        proc = self.procs.get(tgid) if tgid is not None else None
        return "job" if proc is not None and proc.comms else "other"

    # --- periodic -------------------------------------------------------------------------------
    def _launches(self, proc: Proc, tid: int, n: int, ts: int, chain: str | None = None,
                  ride: dict[str, AttrValue] | None = None) -> None:
        """Launches of ``tid`` since its previous window, ending at ``ts`` (counts are cumulative); into
        ``ride`` (a step's first collective's attributes) instead of a point of their own when given."""
        last_n, last_ts = proc.launches.get(tid, (0, 0))
        if n <= last_n:
            return  # nothing new, or a snapshot older than the last window read
        proc.launches[tid] = (n, ts)
        if ride is not None:
            ride[c.LAUNCHES] = n - last_n
            return
        attrs: dict[str, AttrValue] = {c.CUDA_CALL: SYMBOLS[FN.LAUNCH_KERNEL]}
        if last_ts:
            attrs[c.WINDOW_NS] = ts - last_ts
        self._emit(proc, c.M_KERNEL_LAUNCHES, ts, n - last_n, attrs, tid, chain=chain)

    def launch_counts(self, counts: Mapping[int, tuple[int, int]], now_ns: int, final: bool = False) -> None:
        """Cumulative cudaLaunchKernel counts per thread (tid -> (pid, count)) read from BPF. A thread's
        launches ride on its step's first collective; they become a point of their own when nothing
        carried them for ``launch_quiet_ns``, when the process exited, or at the agent's stop
        (``final``): no launch is lost, none is counted twice (counts are cumulative)."""
        for tid, (pid, n) in counts.items():
            live = self.procs.get(pid)
            proc = live or self.exited.get(pid)
            if proc is None:
                proc = live = self._proc(pid)
            if tid not in proc.launches:
                proc.launches[tid] = (0, now_ns)  # a thread first seen: its quiet time starts now
            last_n, last_ts = proc.launches[tid]
            if n < last_n:
                proc.launches[tid] = (0, last_ts)  # the map entry was recycled
            elif live is not None and not final and now_ns - last_ts < self._launch_quiet_ns:
                continue  # the next collective of this thread carries them
            self._launches(proc, tid, n, now_ns)

    def sweep(self, now_ns: int) -> list[int]:
        """Send collectives no sync waited for within the timeout; return pids safe to forget in BPF."""
        for proc in self.procs.values():
            stale = [p for p in proc.pending if now_ns - p.rec.ts2 > self._pending_timeout]
            if stale:
                proc.pending = [p for p in proc.pending if p not in stale]
                for p in stale:
                    self._complete(proc, p, None)
        gone = list(self.exited)
        for key in self._retired:
            self.resources.pop(key, None)
            self.jobs.forget(key)
        self._retired = [p.key for p in self.exited.values()]
        self.exited.clear()
        return gone

    def _finish(self, proc: Proc) -> None:
        for p in proc.pending:
            self._complete(proc, p, None)
        proc.pending.clear()
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
        self._emit(proc, c.M_PROCESS_EXIT, rec.ts, status, attrs, chain=proc.step_chain())

    def close(self) -> None:
        for proc in list(self.procs.values()):
            for p in proc.pending:
                self._complete(proc, p, None)
            proc.pending.clear()
