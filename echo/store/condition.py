"""Whether the store can commit right now, and why not: the cause producers, the log and ``/readyz`` see.

DuckDB reports a full disk, a permission problem or a damaged file as a generic commit error; the
writer names the cause (:func:`cause_of`) so an operator reads "disk full" instead of a transaction
message. :class:`StoreCondition` remembers the first failure of a run of failures: Echo is unready
from then until a commit succeeds again, or until the writer's probe (:func:`probe_write`) shows the
directory takes writes again, so a Kubernetes Service that stopped routing to an unready Echo sends
traffic back once space is freed. Checkpoints are skipped when the disk has no room for them
(:func:`checkpoint_room`): a checkpoint that runs out of space invalidates the database and leaves the
file larger than before, while a skipped one only leaves the write-ahead log to replay at the next start.

Usage::

    condition = StoreCondition()
    condition.failed(cause_of(exc))     # after a failed COMMIT
    condition.ok()                      # after a successful one
    condition.reason                    # None when healthy
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PROBE_BYTES = 1 << 20
"""The probe writes this much next to the store: room for at least a small commit's log."""
CHECKPOINT_RESERVE_BYTES = 8 << 20
"""Free space kept beyond the checkpoint's own estimate (indexes and metadata are rewritten too)."""

_CAUSES = (
    ("disk full", ("no space left on device", "disk quota exceeded", "file too large")),
    ("permission denied", ("permission denied", "operation not permitted")),
    ("read-only file system", ("read-only file system",)),
    ("store file corrupt", ("corrupt", "checksum", "invalid database", "not a valid duckdb")),
    ("I/O error", ("input/output error", "i/o error")),
)
FIXES = {
    "disk full": "free space on the store's volume (or grow it); Echo retries by itself",
    "permission denied": "give Echo's user write access to the store's directory and files",
    "read-only file system": "mount the store's volume read-write",
    "store file corrupt": "stop Echo, move the store file aside and restore it from a copy",
    "I/O error": "check the store's disk (dmesg)",
}


def cause_of(exc: BaseException) -> str:
    """A short cause first (``disk full: ...``), then DuckDB's own message, for producers and the log."""
    text = str(exc)
    lowered = text.lower()
    for cause, needles in _CAUSES:
        if any(n in lowered for n in needles):
            return f"{cause}: {text}"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"disk full: {text}"
    return text


def store_caused(exc: BaseException) -> bool:
    """True when the failure is the store's (a known cause, or an invalidated database), not the rows'."""
    return cause_of(exc).split(":", 1)[0] in FIXES or type(exc).__name__ == "FatalException"


def fix_for(reason: str) -> str:
    cause = reason.split(":", 1)[0]
    return FIXES.get(cause, "see Echo's log")


@dataclass(frozen=True)
class Room:
    free_bytes: int
    need_bytes: int

    @property
    def enough(self) -> bool:
        return self.free_bytes >= self.need_bytes


def checkpoint_room(db_path: Path) -> Room:
    """Free space on the store's volume against a checkpoint's worst case: the log's contents written
    into the file (twice over, for rewritten blocks and indexes) plus a reserve."""
    wal = db_path.with_name(db_path.name + ".wal")
    try:
        wal_bytes = wal.stat().st_size
    except FileNotFoundError:
        wal_bytes = 0
    st = os.statvfs(db_path.parent)
    return Room(st.f_bavail * st.f_frsize, 2 * wal_bytes + CHECKPOINT_RESERVE_BYTES)


def probe_write(directory: Path, n_bytes: int = PROBE_BYTES) -> str | None:
    """Write, sync and remove ``n_bytes`` in ``directory``; None when that worked, else the cause."""
    path = directory / f".rankecho-probe-{os.getpid()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * n_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return cause_of(exc)
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    return None


class StoreCondition:
    """Thread-safe: the writer thread reports, ``/readyz`` and receivers read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._since = 0.0
        self.failures = 0

    def failed(self, reason: str) -> bool:
        """Record a failed commit; True when this starts a run of failures (log it loudly once)."""
        with self._lock:
            self.failures += 1
            first = self._reason is None
            if first:
                self._since = time.time()
            self._reason = reason
            return first

    def ok(self) -> bool:
        """Record a success; True when it ends a run of failures."""
        with self._lock:
            was = self._reason is not None
            self._reason = None
            return was

    @property
    def reason(self) -> str | None:
        return self._reason

    def describe(self) -> str:
        with self._lock:
            if self._reason is None:
                return "commits succeed"
            ago = time.time() - self._since
            return f"commits failing for {ago:.0f} s: {self._reason} (fix: {fix_for(self._reason)})"
