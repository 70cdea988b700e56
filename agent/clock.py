"""Conversion of BPF timestamps (CLOCK_MONOTONIC ns) to Unix ns, resampled as the agent runs.

The offset is measured by reading CLOCK_MONOTONIC between two CLOCK_REALTIME reads and keeping the
narrowest of ~50 brackets (about +-80 ns on a quiet host). ``extra_offset_ns`` is the testing-only
``--clock-offset-ns`` knob: it shifts every timestamp this agent sends, so simulator scenarios can
give one node a skewed clock. Usage::

    clock = ClockConverter()
    unix_ns = clock.to_unix(bpf_ts)
"""

from __future__ import annotations

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
    ) -> None:
        self._extra = int(extra_offset_ns)
        self._samples = samples
        self._realtime = realtime
        self._monotonic = monotonic
        self.sample = measure_offset(samples, realtime, monotonic)

    def resample(self) -> Sample:
        self.sample = measure_offset(self._samples, self._realtime, self._monotonic)
        return self.sample

    def to_unix(self, mono_ns: int) -> int:
        return mono_ns + self.sample.offset_ns + self._extra

    def now_mono(self) -> int:
        return self._monotonic()
