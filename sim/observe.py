"""Watch a thread's scheduling from outside the process, the way a test or benchmark checks that a
fault really left its signature (on-CPU, runnable-but-preempted, or sleeping).

Reads ``/proc/PID/task/TID/schedstat`` (ns on CPU, ns waiting runnable on a run queue) and
``/proc/PID/task/TID/syscall`` (the syscall it is blocked in). Usage::

    sampler = Sampler([(pid, tid)], interval_s=0.005)
    sampler.start(); ...; sampler.stop()
    w = sampler.window(tid, start_ns, end_ns)   # realtime ns
    w.cpu_ms, w.run_delay_ms, w.sleep_ms, w.syscalls
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ThreadSample:
    t_ns: int
    """CLOCK_REALTIME when sampled."""
    cpu_ns: int
    run_delay_ns: int
    syscall: int
    """Syscall number it is blocked in; -1 when running or unknown."""


@dataclass(frozen=True)
class Window:
    wall_ms: float
    cpu_ms: float
    run_delay_ms: float
    syscalls: Counter[int] = field(default_factory=Counter)

    @property
    def sleep_ms(self) -> float:
        """Time neither on a CPU nor waiting for one: blocked (sleeping)."""
        return max(0.0, self.wall_ms - self.cpu_ms - self.run_delay_ms)


def read_thread(pid: int, tid: int, proc: Path = Path("/proc")) -> ThreadSample | None:
    base = proc / str(pid) / "task" / str(tid)
    try:
        cpu, delay, _slices = (int(v) for v in (base / "schedstat").read_text().split())
        sc = (base / "syscall").read_text().split()
    except (OSError, ValueError):
        return None
    nr = int(sc[0]) if sc and sc[0].lstrip("-").isdigit() else -1
    return ThreadSample(time.time_ns(), cpu, delay, nr)


class Sampler:
    """Samples threads on a background thread until stopped; ``window`` interpolates nothing, it
    takes the last sample at or before ``start`` and the first at or after ``end``."""

    def __init__(self, threads: list[tuple[int, int]], interval_s: float = 0.005, proc: Path = Path("/proc")):
        self.threads, self.interval_s, self.proc = threads, interval_s, proc
        self.samples: dict[int, list[ThreadSample]] = {tid: [] for _, tid in threads}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, tid in self.threads:
                s = read_thread(pid, tid, self.proc)
                if s is not None:
                    self.samples[tid].append(s)
            self._stop.wait(self.interval_s)

    def window(self, tid: int, start_ns: int, end_ns: int) -> Window:
        samples = self.samples[tid]
        before = [s for s in samples if s.t_ns <= start_ns]
        after = [s for s in samples if s.t_ns >= end_ns]
        if not before or not after:
            raise ValueError(f"thread {tid} was not sampled around [{start_ns}, {end_ns}]")
        a, b = before[-1], after[0]
        inside = Counter(s.syscall for s in samples if a.t_ns <= s.t_ns <= b.t_ns)
        return Window(
            (b.t_ns - a.t_ns) / 1e6,
            (b.cpu_ns - a.cpu_ns) / 1e6,
            (b.run_delay_ns - a.run_delay_ns) / 1e6,
            inside,
        )
