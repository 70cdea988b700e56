"""An exclusive flock(2) on a sidecar ``<db>.lock`` file, so only one Echo ever writes a store.

The kernel drops the lock when the holder exits for any reason (kill -9 included), so a crashed Echo
never leaves a stale lock behind. The file holds the holder's pid, only to name it in the error.

Usage::

    with StoreLock(Path("echo.db")):
        ...  # this process alone may open echo.db read-write
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType


class StoreLockedError(RuntimeError):
    """Another process holds the store; ``holder_pid`` is its pid when known."""

    def __init__(self, db_path: Path, holder_pid: int | None) -> None:
        who = f"pid {holder_pid}" if holder_pid else "another process"
        super().__init__(
            f"{db_path} is held by {who} (lock file {lock_path(db_path)}); stop that Echo or "
            "choose another --db"
        )
        self.holder_pid = holder_pid


def lock_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".lock")


def read_holder(db_path: Path) -> int | None:
    """The pid written by the current or last holder, if readable."""
    try:
        text = lock_path(db_path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def is_locked(db_path: Path) -> bool:
    """True when some live process holds the store's lock right now."""
    path = lock_path(db_path)
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class StoreLock:
    """Non-blocking exclusive lock; :meth:`acquire` raises :class:`StoreLockedError` at once if held."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._fd: int | None = None

    def acquire(self) -> None:
        path = lock_path(self.db_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(self.db_path, read_holder(self.db_path)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
