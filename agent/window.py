"""A rank's pre-call window, summarised at the source: what the thread did before each collective.

Echo explains a late rank by what its calling thread did between its previous call and the late one,
broken down by cause class, against its peers (echo/queries/layers/40_episodes.sql). Shipping every
interval that breakdown is computed from (each off-CPU stretch, sync, copy and allocation: ~18 points
per rank-step on the seed scenario) costs the job's network, Echo's CPU and the store's disk. So the
agent keeps each thread's recent intervals in a bounded ring and puts the breakdown on the collective
point itself (``rankecho.pre.*``, docs/contract.md). Raw intervals still go out where they are
evidence a person or the timeline wants to see: one far longer than the thread's usual
(:meth:`ThreadWindow.is_outlier`), and every interval of a window far longer than the thread's usual
window (a late rank's stall).

Intervals carry the id of the stack they were taken with (a long CUDA call's entry stack, an off-CPU
interval's switch-out stack); the breakdown names, per class, the stack that carried most of that
class's time (``rankecho.pre.<class>_stack``), and the stack the on-CPU sampler saw most in the window
(``rankecho.pre.oncpu_stack``: what the host-compute share was running).

The classes follow the same rules as Echo's staging of raw intervals
(echo/queries/staging/staging.sql, ``stage_host_activity``), so a window summarised here and the same
window computed by Echo from raw intervals agree (tests/test_agent_window.py checks both on one set).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rankecho.shared import contract as c

IN_CALL: frozenset[str] = frozenset({
    "cudaMalloc", "cudaFree", "cudaMemcpy",
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
})  # fmt: skip
"""CUDA calls whose own interval already counts the off-CPU time inside them."""
SYNC_CALLS: frozenset[str] = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
})  # fmt: skip
DEFAULT_WINDOW_NS = 500_000_000
"""The window of a call with no earlier call on its communicator (as Echo's analysis uses)."""
RING_INTERVALS = 2048
"""Intervals kept per thread (a window longer than these reaches back only as far as they do)."""
RING_SPAN_NS = 30_000_000_000
"""Intervals that ended longer ago than this before the newest are dropped from the ring."""
HISTORY = 64
"""Recent window lengths and interval lengths per kind a thread's "usual" is the median of."""
OUTLIER_FACTOR = 2.0
"""An interval or window this many times the thread's usual (and at least the raw threshold) is evidence."""
MIN_HISTORY = 8
"""Below this many earlier samples nothing is usual yet: every interval above the threshold is evidence."""
SAMPLES_KEPT = 512
"""On-CPU samples kept per thread (10 s at 49 Hz)."""

Ship = Callable[[], None]


@dataclass(slots=True)
class Interval:
    """One stretch of a thread's time, classified once, with the point that describes it if shipped."""

    start_ns: int
    end_ns: int
    category: str | None
    """One of ``contract.PRE_CLASSES``, or None: counted by an enclosing call, or host compute."""
    presync_sign: int
    """+1: a sync; -1: a run-queue wait that ended a sync; 0: neither (the GPU rule's presync)."""
    ship: Ship | None
    """Sends the raw point (None once sent, or for the run-queue half of a split interval)."""
    stack: str | None = None
    """Id of the stack the interval was taken with, if any."""
    reach_ns: int = 0
    """The latest end of this and every interval added to its ring before it (set by
    :meth:`ThreadWindow.add`): a window starting at or after it overlaps none of them."""


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Time per cause class in one window (ns), and the window itself."""

    start_ns: int
    end_ns: int
    spent_ns: dict[str, int]
    presync_ns: int | None
    """Only for a window that began at the previous call's completion (the GPU rule's window)."""
    stacks: dict[str, str] = field(default_factory=dict)
    """Class -> id of the stack that carried most of its time (classes with a stack only)."""
    oncpu: tuple[str, int] | None = None
    """(most-sampled stack id, samples in the window) from the on-CPU sampler, if any fell in it."""

    def attributes(self) -> dict[str, float | int | str]:
        """The ``rankecho.pre.*`` attributes of the collective point (classes with no time left out)."""
        attrs: dict[str, float | int | str] = {c.PRE_WINDOW_MS: (self.end_ns - self.start_ns) / 1e6}
        for name, ns in self.spent_ns.items():
            if ns > 0:
                attrs[f"{c.PRE_PREFIX}{name}_ms"] = ns / 1e6
                if name in self.stacks:
                    attrs[f"{c.PRE_PREFIX}{name}{c.PRE_STACK_SUFFIX}"] = self.stacks[name]
        if self.presync_ns is not None:
            attrs[c.PRE_PRESYNC_MS] = self.presync_ns / 1e6
        if self.oncpu is not None:
            attrs[c.PRE_ONCPU_STACK], attrs[c.PRE_ONCPU_SAMPLES] = self.oncpu
        return attrs


def classify_call(kind: str) -> str | None:
    """The class of a CUDA call's own interval: ``kind`` is malloc, free, memcpy or sync."""
    return {"malloc": "allocator", "free": "allocator", "memcpy": "memcpy", "sync": "slow_gpu"}.get(kind)


