"""Off-CPU intervals of traced threads: why each was off (asleep, preempted, and by whom), into the
thread's window ring and out as a raw point when it is evidence.

Kept apart from the tracker because naming the preemptor needs its own bounded cache of thread groups
(a scheduler record names a thread, the question is whether its process is one of the job's ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rankecho.agent.events import SYMBOLS, OffCpuRecord
from rankecho.shared import contract as c
from rankecho.shared.otlp import AttrValue

if TYPE_CHECKING:
    from rankecho.agent.tracker import Tracker

GROUPS_KEPT = 4096
"""Thread -> thread group entries kept for preemptors before the cache starts over."""


class OffCpu:
    """Off-CPU records of one tracker's processes."""

    def __init__(self, tracker: Tracker, thread_group: Callable[[int], int | None]) -> None:
        """``thread_group``: the tgid of a thread (None: gone, or unreadable)."""
        self._t = tracker
        self._thread_group = thread_group
        self._groups: dict[int, int | None] = {}
        """tid -> tgid of threads that preempted a traced thread (bounded; see _preemptor)."""

    def record(self, rec: OffCpuRecord) -> None:
        t = self._t
        proc = t.proc_of(rec.pid)
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
        stack = t.stack_for(rec.tid, rec.ts_out)
        if stack is not None:
            attrs[c.STACK_ID] = stack

        def ship() -> None:
            ms = (rec.ts_in - rec.ts_out) / 1e6
            t.emit(proc, c.M_OFFCPU, rec.ts_out, ms, attrs, rec.tid, chain=chain)

        runq = rec.ts_in - rec.ts_wake if rec.ts_wake else 0
        t.windows.offcpu(proc.info.pid, rec.tid, rec.ts_out, rec.ts_in, rec.sleeping, by,
                         str(attrs[c.CALL_IN_FLIGHT]), runq, ship, stack)

    def _preemptor(self, tid: int) -> str:
        """'job' when the thread that took the CPU belongs to a traced process that uses a communicator
        (a rank: the node's ranks compete for its CPUs), else 'other' (another workload, a helper
        process that merely maps the CUDA libraries, a daemon, the kernel)."""
        if tid not in self._groups:
            if len(self._groups) >= GROUPS_KEPT:
                self._groups.clear()
            self._groups[tid] = self._thread_group(tid)
        tgid = self._groups[tid]
        proc = self._t.procs.get(tgid) if tgid is not None else None
        return "job" if proc is not None and proc.comms else "other"
