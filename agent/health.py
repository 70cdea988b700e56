"""Per-rank health score in [0, 1] from signals the rank's own node can see (formula: docs/health.md).

A straggler does not wait in its collectives (its peers wait for it), so waiting is not the signal.
What changes on the slow rank is its *compute time*: the span from the completion of its previous
collective to its entry into the next one. The score compares that span with the rank's own recent
median, and discounts time the rank's threads spent runnable but off CPU and GPU throttling.

Usage::

    tracker = StepHealth()
    score = tracker.step(compute_ns=380e6, preempted_ns=0, throttled=False)
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

HISTORY = 32
"""Steps in the rolling median baseline."""
MIN_HISTORY = 3
"""Below this many steps the compute factor is 1 (no baseline yet)."""
THROTTLE_FACTOR = 0.7
"""Multiplier while NVML reports a thermal, power or hardware slowdown on the rank's GPU."""


@dataclass(frozen=True)
class StepScore:
    score: float
    compute_ns: int
    baseline_ns: int


class StepHealth:
    """Rolling baseline of one rank's compute spans; one :meth:`step` call per completed collective."""

    def __init__(self, history: int = HISTORY) -> None:
        self._spans: deque[int] = deque(maxlen=history)

    def step(self, compute_ns: int, preempted_ns: int = 0, throttled: bool = False) -> StepScore:
        compute_ns = max(0, int(compute_ns))
        baseline = int(statistics.median(self._spans)) if len(self._spans) >= MIN_HISTORY else 0
        self._spans.append(compute_ns)
        return StepScore(score(compute_ns, baseline, preempted_ns, throttled), compute_ns, baseline)


def score(compute_ns: int, baseline_ns: int, preempted_ns: int, throttled: bool) -> float:
    """``min(1, baseline/compute) * (1 - min(1, preempted/compute)) * (0.7 if throttled else 1)``."""
    compute_factor = 1.0
    if baseline_ns > 0 and compute_ns > baseline_ns:
        compute_factor = baseline_ns / compute_ns
    preempt_factor = 1.0
    if compute_ns > 0:
        preempt_factor = 1.0 - min(1.0, max(0, preempted_ns) / compute_ns)
    value = compute_factor * preempt_factor * (THROTTLE_FACTOR if throttled else 1.0)
    return round(min(1.0, max(0.0, value)), 4)