def classify_offcpu(sleeping: bool, preempted_by: str | None, call_in_flight: str) -> str | None:
    """The class of an off-CPU interval (of its sleep, when a run-queue wait is split off)."""
    if call_in_flight in IN_CALL:
        return None
    if not sleeping:
        return None if preempted_by == "job" else "cpu_contention"
    return "sleeping"


def _median(values: Iterable[int]) -> int:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


@dataclass
class ThreadWindow:
    """One traced thread's recent intervals, window lengths and interval lengths."""

    intervals: deque[Interval] = field(default_factory=lambda: deque(maxlen=RING_INTERVALS))
    windows: dict[bool, deque[int]] = field(default_factory=dict)
    """Recent window lengths, apart for windows that began at a completion (a step's compute) and at a
    return (between the buckets of one step): their usual lengths differ by orders of magnitude."""
    lengths: dict[str, deque[int]] = field(default_factory=dict)
    calls_collectives: bool = False
    """Set at its first collective: only such a thread's intervals are evidence (the analysis explains a
    rank by its calling thread; NCCL's helper threads sleep and wake all the time)."""
    samples: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))
    """(time, stack id) of the thread's recent on-CPU samples."""
    reach_ns: int = 0
    """The latest end of any interval added so far."""

    def add(self, interval: Interval) -> None:
        self.reach_ns = max(self.reach_ns, interval.end_ns)
        interval.reach_ns = self.reach_ns
        self.intervals.append(interval)
        horizon = interval.end_ns - RING_SPAN_NS
        while self.intervals and self.intervals[0].end_ns < horizon:
            self.intervals.popleft()

    def is_outlier(self, kind: str, length_ns: int, threshold_ns: int) -> bool:
        """True when an interval of ``kind`` this long is evidence (and remember its length)."""
        history = self.lengths.setdefault(kind, deque(maxlen=HISTORY))
        usual = _median(history) if len(history) >= MIN_HISTORY else 0
        history.append(length_ns)
        return length_ns >= threshold_ns and length_ns > OUTLIER_FACTOR * usual

    def _sum(self, start_ns: int, end_ns: int, extra: Interval | None = None
             ) -> tuple[dict[str, int], int, list[Interval], dict[tuple[str, str], int]]:
        """Time per class, presync, the intervals inside and time per (class, stack) in [start_ns, end_ns).

        Only the ring's tail can overlap the window: walking back from the newest interval, the first one
        whose ``reach_ns`` is at or before ``start_ns`` ends the walk (neither it nor any earlier one
        overlaps, in whatever order they ended). Scanning the whole ring instead (up to 2,048 intervals)
        cost ~0.45 ms per collective, about all of the agent's CPU on healthy.yaml (bench/agent.py)."""
        spent = dict.fromkeys(c.PRE_CLASSES, 0)
        presync = 0
        inside: list[Interval] = []
        by_stack: dict[tuple[str, str], int] = {}
        recent: list[Interval] = []
        for iv in reversed(self.intervals):
            if iv.reach_ns <= start_ns:
                break
            recent.append(iv)
        recent.reverse()
        if extra is not None:
            recent.append(extra)
        for iv in recent:
            overlap = min(iv.end_ns, end_ns) - max(iv.start_ns, start_ns)
            if overlap <= 0:
                continue
            inside.append(iv)
            if iv.category is not None:
                spent[iv.category] += overlap
                if iv.stack is not None:
                    key = (iv.category, iv.stack)
                    by_stack[key] = by_stack.get(key, 0) + overlap
            presync += iv.presync_sign * overlap
        return spent, presync, inside, by_stack

    def peek(self, start_ns: int, end_ns: int, open_interval: Interval | None = None) -> Breakdown:
        """The breakdown of [start_ns, end_ns) so far, changing nothing (the heartbeat's view of a quiet
        rank); ``open_interval``: one still in progress (an off-CPU interval not ended yet)."""
        spent, _, _, by_stack = self._sum(start_ns, end_ns, open_interval)
        return Breakdown(start_ns, end_ns, spent, None, _top_stacks(by_stack), self._oncpu(start_ns, end_ns))

    def close(self, start_ns: int, end_ns: int, from_completion: bool, threshold_ns: int) -> Breakdown:
        """The breakdown of [start_ns, end_ns); ships the window's raw intervals when it is unusually long."""
        self.calls_collectives = True
        spent, presync, inside, by_stack = self._sum(start_ns, end_ns)
        length = end_ns - start_ns
        history = self.windows.setdefault(from_completion, deque(maxlen=HISTORY))
        usual = _median(history) if len(history) >= MIN_HISTORY else None
        history.append(length)
        unusual = usual is not None and length >= threshold_ns and length > OUTLIER_FACTOR * usual
        if threshold_ns > 0 and unusual:
            for iv in inside:
                if iv.ship is not None:
                    iv.ship()
                    iv.ship = None
        return Breakdown(start_ns, end_ns, spent, presync if from_completion else None, _top_stacks(by_stack),
                         self._oncpu(start_ns, end_ns))

    def _oncpu(self, start_ns: int, end_ns: int) -> tuple[str, int] | None:
        counts: dict[str, int] = {}
        for ts, stack in self.samples:
            if start_ns <= ts < end_ns:
                counts[stack] = counts.get(stack, 0) + 1
        if not counts:
            return None
        top = max(counts, key=lambda s: (counts[s], s))
        return top, sum(counts.values())


