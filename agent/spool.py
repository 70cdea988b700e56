"""Bounded on-disk spool of encoded OTLP requests, for when Echo cannot be reached.

Each request is one file ``<seq>-<points>.otlp`` holding the exact bytes that would have been sent,
so a replay is byte-identical and Echo's dedup by ``rankecho.event_id`` makes it at-least-once safe.
Files are written to a temporary name and renamed, so a killed agent never leaves half a request.
When the spool passes ``max_bytes`` the oldest requests are deleted and their points counted as
dropped. Usage::

    spool = Spool("/var/lib/rankecho/spool/demo-node-a", max_bytes=256 << 20)  # adopts earlier runs' files
    spool.put(request_bytes, points=120)
    item = spool.oldest()            # SpoolItem | None
    spool.remove(item)               # after Echo acknowledged it
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("rankecho.agent")
SUFFIX = ".otlp"


@dataclass(frozen=True)
class SpoolItem:
    path: Path
    seq: int
    points: int

    def read(self) -> bytes:
        return self.path.read_bytes()


def _parse(path: Path) -> SpoolItem | None:
    stem = path.name[: -len(SUFFIX)]
    seq, _, points = stem.partition("-")
    if not (seq.isdigit() and points.isdigit()):
        return None
    return SpoolItem(path, int(seq), int(points))


class SpoolLocked(RuntimeError):
    pass


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class Spool:
    """Each agent run writes into its own locked sub-directory of ``directory`` and adopts the
    sub-directories of runs that have ended (their lock is free), so a restarted agent neither
    waits for a killed predecessor to finish dying nor loses what it spooled.

    ``adopt=False`` (the agent's default spool, no ``--spool-dir``): this run sends only its own
    requests; what earlier runs left is not replayed into a run (and an Echo) it may not belong to.
    An agent started with ``--spool-dir`` naming ``directory`` adopts it."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 256 << 20,
                 adopt: bool = True) -> None:
        self.root = Path(directory)
        self.adopt = adopt
        self.root.mkdir(parents=True, exist_ok=True)
        self.dir = self.root / f"run-{time.time_ns()}-{os.getpid()}"
        self.dir.mkdir()
        self.max_bytes = max_bytes
        self.dropped_points = 0
        self._lock = threading.Lock()
        fd = _try_lock(self.dir / "lock")
        if fd is None:
            raise SpoolLocked(f"cannot lock {self.dir}: another agent uses it; give each its own --spool-dir")
        self._lock_fd = fd
        self._items: list[SpoolItem] = []
        self._bytes = 0
        self._next = 0
        self.adopt_orphans()

    def adopt_orphans(self) -> int:
        """Move requests of ended runs (unlocked sub-directories, or files left at the top level by
        older layouts) into this run's directory, oldest first; returns how many were adopted.
        Nothing when this spool does not adopt."""
        adopted = 0
        if not self.adopt:
            return 0
        for sub in sorted(p for p in self.root.iterdir() if p.is_dir() and p != self.dir):
            fd = _try_lock(sub / "lock")
            if fd is None:
                continue  # still alive (or still being torn down): try again later
            try:
                found = (i for p in sub.glob(f"*{SUFFIX}") if (i := _parse(p)))
                for item in sorted(found, key=lambda i: i.seq):
                    adopted += self._take(item)
                for leftover in sub.iterdir():
                    leftover.unlink(missing_ok=True)
                sub.rmdir()
            finally:
                os.close(fd)
        return adopted

    def _take(self, item: SpoolItem) -> int:
        with self._lock:
            seq = self._next
            self._next += 1
            path = self.dir / f"{seq:016d}-{item.points}{SUFFIX}"
            os.replace(item.path, path)
            self._items.append(SpoolItem(path, seq, item.points))
            self._bytes += path.stat().st_size
        return 1

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def points(self) -> int:
        with self._lock:
            return sum(i.points for i in self._items)

    def put(self, data: bytes, points: int) -> None:
        """Store one encoded request; evict the oldest while over ``max_bytes``."""
        with self._lock:
            seq = self._next
            self._next += 1
            path = self.dir / f"{seq:016d}-{points}{SUFFIX}"
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            self._items.append(SpoolItem(path, seq, points))
            self._bytes += len(data)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                old = self._items.pop(0)
                self._bytes -= old.path.stat().st_size
                old.path.unlink(missing_ok=True)
                self.dropped_points += old.points
                log.warning("spool over %d bytes: dropped %d oldest points (raise --spool-max-mb)",
                            self.max_bytes, old.points)

    def oldest_age_s(self) -> float:
        """Seconds since the oldest waiting request was written (an adopted one keeps its time); 0
        when empty."""
        item = self.oldest()
        if item is None:
            return 0.0
        try:
            return max(0.0, time.time() - item.path.stat().st_mtime)
        except FileNotFoundError:  # sent meanwhile
            return 0.0

    def oldest(self) -> SpoolItem | None:
        with self._lock:
            return self._items[0] if self._items else None

    def remove(self, item: SpoolItem) -> None:
        with self._lock:
            if item in self._items:
                self._items.remove(item)
                self._bytes -= item.path.stat().st_size
                item.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Release the lock; an empty run directory is removed, a non-empty one awaits adoption."""
        if self._lock_fd < 0:
            return
        if not self._items:
            for leftover in self.dir.iterdir():
                leftover.unlink(missing_ok=True)
            self.dir.rmdir()
        os.close(self._lock_fd)
        self._lock_fd = -1
