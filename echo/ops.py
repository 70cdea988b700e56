"""Echo's own counters and their Prometheus text rendering (served at ``/metrics``).

One :class:`Stats` instance is shared by receivers and the writer; every update takes a lock, so the
numbers stay exact under concurrent producers. :func:`render` is a pure function of a snapshot.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

COMMIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (10, 100, 1_000, 5_000, 10_000, 25_000, 50_000, 100_000)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.n += 1
        self.total += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1


@dataclass
class Snapshot:
    received: Counter[str]
    committed: int
    duplicates: int
    rejected: Counter[str]
    rejected_what: dict[str, str]
    """reason -> ``request`` (the whole request was refused) or ``event`` (one event inside a request)."""
    stored_with_fix: Counter[str]
    attribute_conflicts: Counter[str]
    """column -> events whose point attributes contradicted the resource's value (which was kept)."""
    requests: Counter[str]
    commit_seconds: Histogram
    batch_rows: Histogram
    queue_rows: int


class Stats:
    """Thread-safe ingest counters; ``queue_rows`` is read live from the writer."""

    def __init__(self, queue_rows: Callable[[], int] = lambda: 0) -> None:
        self._lock = threading.Lock()
        self.queue_rows = queue_rows
        self._received: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._rejected_what: dict[str, str] = {}
        self._fixed: Counter[str] = Counter()
        self._conflicts: Counter[str] = Counter()
        self._requests: Counter[str] = Counter()
        self._committed = 0
        self._duplicates = 0
        self._commit = Histogram(COMMIT_BUCKETS_S)
        self._batch = Histogram(BATCH_BUCKETS)

    def received(self, signal: str, n: int) -> None:
        with self._lock:
            self._received[signal] += n

    def rejected(self, reason: str, n: int = 1, what: str = "event") -> None:
        """Count ``n`` refused events, or (``what="request"``) one refused request, under ``reason``."""
        if n:
            with self._lock:
                self._rejected[reason] += n
                self._rejected_what[reason] = what

    def stored_with_fix(self, counts: Counter[str]) -> None:
        if counts:
            with self._lock:
                self._fixed.update(counts)

    def attribute_conflicts(self, counts: Counter[str]) -> None:
        if counts:
            with self._lock:
                self._conflicts.update(counts)

    def request(self, outcome: str) -> None:
        with self._lock:
            self._requests[outcome] += 1

    def committed(self, rows: int, inserted: int, seconds: float) -> None:
        with self._lock:
            self._committed += inserted
            self._duplicates += rows - inserted
            self._commit.observe(seconds)
            self._batch.observe(rows)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                received=Counter(self._received), committed=self._committed, duplicates=self._duplicates,
                rejected=Counter(self._rejected), rejected_what=dict(self._rejected_what),
                stored_with_fix=Counter(self._fixed), attribute_conflicts=Counter(self._conflicts),
                requests=Counter(self._requests),
                commit_seconds=_copy(self._commit), batch_rows=_copy(self._batch),
                queue_rows=self.queue_rows(),
            )  # fmt: skip


def _copy(h: Histogram) -> Histogram:
    out = Histogram(h.bounds)
    out.counts, out.total, out.n = list(h.counts), h.total, h.n
    return out


def _histogram_lines(name: str, help_text: str, h: Histogram) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{le="{b:g}"}} {n}' for b, n in zip(h.bounds, h.counts, strict=True)]
    lines += [f'{name}_bucket{{le="+Inf"}} {h.n}', f"{name}_sum {h.total:.6f}", f"{name}_count {h.n}"]
    return lines


def _counter_lines(name: str, help_text: str, label: str, values: Counter[str]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    lines += [f'{name}{{{label}="{k}"}} {v}' for k, v in sorted(values.items())]
    return lines


def render(s: Snapshot) -> str:
    """Prometheus text exposition format 0.0.4."""
    lines = _counter_lines(
        "rankecho_echo_received_total", "Events decoded from OTLP requests.", "signal", s.received
    )
    lines += [
        "# HELP rankecho_echo_committed_total Events newly stored (committed) in the events table.",
        "# TYPE rankecho_echo_committed_total counter",
        f"rankecho_echo_committed_total {s.committed}",
        "# HELP rankecho_echo_duplicates_skipped_total Events already stored (same event id), skipped.",
        "# TYPE rankecho_echo_duplicates_skipped_total counter",
        f"rankecho_echo_duplicates_skipped_total {s.duplicates}",
        "# HELP rankecho_echo_queue_rows Decoded events waiting for the writer.",
        "# TYPE rankecho_echo_queue_rows gauge",
        f"rankecho_echo_queue_rows {s.queue_rows}",
    ]
    lines += [
        "# HELP rankecho_echo_rejected_total Refused, by reason; what=request counts whole requests, "
        "what=event single events inside an accepted request.",
        "# TYPE rankecho_echo_rejected_total counter",
    ]
    lines += [
        f'rankecho_echo_rejected_total{{reason="{k}",what="{s.rejected_what.get(k, "event")}"}} {v}'
        for k, v in sorted(s.rejected.items())
    ]
    lines += _counter_lines(
        "rankecho_echo_stored_with_fix_total", "Events stored after a safe repair, by reason.", "reason",
        s.stored_with_fix,
    )  # fmt: skip
    lines += _counter_lines(
        "rankecho_echo_attribute_conflicts_total",
        "Events whose point attributes named another value for a column than their resource; the "
        "resource's value is stored in the column, the point's stays in attrs_json.",
        "column", s.attribute_conflicts,
    )  # fmt: skip
    lines += _counter_lines(
        "rankecho_echo_requests_total", "OTLP requests by outcome.", "outcome", s.requests
    )
    lines += _histogram_lines(
        "rankecho_echo_commit_seconds", "Writer INSERT+COMMIT latency.", s.commit_seconds
    )
    lines += _histogram_lines("rankecho_echo_batch_rows", "Rows per writer commit.", s.batch_rows)
    return "\n".join(lines) + "\n"
