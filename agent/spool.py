"""Bounded on-disk spool of encoded OTLP requests, for when Echo cannot be reached.

Each request is one file ``<seq>-<points>.otlp`` holding the exact bytes that would have been sent,
so a replay is byte-identical and Echo's dedup by ``rankecho.event_id`` makes it at-least-once safe.
Files are written to a temporary name and renamed, so a killed agent never leaves half a request.
When the spool passes ``max_bytes`` the oldest requests are deleted and their points counted as
dropped. A lock file keeps two agents from sharing one directory. Usage::

    spool = Spool("/var/lib/rankecho/spool/demo-node-a", max_bytes=256 << 20)
    spool.put(request_bytes, points=120)
    item = spool.oldest()            # SpoolItem | None
    spool.remove(item)               # after Echo acknowledged it
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
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


class Spool:
    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 256 << 20) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.dropped_points = 0
        self._lock = threading.Lock()
        self._lock_fd = os.open(self.dir / "lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise SpoolLocked(
                f"another agent holds the spool {self.dir}; give each agent its own --spool-dir"
            ) from None
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        found = (i for p in self.dir.glob(f"*{SUFFIX}") if (i := _parse(p)))
        self._items = sorted(found, key=lambda i: i.seq)
        self._bytes = sum(i.path.stat().st_size for i in self._items)
        self._next = (self._items[-1].seq + 1) if self._items else 0

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
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