def _top_stacks(by_stack: dict[tuple[str, str], int]) -> dict[str, str]:
    """Class -> the stack with most time in it (ties broken by id, so the choice is stable)."""
    best: dict[str, tuple[int, str]] = {}
    for (category, stack), ns in by_stack.items():
        if (ns, stack) > best.get(category, (-1, "")):
            best[category] = (ns, stack)
    return {category: stack for category, (_, stack) in best.items()}


class WindowKeeper:
    """The rings of every traced thread, and the rule that decides which raw intervals go out.

    ``raw_threshold_ns`` 0 ships every interval (the agent before summarising; for tests and debugging).
    """

    def __init__(self, raw_threshold_ns: int) -> None:
        self.raw_threshold_ns = raw_threshold_ns
        self._threads: dict[tuple[int, int], ThreadWindow] = {}

    def thread(self, pid: int, tid: int) -> ThreadWindow:
        window = self._threads.get((pid, tid))
        if window is None:
            window = self._threads[(pid, tid)] = ThreadWindow()
        return window

    def forget(self, pid: int) -> None:
        for key in [k for k in self._threads if k[0] == pid]:
            del self._threads[key]

    def call(self, pid: int, tid: int, kind: str, start_ns: int, end_ns: int, ship: Ship,
             stack: str | None = None) -> None:
        """A CUDA call's interval (malloc, free, memcpy or sync)."""
        sign = 1 if kind == "sync" else 0
        self._add(pid, tid, kind, start_ns, end_ns, classify_call(kind), sign, ship, stack)

    def sample(self, pid: int, tid: int, ts: int, stack: str) -> None:
        """An on-CPU sample of a thread: it was running ``stack`` at ``ts``."""
        self.thread(pid, tid).samples.append((ts, stack))

    def offcpu(self, pid: int, tid: int, start_ns: int, end_ns: int, sleeping: bool, preempted_by: str | None,
               call_in_flight: str, runq_ns: int, ship: Ship, stack: str | None = None) -> None:
        """An off-CPU interval; a sleep that then waited in the run queue behind other work is two."""
        runq = min(max(runq_ns, 0), end_ns - start_ns) if sleeping and preempted_by == "other" else 0
        category = classify_offcpu(sleeping, preempted_by, call_in_flight)
        # usual lengths apart per state and call in flight: a sleep inside a sync is not a data-loader wait
        kind = f"offcpu:{'sleeping' if sleeping else 'preempted'}:{call_in_flight}"
        self._add(pid, tid, kind, start_ns, end_ns - runq, category, 0, ship, stack)
        if runq > 0:
            window = self.thread(pid, tid)
            in_call = call_in_flight in IN_CALL
            window.add(Interval(end_ns - runq, end_ns, None if in_call else "cpu_contention",
                                -1 if call_in_flight in SYNC_CALLS else 0, None, stack))

    def _add(self, pid: int, tid: int, kind: str, start_ns: int, end_ns: int, category: str | None,
             presync_sign: int, ship: Ship, stack: str | None = None) -> None:
        window = self.thread(pid, tid)
        if self.raw_threshold_ns <= 0 or (
            window.calls_collectives and window.is_outlier(kind, end_ns - start_ns, self.raw_threshold_ns)
        ):
            ship()
            window.add(Interval(start_ns, end_ns, category, presync_sign, None, stack))
        else:
            window.add(Interval(start_ns, end_ns, category, presync_sign, ship, stack))

    def close(self, pid: int, tid: int, start_ns: int, end_ns: int, from_completion: bool) -> Breakdown:
        return self.thread(pid, tid).close(start_ns, end_ns, from_completion, self.raw_threshold_ns)
