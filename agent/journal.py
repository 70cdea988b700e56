"""A per-node journal of the communicators the agent saw being created, so a restarted agent names them
as before.

The communicator id comes from the ``ncclUniqueId`` bytes passed to ``ncclCommInitRank``: an agent that
was not running at that moment (killed and restarted mid-job) cannot compute it, and used to guess a
different id, so its ranks' collectives stopped joining the other ranks' (found: 416 of ~2,500 instances
complete after a kill -9 and restart). Each creation is appended here as one JSON line keyed by the
process (pid and start time: a reused pid never matches) and the communicator handle; the next agent
reads the file and, when that process uses that handle, takes the same id, rank and size. What cannot be
recovered: the collectives issued while no agent ran, so the restarted agent's sequence numbers count
from its attach (``seq_aligned=false``) and the analysis realigns them (echo/queries/layers).

The file lives beside the spool (it survives the agent's container) and is compacted at each start:
entries of processes that have exited are dropped.

Usage::

    journal = CommJournal(Path(spool_dir) / "comms.jsonl", alive=lambda pid: Path(f"/proc/{pid}").exists())
    journal.record((pid, start), handle, comm_id, rank, nranks, primary=True, splits=0)
    journal.lookup((pid, start), handle)     # JournalEntry | None
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("rankecho.agent")
JOURNAL_NAME = "comms.jsonl"


@dataclass(frozen=True)
class JournalEntry:
    pid: int
    started: int
    handle: int
    comm_id: str
    rank: int | None
    nranks: int | None
    primary: bool
    splits: int
    parent_id: str | None = None


class CommJournal:
    """Append-only on disk, a dict in memory; the last line for a (process, handle) wins."""

    def __init__(self, path: Path, alive: Callable[[int], bool]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, int, int], JournalEntry] = {}
        self._load(alive)

    def _load(self, alive: Callable[[int], bool]) -> None:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        except OSError as exc:
            log.warning("cannot read the communicator journal %s (%s): restarted ranks get guessed ids",
                        self.path, exc)  # fmt: skip
            return
        for line in lines:
            try:
                entry = JournalEntry(**json.loads(line))
            except (ValueError, TypeError):
                continue  # a line cut by a kill mid-write
            if alive(entry.pid):
                self._entries[(entry.pid, entry.started, entry.handle)] = entry
        self._rewrite()
        if self._entries:
            log.info("communicator journal: %d communicators of running processes known from before",
                     len(self._entries))  # fmt: skip

    def _rewrite(self) -> None:
        """Keep only the live entries (atomically: a reader sees the old file or the new one)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(asdict(e)) + "\n" for e in self._entries.values()))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot write the communicator journal %s: %s", self.path, exc)

    def record(
        self, key: tuple[int, int], handle: int, comm_id: str, rank: int | None, nranks: int | None,
        primary: bool, splits: int = 0, parent_id: str | None = None,
    ) -> None:  # fmt: skip
        entry = JournalEntry(key[0], key[1], handle, comm_id, rank, nranks, primary, splits, parent_id)
        with self._lock:
            if self._entries.get((key[0], key[1], handle)) == entry:
                return
            self._entries[(key[0], key[1], handle)] = entry
            try:
                with self.path.open("a") as f:
                    f.write(json.dumps(asdict(entry)) + "\n")
            except OSError as exc:
                log.warning("cannot append to the communicator journal %s: %s", self.path, exc)

    def lookup(self, key: tuple[int, int], handle: int) -> JournalEntry | None:
        with self._lock:
            return self._entries.get((key[0], key[1], handle))
