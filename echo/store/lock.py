"""Exclusive flock(2) locks so only one Echo ever writes a store, whatever path names it.

Two locks, both dropped by the kernel when the holder exits for any reason (kill -9 included), so a
crashed Echo never leaves a stale lock behind:

- a sidecar ``<real path>.lock`` next to the store's *resolved* path (symlinks and relative paths lead
  to the same sidecar), holding the holder's pid only to name it in the error; it also guards the
  moment a new store file is created;
- the store file itself, locked by inode, so a hard link (another name, another directory) finds it
  held too. The holder of that one is named from ``/proc/locks``.

A refused attempt leaves no file behind (a sidecar it created is removed again).

Usage::

    with StoreLock(Path("echo.db")) as lock:
        ...           # this process alone may open lock.real_path read-write
        lock.cover()  # after the store file was created, lock it by inode too
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType


class StoreLockedError(RuntimeError):
    """Another process holds the store; ``holder_pid`` is its pid when known."""

    def __init__(self, db_path: Path, holder_pid: int | None, via: str = "") -> None:
        who = f"pid {holder_pid}" if holder_pid else "another process"
        super().__init__(
            f"{db_path} is held by {who} ({via or f'lock file {lock_path(db_path)}'}); stop that Echo or "
            "choose another --db"
        )
        self.holder_pid = holder_pid


def real_path(db_path: Path) -> Path:
    """The store's path with symlinks and ``..`` resolved: Echo opens this (its WAL sits beside it)."""
    return Path(os.path.realpath(db_path))


def lock_path(db_path: Path) -> Path:
    real = real_path(db_path)
    return real.with_name(real.name + ".lock")


def _flock_holder(path: Path) -> int | None:
    """The pid holding a flock on ``path``'s inode, from ``/proc/locks`` (None when not found)."""
    try:
        st = path.stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == want and parts[4].isdigit():
            return int(parts[4]) or None
    return None


def read_holder(db_path: Path) -> int | None:
    """The pid of the current holder: from the sidecar when readable, else from the kernel's locks."""
    try:
        text = lock_path(db_path).read_text().strip()
    except OSError:
        text = ""
    if text.isdigit():
        return int(text)
    return _flock_holder(real_path(db_path))


def _held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def is_locked(db_path: Path) -> bool:
    """True when some live process holds the store right now (by any of its names)."""
    return _held(lock_path(db_path)) or _held(real_path(db_path))


class StoreLock:
    """Non-blocking exclusive lock; :meth:`acquire` raises :class:`StoreLockedError` at once if held."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.real_path = real_path(db_path)
        self._fd: int | None = None
        self._file_fd: int | None = None

    def acquire(self) -> None:
        path = lock_path(self.db_path)  # its directory exists: echo.store.location checked
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(self.db_path, read_holder(self.db_path)) from None
        try:
            self._fd = fd
            self.cover()
        except StoreLockedError:
            if created:
                with contextlib.suppress(OSError):
                    path.unlink()  # leave nothing behind for a store that was not ours to open
            self.release()
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def cover(self) -> None:
        """Lock the store file itself (by inode) once it exists; a no-op before, or when done."""
        if self._file_fd is not None:
            return
        try:
            fd = os.open(self.real_path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _flock_holder(self.real_path)
            raise StoreLockedError(
                self.db_path, holder, "through another name for the same file, e.g. a hard link"
            ) from None
        self._file_fd = fd

    def release(self) -> None:
        for fd in (self._file_fd, self._fd):
            if fd is not None:
                os.close(fd)  # closing the descriptor drops the flock
        self._fd = self._file_fd = None

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
