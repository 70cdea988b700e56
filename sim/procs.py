"""Process plumbing shared by the launcher and the agent starter: errors, stopping, log tails."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


class LaunchError(RuntimeError):
    """The cluster could not be started or a process failed; the message says which and why."""


def tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no output)"


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace_s: float = 5.0) -> None:
    """Signal (if still running), wait up to ``grace_s``, then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
