"""Kernel-launch counts of the traced threads: riding on collectives, or as points of their own.

cudaLaunchKernel is counted per thread inside the kernel (cumulative); every other record carries its
thread's counter and the agent reads all of them periodically. Kept apart from the tracker because the
rule of when launches go out (:data:`LAUNCH_QUIET_NS`) must count every launch exactly once whichever way
they leave.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rankecho.agent.events import FN, SYMBOLS
from rankecho.agent.procstate import Proc
from rankecho.shared import contract as c
from rankecho.shared.otlp import AttrValue

if TYPE_CHECKING:
    from rankecho.agent.tracker import Tracker

LAUNCH_QUIET_NS = 10_000_000_000
"""A thread's kernel launches go out as a point of their own only when no collective has carried them
for this long (a thread that calls no collective, a rank stuck in compute): every step's first collective
carries its thread's launches, and a point per thread per window was ~1 event per rank-step that no
analysis reads."""


class Launches:
    """Turns cumulative per-thread launch counters into launch windows (one per tracker)."""

    def __init__(self, tracker: Tracker, quiet_ns: int = LAUNCH_QUIET_NS) -> None:
        self._t = tracker
        self._quiet_ns = quiet_ns

    def count(self, proc: Proc, tid: int, n: int, ts: int, chain: str | None = None,
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
        self._t.emit(proc, c.M_KERNEL_LAUNCHES, ts, n - last_n, attrs, tid, chain=chain)

    def read(self, counts: Mapping[int, tuple[int, int]], now_ns: int, final: bool = False) -> None:
        """Cumulative cudaLaunchKernel counts per thread (tid -> (pid, count)) read from BPF. A thread's
        launches ride on its step's first collective; they become a point of their own when nothing
        carried them for ``quiet_ns``, when the process exited, or at the agent's stop (``final``): no
        launch is lost, none is counted twice (counts are cumulative)."""
        t = self._t
        for tid, (pid, n) in counts.items():
            live = t.procs.get(pid)
            proc = live or t.exited.get(pid)
            if proc is None:
                proc = live = t.proc_of(pid)
            if tid not in proc.launches:
                proc.launches[tid] = (0, now_ns)  # a thread first seen: its quiet time starts now
            last_n, last_ts = proc.launches[tid]
            if n < last_n:
                proc.launches[tid] = (0, last_ts)  # the map entry was recycled
            elif live is not None and not final and now_ns - last_ts < self._quiet_ns:
                continue  # the next collective of this thread carries them
            self.count(proc, tid, n, now_ns)
