"""The NCCL path of the tracker: communicators, collective calls, the syncs that complete them, steps.

Kept apart from :class:`rankecho.agent.tracker.Tracker` (which dispatches records and owns processes and
point emission) because this is where comm ids, sequence numbers and causal chain ids are decided: the
part whose silent bugs break the cross-rank joins, tested and mutated on its own (``chain`` target of
``scripts/mutation.py``). One :class:`Collectives` per tracker, holding a reference to it for what the
two share (points out, the clock, thread windows, stacks, the journal, kernel-launch counts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rankecho.agent.events import FN, P2P, SYMBOLS, CallRecord, InitRecord, unpack_collective
from rankecho.agent.identity import ProcessInfo, short_hash, split_child_id, unaligned_comm_id, unique_id_hash
from rankecho.agent.procstate import Comm, Pending, Proc
from rankecho.agent.window import DEFAULT_WINDOW_NS
from rankecho.shared import contract as c
from rankecho.shared.otlp import AttrValue

if TYPE_CHECKING:
    from rankecho.agent.tracker import Tracker

DATATYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
             "bfloat16", "float8e4m3", "float8e5m2")
DATATYPE_BYTES = (1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1)
REDUCE_OPS = ("sum", "prod", "max", "min", "avg")
PENDING_TIMEOUT_NS = 10_000_000_000
"""A collective no sync has waited for after this long is sent without a completion time."""
HEALTH_MOVE = 0.2
"""A health score this far from the last one sent goes out at once, whatever ``health_every`` says."""


class Collectives:
    """Communicator creation and use, completion by syncs and step scoring, for every traced process."""

    def __init__(self, tracker: Tracker, throttled: Callable[[ProcessInfo], bool], pending_timeout_ns: int,
                 health_every: int) -> None:
        """``throttled``: whether the process's GPU is throttled now (a health factor);
        ``pending_timeout_ns``: see :data:`PENDING_TIMEOUT_NS`; ``health_every``: send every Nth step's
        health score (and any that moved by :data:`HEALTH_MOVE`)."""
        self._t = tracker
        self._throttled = throttled
        self._pending_timeout = pending_timeout_ns
        self._health_every = max(1, health_every)

    # --- communicators --------------------------------------------------------------------------
    def _comm(self, proc: Proc, handle: int) -> Comm:
        comm = proc.comms.get(handle)
        if comm is None:
            # Created before the agent attached: sequence counted from now; id, rank and size from the
            # journal when an earlier agent saw the creation (a restart), else guessed from the environment.
            journal = self._t.journal
            known = journal.lookup(proc.key, handle) if journal is not None else None
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

    def comm_init(self, rec: InitRecord) -> None:
        """A communicator created (init rank, init all, split): registered, journaled, one point each."""
        call = rec.call
        proc = self._t.proc_of(call.pid)
        comms: list[tuple[int, Comm]] = []
        parent_id: str | None = None
        if call.fn in (FN.COMM_INIT_RANK, FN.COMM_INIT_RANK_CONFIG):
            comms.append((call.a3, Comm(unique_id_hash(rec.payload), call.a2, call.a1, aligned=True)))
        elif call.fn == FN.COMM_INIT_ALL:
            # One process drives every device: the handles form one communicator, rank = array index.
            ndev = min(call.a1, 16)
            group_id = short_hash("init-all", self._t.node_id, proc.key)
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
        to_unix = self._t.clock.to_unix
        for handle, comm in comms:
            attrs: dict[str, AttrValue] = {
                c.COMM_ID: comm.comm_id, c.CUDA_CALL: SYMBOLS[call.fn],
                c.ENTER_NS: to_unix(call.ts), c.RETURN_NS: to_unix(call.ts2),
            }
            if comm.rank is not None:
                attrs[c.COMM_RANK] = comm.rank
            if comm.nranks is not None:
                attrs[c.COMM_NRANKS] = comm.nranks
            if comm.parent_id:
                attrs[c.PARENT_COMM_ID] = comm.parent_id
            self._t.emit(proc, c.M_COMM_INIT, call.ts, (call.ts2 - call.ts) / 1e6, attrs, call.tid,
                         chain=c.causal_chain_id(comm.comm_id, 0) if handle else None)

    def _journal(self, proc: Proc, handle: int, comm: Comm) -> None:
        """Write down a communicator whose id is exact (seen created, or restored from the journal)."""
        journal = self._t.journal
        if journal is not None and (comm.aligned or comm.id_restored):
            primary = proc.primary is comm
            journal.record(proc.key, handle, comm.comm_id, comm.rank, comm.nranks, primary, comm.splits,
                           comm.parent_id)  # fmt: skip

    def group(self, proc: Proc, tid: int, start: bool) -> None:
        """ncclGroupStart/End: collectives inside a group are marked (they complete together)."""
        depth = proc.group_depth.get(tid, 0)
        proc.group_depth[tid] = depth + 1 if start else max(0, depth - 1)

    def destroy(self, proc: Proc, rec: CallRecord) -> None:
        """ncclCommDestroy/Abort: the communicator is forgotten; the point says how far its seq got."""
        comm = proc.comms.pop(rec.a0, None)
        attrs: dict[str, AttrValue] = {c.CUDA_CALL: SYMBOLS[rec.fn]}
        if comm is not None:
            attrs[c.COMM_ID] = comm.comm_id
            attrs[c.SEQ] = comm.seq
        self._t.emit(proc, c.M_COMM_DESTROY, rec.ts, (rec.ts2 - rec.ts) / 1e6, attrs, rec.tid)

    # --- calls ----------------------------------------------------------------------------------
    def collective(self, proc: Proc, rec: CallRecord) -> None:
        """A collective or point-to-point call returned: its attributes and chain id are fixed now, its
        point waits (pending) for the sync that completes it."""
        comm = self._comm(proc, rec.a0)
        dtype, op, peer = unpack_collective(rec.a3)
        to_unix = self._t.clock.to_unix
        attrs: dict[str, AttrValue] = {
            c.OP: SYMBOLS[rec.fn], c.COMM_ID: comm.comm_id, c.SEQ_ALIGNED: comm.aligned, c.COUNT: rec.a2,
            c.DATATYPE: DATATYPES[dtype] if dtype < len(DATATYPES) else str(dtype), c.STREAM: rec.a1,
            c.ENTER_NS: to_unix(rec.ts), c.RETURN_NS: to_unix(rec.ts2),
        }
        stack = self._t.stack_for(rec.tid, rec.ts)
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
                self._t.launches.count(proc, rec.tid, rec.launches, rec.ts, chain, ride=attrs)
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
        return self._t.windows.close(proc.info.pid, rec.tid, start, rec.ts, from_completion).attributes()

    def sync(self, proc: Proc, rec: CallRecord) -> None:
        """A CUDA sync returned: its own interval, then the pending collectives it waited for go out
        completed (and, when the primary comm's were among them, the step is done)."""
        stream = rec.a1
        to_unix = self._t.clock.to_unix
        attrs: dict[str, AttrValue] = {c.CUDA_CALL: SYMBOLS[rec.fn], c.ENTER_NS: to_unix(rec.ts),
                                       c.RETURN_NS: to_unix(rec.ts2)}
        if rec.fn == FN.STREAM_SYNC:
            attrs[c.STREAM] = stream
        self._t.interval(proc, "sync", c.M_CUDA_SYNC, rec.ts, rec.ts2, attrs, rec.tid)
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
            attrs[c.COMPLETE_NS] = self._t.clock.to_unix(complete_ns)
            end = complete_ns
            if p.comm is not None and rec.ts2 == p.comm.last_return_ns:  # the comm's latest call
                p.comm.last_complete_ns = complete_ns
        self._t.emit(proc, c.M_COLLECTIVE, rec.ts, (end - rec.ts) / 1e6, attrs, rec.tid, chain=p.chain)

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
                self._t.emit(proc, c.M_HEALTH, complete_ns, s.score, attrs, chain=first.chain)
                proc.health_sent = s.score
        proc.last_completion_ns = complete_ns
        proc.preempted_ns = 0
        proc.step_seq = int(last.attrs[c.SEQ]) + 1

    # --- without a sync -------------------------------------------------------------------------
    def sweep(self, proc: Proc, now_ns: int) -> None:
        """Send the process's collectives no sync waited for within the timeout, without completion."""
        stale = [p for p in proc.pending if now_ns - p.rec.ts2 > self._pending_timeout]
        if stale:
            proc.pending = [p for p in proc.pending if p not in stale]
            for p in stale:
                self._complete(proc, p, None)

    def flush(self, proc: Proc) -> None:
        """Send every pending collective of the process without completion (it exited, the agent stops)."""
        for p in proc.pending:
            self._complete(proc, p, None)
        proc.pending.clear()
