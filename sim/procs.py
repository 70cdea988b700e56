"""Process plumbing shared by the launcher and the agent starter: errors, stopping, log tails."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class LaunchError(RuntimeError):
    """The cluster could not be started or a process failed; the message says which and why."""


class Stopped(Exception):
    """A stop signal arrived (SIGTERM: exit 143, SIGINT: 130): stop everything, drain the agents, exit.
    Raised by the launcher's own code where it polls its stop flag, never from a signal handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name if signum else "stop")
        self.returncode = 130 if signum == signal.SIGINT else 143


def tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no output)"


def stop_process(proc: subprocess.Popen[bytes], sig: int | None = signal.SIGTERM,
                 grace_s: float = 5.0) -> None:  # fmt: skip
    """Signal (if still running; ``sig`` None: it was signalled already), wait up to ``grace_s``, then
    SIGKILL. Never a second stop signal: one arriving while a process exits after handling the first
    kills it (-15) once Python has put the default handlers back."""
    if proc.poll() is not None:
        return
    if sig is not None:
        proc.send_signal(sig)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def signals_blocked() -> Iterator[None]:
    """Block SIGTERM/SIGINT in this thread while a child is spawned: the child inherits the mask.

    An agent started this way cannot be killed by a stop sent before it installed its handler; it
    unblocks them once the handler is in place (``rankecho.stopflag.install``), so the stop is delivered
    then and the agent exits 0. This thread gets any signal that arrived meanwhile on leaving.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
