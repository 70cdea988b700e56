"""The stop request of a long-running command (agent, serve, sim): set by SIGTERM or SIGINT at any moment
of the process's life, read by its loop.

Why a plain flag and not ``threading.Event``: a Python signal handler runs in the main thread between two
bytecodes, possibly while that same thread holds the Event's internal lock inside ``wait()``; calling
``Event.set()`` there deadlocks. The handler here only assigns a bool.

Why installed first thing (``rankecho.cli.main`` calls :func:`install` before it imports any subcommand):
until a handler exists, SIGTERM kills the process (exit -15), and start-up (imports, BPF compile) takes
seconds on a cold machine. Launchers close the last gap, between ``exec`` and :func:`install`, by
starting the agent with SIGTERM and SIGINT blocked (:func:`sim.procs.signals_blocked`); :func:`install`
unblocks them, so a stop sent meanwhile is delivered then, sets the flag, and the agent exits 0.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopFlag:
    """What ``agent.runner.run`` polls: ``is_set()``, ``set()`` and ``wait(timeout)``, like an Event."""

    def __init__(self) -> None:
        self._set = False
        self.signum = 0
        """The stop signal that set it (0: set by code): a launcher exits 130 for SIGINT, 143 for SIGTERM."""

    def set(self, signum: int = 0) -> None:
        self.signum = self.signum or signum
        self._set = True

    def clear(self) -> None:
        self._set, self.signum = False, 0

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Sleep ``timeout`` unless stopped; a signal arriving meanwhile is seen by the next call."""
        if not self._set:
            time.sleep(timeout)
        return self._set


STOP = StopFlag()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    STOP.set(signum)


def install() -> StopFlag:
    """Make SIGTERM/SIGINT set :data:`STOP`, then unblock them (a launcher may have blocked them)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return STOP


def ignore_further() -> None:
    """Once the agent is done: ignore later stop signals for good.

    Python's finalization resets every signal it handles back to the default action; a second SIGTERM
    arriving then (``kill`` repeated by a launcher, a supervisor's retry) would turn a clean exit into
    -15. An ignored signal is left ignored.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@contextmanager
def handled() -> Iterator[StopFlag]:
    """For a command that runs in-process (``rankecho sim``'s :func:`sim.launcher.run_scenario`): stop
    signals set the yielded flag for the duration, the previous handlers come back after.

    A flag and not an exception raised from the handler: an exception can land anywhere, e.g. between
    starting an agent and recording it (an agent nobody stops) or in the middle of stopping agents (a
    launcher that exits without draining them). The caller polls the flag at safe points instead.
    When ``rankecho.cli.main`` already installed the handlers, a stop that arrived during start-up is
    kept; otherwise (a second run in the same process) the flag starts clear. Off the main thread,
    where signals cannot be handled, the flag is a fresh one nothing sets."""
    if threading.current_thread() is not threading.main_thread():
        yield StopFlag()
        return
    old = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    if any(handler is not _on_signal for handler in old.values()):
        STOP.clear()
    install()
    try:
        yield STOP
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
