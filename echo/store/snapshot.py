"""Read-only copies of the live store for the analysis workers, taken without stopping ingest.

DuckDB lets no other process open a file that a process has open for writing, so the analysis workers
(:mod:`echo.sandbox`) read a copy. A copy is taken when a query arrives and the store changed since
the last one (the store file's and its WAL's size and mtime differ), at most every ``min_interval_s``:
commits are held (:meth:`echo.store.writer.Writer.hold`; receivers keep queueing and acknowledging
what is committed) while the store file and its WAL are copied, which is a consistent pair because
nothing else writes them; the worker replays that WAL in memory when it attaches the copy. The
two newest copies are kept (a worker may still be attaching the older one); older ones are deleted.

Cost: one file copy of the store per refresh, during which commits wait; a query sees data as old as
the last copy (at most ``min_interval_s`` plus the copy time).

Usage::

    snapshots = Snapshots(db_path, writer.hold)
    path = snapshots.current()
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path


def _signature(path: Path) -> tuple[tuple[int, int], ...]:
    out = []
    for file in (path, path.with_name(path.name + ".wal")):
        try:
            stat = file.stat()
            out.append((stat.st_size, stat.st_mtime_ns))
        except FileNotFoundError:
            out.append((-1, -1))
    return tuple(out)


class Snapshots:
    def __init__(
        self,
        db_path: Path,
        hold: Callable[[], AbstractContextManager[None]],
        directory: Path | None = None,
        min_interval_s: float = 0.0,
    ) -> None:
        self.db_path = db_path
        self.directory = directory or db_path.with_name(db_path.name + ".analysis")
        self.min_interval_s = min_interval_s
        self.copies = 0
        self.last_copy_s = 0.0
        """Seconds the last copy held commits."""
        self._hold = hold
        self._lock = threading.Lock()
        self._kept: list[Path] = []
        self._signature: tuple[tuple[int, int], ...] | None = None
        self._taken_at = 0.0

    def current(self) -> Path:
        """A copy no older than the store's last change (or than ``min_interval_s``)."""
        with self._lock:
            fresh = self._kept and (
                _signature(self.db_path) == self._signature
                or time.monotonic() - self._taken_at < self.min_interval_s
            )
            if fresh:
                return self._kept[-1]
            return self._copy()

    def _copy(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.copies += 1
        target = self.directory / f"snapshot-{self.copies}.db"
        wal = self.db_path.with_name(self.db_path.name + ".wal")
        started = time.perf_counter()
        with self._hold():
            self._signature = _signature(self.db_path)
            shutil.copyfile(self.db_path, target)
            if wal.exists():
                shutil.copyfile(wal, target.with_name(target.name + ".wal"))
        self.last_copy_s = time.perf_counter() - started
        self._taken_at = time.monotonic()
        self._kept.append(target)
        while len(self._kept) > 2:
            _remove(self._kept.pop(0))
        return target

    def remove_all(self) -> None:
        """Delete every copy (at stop); a worker still reading one keeps its open file."""
        with self._lock:
            for path in self._kept:
                _remove(path)
            self._kept.clear()
            shutil.rmtree(self.directory, ignore_errors=True)


def _remove(path: Path) -> None:
    for file in (path, path.with_name(path.name + ".wal")):
        file.unlink(missing_ok=True)
