"""Conversion of BPF timestamps (CLOCK_MONOTONIC ns) to Unix ns, resampled as the agent runs.

The offset is measured by reading CLOCK_MONOTONIC between two CLOCK_REALTIME reads and keeping the
narrowest of ~50 brackets (about +-80 ns on a quiet host). ``extra_offset_ns`` is the testing-only
``--clock-offset-ns`` knob: it shifts every timestamp this agent sends, so simulator scenarios can
give one node a skewed clock; ``--clock-drift-ppm`` (with ``--clock-epoch-ns``) makes that skew grow with
true time, and ``--clock-step-file`` lets the simulator step it mid-run, as an NTP step would
(:class:`ClockStepFile`). Usage::

    clock = ClockConverter()
    unix_ns = clock.to_unix(bpf_ts)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

ReadNs = Callable[[], int]


def _realtime() -> int:
    return time.clock_gettime_ns(time.CLOCK_REALTIME)


def _monotonic() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@dataclass(frozen=True)
class Sample:
    offset_ns: int
    """realtime - monotonic."""
    uncertainty_ns: int
    """Half the width of the narrowest realtime bracket."""


def measure_offset(samples: int = 50, realtime: ReadNs = _realtime, monotonic: ReadNs = _monotonic) -> Sample:
    best: Sample | None = None
    for _ in range(max(1, samples)):
        r1 = realtime()
        m = monotonic()
        r2 = realtime()
        half = (r2 - r1) // 2
        if best is None or half < best.uncertainty_ns:
            best = Sample(r1 + half - m, half)
    assert best is not None
    return best


class ClockConverter:
    """BPF monotonic ns -> Unix ns. Call :meth:`resample` periodically (a clock step moves the offset)."""

    def __init__(
        self,
        extra_offset_ns: int = 0,
        samples: int = 50,
        realtime: ReadNs = _realtime,
        monotonic: ReadNs = _monotonic,
        drift_ppm: float = 0.0,
        drift_epoch_ns: int = 0,
    ) -> None:
        self._extra = int(extra_offset_ns)
        self._drift_ppm, self._epoch = float(drift_ppm), int(drift_epoch_ns)
        self._steps: list[tuple[int, int]] = []
        """(true Unix ns from which it applies, ns added) of each simulated clock step."""
        self._samples = samples
        self._realtime = realtime
        self._monotonic = monotonic
        self.sample = measure_offset(samples, realtime, monotonic)

    def resample(self) -> Sample:
        self.sample = measure_offset(self._samples, self._realtime, self._monotonic)
        return self.sample

    def to_unix(self, mono_ns: int) -> int:
        true_ns = mono_ns + self.sample.offset_ns
        if not self._drift_ppm and not self._steps:
            return true_ns + self._extra
        return true_ns + self.simulated_offset_ns(true_ns)

    def simulated_offset_ns(self, true_ns: int) -> int:
        """TESTING ONLY: the skew added at true Unix time ``true_ns``: the constant offset, the drift since
        the epoch and every clock step taken by then."""
        drift = round(self._drift_ppm * (true_ns - self._epoch) / 1e6) if self._drift_ppm else 0
        return self._extra + drift + sum(ns for at, ns in self._steps if true_ns >= at)

    def step(self, at_true_ns: int, step_ns: int) -> None:
        """TESTING ONLY: from true Unix time ``at_true_ns`` on, timestamps are ``step_ns`` later."""
        self._steps.append((int(at_true_ns), int(step_ns)))

    def now_true(self) -> int:
        return self._monotonic() + self.sample.offset_ns

    def now_mono(self) -> int:
        return self._monotonic()


class ClockStepFile:
    """TESTING ONLY (``--clock-step-file``): when the simulator writes ``PATH`` (the step in ms), step the
    clock from now on and write ``PATH.applied`` (the true Unix ns it applied from), once. Polled from the
    agent's loop: the step applies to every event at or after that instant, whenever it is converted."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.done = False

    def poll(self, clock: ClockConverter) -> bool:
        if self.done or not os.path.exists(self.path):
            return False
        try:
            with open(self.path) as f:
                ms = float(f.read().strip())
        except (OSError, ValueError):
            return False  # half-written: the next poll reads it whole
        at = clock.now_true()
        clock.step(at, round(ms * 1e6))
        with open(self.path + ".applied.tmp", "w") as f:
            f.write(f"{at}\n")
        os.replace(self.path + ".applied.tmp", self.path + ".applied")
        self.done = True
        return True
