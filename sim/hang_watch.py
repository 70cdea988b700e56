"""Watch a simulated job for a hang while it is stuck, then end it: the live half of scoring a hang.

A hang is only worth naming while it happens, so a scenario with a ``hang`` fault is run with this watcher
beside it: a thread asks ``find_hangs`` (through ``ask``) once a poll until a hang is named and the answer
has held for ``settle_s`` (each node's agent sends its ranks' open calls up to one pending timeout after the
other node's, so a first answer may lack a node), keeps that answer and when a hang was first named, then
SIGKILLs the ranks hung for good so the run ends (a timed hang ends by itself). Shared by
tests/test_agent_failures.py and ``rankecho evaluate``. Usage::

    with HangWatch(ask, run_dir, scenario, settle_s=12) as watch:
        result = run_scenario(scenario, opts)
    watch.answer, watch.first_named_ns
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from rankecho.sim.groundtruth import parse_rank_log, rank_log_path
from rankecho.sim.scenario import Scenario

POLL_S = 1.0
"""How often the watcher asks; also the resolution of the time to name a hang."""


def hung_for_good(scenario: Scenario) -> list[tuple[int, str]]:
    """(rank, node id) of every rank a hang with no end (``ms: forever``) stops."""
    nodes = {rank: node.id for rank, node, _ in scenario.rank_layout()}
    return sorted(
        (rank, nodes[rank]) for f in scenario.faults if f.kind == "hang" and not f.ms
        for rank in scenario.fault_ranks(f)
    )  # fmt: skip


class HangWatch:
    """The watcher thread, as a context manager around the run (it stops when the block exits)."""

    def __init__(
        self, ask: Callable[[], dict[str, Any]], run_dir: Path, scenario: Scenario, settle_s: float
    ) -> None:
        self._ask = ask
        self._run_dir = run_dir
        self._hung = hung_for_good(scenario)
        self._settle_s = settle_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hang-watch", daemon=True)
        self.answer: dict[str, Any] | None = None
        """The settled find_hangs answer (None: no hang named while the job ran)."""
        self.first_named_ns: int | None = None
        """Wall-clock ns when an answer first named a hang."""
        self.error: Exception | None = None
        """What the watcher raised (__exit__ raises it again when the block itself did not raise)."""

    def __enter__(self) -> HangWatch:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join(10)
        if kind is None and self.error is not None:
            raise self.error

    def _watch(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # raised by __exit__, not lost in the thread
            self.error = exc

    def _loop(self) -> None:
        shape, since = None, 0.0
        while not self._done.wait(POLL_S):
            found = self._ask()
            if found["hangs"] and self.first_named_ns is None:
                self.first_named_ns = time.time_ns()
            now_shape = [(h["causal_chain_id"], h["entered"], h["missing"]) for h in found["hangs"]]
            if now_shape != shape:
                shape, since = now_shape, time.monotonic()
            if found["hangs"] and time.monotonic() - since > self._settle_s:
                self.answer = found
                self.kill_hung()
                return

    def kill_hung(self) -> None:
        """SIGKILL every rank hung for good (its pid from its log), ending the run."""
        for rank, node_id in self._hung:
            path = rank_log_path(self._run_dir, node_id, rank)
            log = parse_rank_log(path.read_text() if path.exists() else "", rank)
            if log.pid:
                with contextlib.suppress(ProcessLookupError):  # already gone
                    os.kill(log.pid, signal.SIGKILL)
