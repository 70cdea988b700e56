"""Read-only copies of the live store for the analysis workers, taken without stopping ingest.

DuckDB lets no other process open a file that a process has open for writing, so the analysis workers
(:mod:`echo.sandbox`) read a copy: the store file plus a prefix of its WAL (every commit up to the copy;
the worker replays it in memory when it attaches the copy). A copy is made when a query arrives and
the store changed since the last one (size and mtime of the file or its WAL), in a background thread,
at most every ``min_interval_s`` or four times as long as the last copy took (so a large store is not
copied over and over); the query waits for it at most ``wait_s`` and otherwise
reads the previous copy (so a query never waits for a large copy; only the first copy is always
waited for). The two newest copies are kept, older ones deleted. A copy is private to the analysis
workers (:func:`is_private_copy`): the first worker to read it drops from it everything the guard's
policy does not allow (:func:`rankecho.echo.guard.catalog.prune`), so the catalog the workers see
holds the allowed relations and nothing else.

How a copy stays consistent while the writer commits: DuckDB changes the store file itself only when
it checkpoints (or writes a large insert's row groups ahead of its commit); commits append to the WAL.
Commits are held (:meth:`rankecho.echo.store.writer.Writer.hold`; receivers keep decoding and queueing) only
long enough to note the file's state and the WAL's length; the file is then copied, and the WAL up to
that length. If the file changed meanwhile, the copy is redone with commits held throughout. A store
under ``HELD_COPY_BYTES`` is always copied with commits held (a few ms), which also covers the coarse
mtime clock.

Usage::

    snapshots = Snapshots(db_path, writer.hold)
    path = snapshots.current()
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from rankecho.echo.store.reader import QueryError

log = logging.getLogger(__name__)
HELD_COPY_BYTES = 64 << 20
COPY_CHUNK = 8 << 20
SIDECARS = (".wal", ".lock", ".pruned")
"""Files beside a copy: its WAL prefix, and the workers' lock and marker for pruning it."""
_private: set[str] = set()
_private_lock = threading.Lock()


def is_private_copy(path: Path) -> bool:
    """True for a copy some :class:`Snapshots` of this process made and still keeps: the analysis
    workers may change it (prune it) in place; any other file they must not touch."""
    with _private_lock:
        return str(path) in _private


class SnapshotError(QueryError):
    """No copy of the store could be made; the message says why (usually disk space)."""


def _stat(path: Path) -> tuple[int, int, int]:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return (-1, -1, -1)
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def _copy_prefix(source: Path, target: Path, length: int) -> None:
    """The first ``length`` bytes of ``source`` (a WAL only grows until a checkpoint)."""
    with source.open("rb") as src, target.open("wb") as dst:
        left = length
        while left > 0:
            chunk = src.read(min(COPY_CHUNK, left))
            if not chunk:
                raise SnapshotError(f"{source.name} shrank while it was copied")
            dst.write(chunk)
            left -= len(chunk)


class Snapshots:
    def __init__(
        self,
        db_path: Path,
        hold: Callable[[], AbstractContextManager[None]],
        directory: Path | None = None,
        min_interval_s: float = 0.0,
        wait_s: float = 2.0,
        held_copy_bytes: int = HELD_COPY_BYTES,
        copy_files: Callable[[Path, Path, int], None] | None = None,
    ) -> None:
        """``copy_files(source, target, wal_length)`` replaces the in-process copy (the analysis
        sandbox copies a store file it does not own in a process of its own)."""
        self.db_path = db_path
        self.directory = directory or db_path.with_name(db_path.name + ".analysis")
        self.min_interval_s = min_interval_s
        self.wait_s = wait_s
        self.held_copy_bytes = held_copy_bytes
        self.copies = 0
        self.held_s = 0.0
        """Seconds commits were held by the last copy."""
        self._hold = hold
        self._copy_with = copy_files
        self._lock = threading.Lock()
        self._kept: list[Path] = []
        self._state: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
        self._taken_at = 0.0
        self._last_copy_s = 0.0
        self._refreshing: threading.Event | None = None
        self._error: str | None = None

    def current(self) -> Path:
        """The newest copy: refreshed first when the store changed (waiting at most ``wait_s``)."""
        with self._lock:
            if self._kept and (
                self._state == (_stat(self.db_path), _stat(_wal(self.db_path)))
                or time.monotonic() - self._taken_at < max(self.min_interval_s, 4 * self._last_copy_s)
            ):
                return self._kept[-1]
            if self._refreshing is None:
                self._refreshing = threading.Event()
                threading.Thread(target=self._refresh, args=(self._refreshing,), daemon=True).start()
            refreshing = self._refreshing
        refreshing.wait(None if not self._kept else self.wait_s)
        with self._lock:
            if not self._kept:
                raise SnapshotError(f"cannot copy the store for analysis: {self._error or 'unknown error'}")
            return self._kept[-1]

    def _refresh(self, done: threading.Event) -> None:
        started = time.monotonic()
        try:
            target, state = self._copy()
            with _private_lock:
                _private.add(str(target))
            with self._lock:
                self._kept.append(target)
                self._state = state
                self._last_copy_s = time.monotonic() - started
                while len(self._kept) > 2:
                    _remove(self._kept.pop(0))
                self._error = None
        except (OSError, SnapshotError) as exc:
            log.warning("analysis snapshot failed: %s", exc)
            with self._lock:
                self._error = str(exc)
        finally:
            with self._lock:
                self._refreshing = None
                self._taken_at = time.monotonic()
            done.set()

    def _copy(self) -> tuple[Path, tuple[tuple[int, int, int], tuple[int, int, int]]]:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.copies += 1
        target = self.directory / f"snapshot-{self.copies}.db"
        wal = _wal(self.db_path)
        started = time.perf_counter()
        with self._hold():
            state = (_stat(self.db_path), _stat(wal))
            if state[0][1] < self.held_copy_bytes:
                self._copy_files(target, state[1][1])
                self.held_s = time.perf_counter() - started
                return target, state
        self.held_s = time.perf_counter() - started
        self._copy_files(target, state[1][1])
        if _stat(self.db_path) == state[0]:
            return target, state
        started = time.perf_counter()  # the file changed while it was copied: copy it again, held
        with self._hold():
            state = (_stat(self.db_path), _stat(wal))
            self._copy_files(target, state[1][1])
        self.held_s = time.perf_counter() - started
        return target, state

    def _copy_files(self, target: Path, wal_length: int) -> None:
        target.with_name(target.name + ".pruned").unlink(missing_ok=True)  # a crashed run's marker
        if self._copy_with is not None:
            self._copy_with(self.db_path, target, wal_length)
            return
        shutil.copyfile(self.db_path, target)
        wal_copy = _wal(target)
        if wal_length > 0:
            _copy_prefix(_wal(self.db_path), wal_copy, wal_length)
        else:
            wal_copy.unlink(missing_ok=True)

    def remove_all(self) -> None:
        """Delete every copy (at stop); a worker still reading one keeps its open file."""
        with self._lock:
            for path in self._kept:
                _remove(path)
            self._kept.clear()
            shutil.rmtree(self.directory, ignore_errors=True)


def _remove(path: Path) -> None:
    with _private_lock:
        _private.discard(str(path))
    for file in (path, *(path.with_name(path.name + sidecar) for sidecar in SIDECARS)):
        file.unlink(missing_ok=True)
