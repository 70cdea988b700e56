"""Retention: roll collectives up per minute, then delete raw rows below a cutoff, oldest first, in chunks.

An always-on Echo would otherwise grow forever. A *pass* picks one cutoff (``--retention`` before Echo's
clock, moved later while the store uses more than ``--max-db-size``), then works in bounded *steps*, each
one short transaction on the writer's connection: first the typed copies by whole minutes (the raw
collectives of those minutes rolled up into ``collective_rollup`` and deleted in the same transaction, so
a collective is always counted once, raw or rolled up, with the ``host_activity`` rows of the same
minutes), then ``events`` in chunks sized to a time budget (echo/store/retention_chunk.py). No statement
touches a row at or after the cutoff, so no acknowledged row younger than it is lost. Then rollups older
than ``--rollup-retention`` go, and a CHECKPOINT turns the deleted row groups into free blocks, which
later rows reuse.

The writer thread runs the steps between its commits (:class:`rankecho.echo.store.writer.Writer`), so
the store keeps one writer and ingest waits at most one step. DuckDB never shrinks the file: what comes
back is space inside it (measured in docs/echo.md, "Retention"), so ``--max-db-size`` is compared with the
bytes of the blocks in use, and the file settles at about its high-water mark.

Usage::

    retention = Retention(con, RetentionPolicy(retention_s=7 * 86_400), db_path, checkpoint)
    retention.run_pass()                     # every step at once (tests, tools)
    while retention.due(): retention.step()  # what the writer does, one step between commits
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from rankecho.echo.queries import RETENTION
from rankecho.echo.settings import Settings
from rankecho.echo.store.retention_chunk import Statements, TableGroup, delete_chunk
from rankecho.echo.store.writer import rollback

log = logging.getLogger(__name__)
NS = 1_000_000_000
MINUTE_NS = 60 * NS
TYPED_DELETES = ("delete_collectives", "delete_host_activity")
"""The typed copies' deletions, after the rollup in the same transaction, each on its own time column."""


@dataclass(frozen=True)
class RetentionPolicy:
    """What to keep, and how the work is cut up. Tuning numbers live here, not in the statements."""

    retention_s: float | None = None
    """Raw rows older than this (seconds before Echo's clock) go; None: no age limit."""
    max_db_bytes: int | None = None
    """Used bytes of the store past which the oldest raw rows go first; None: no size limit."""
    rollup_retention_s: float = 90 * 86_400.0
    every_s: float = 60.0
    """A pass starts this long after the previous one ended (at once while the store is over its size,
    and at start, so limits given to a restarted Echo apply without waiting)."""
    chunk_rows: int = 250_000
    """Most raw rows one step deletes."""
    first_rows: int = 5_000
    """Rows the first step of each table group may delete, before a step has measured the cost per row
    (5,000 rows fit the budget even at the slowest cost measured, a keyed ``events``: ~0.1 s)."""
    step_budget_s: float = 0.25
    """How long one step aims to hold the writer: the rows a step may delete follow the cost per row the
    previous step measured, so a step stays a short transaction at any ingest rate and whatever a row
    costs to delete (under 0.1 us for unkeyed tables, ~20 us for ``events`` with its primary key:
    docs/echo.md, "Retention")."""
    first_span_s: float = 1.0
    """The time span of a pass's first step: small, since a second of a large job is ~20k rows."""
    size_low_water: float = 0.9
    """Over ``max_db_bytes``, delete down to this fraction of it, so the next rows do not trip it again."""

    @classmethod
    def from_settings(cls, settings: Settings) -> RetentionPolicy:
        return cls(settings.retention_s, settings.max_db_bytes, settings.rollup_retention_s,
                   settings.retention_every_s)  # fmt: skip

    @property
    def on(self) -> bool:
        return self.retention_s is not None or self.max_db_bytes is not None


@dataclass
class PassReport:
    """What one pass did; ``raw_cutoff_ns`` None: nothing raw was old enough (or over the size) to go."""

    started_ns: int
    raw_cutoff_ns: int | None
    rollup_cutoff_ns: int
    used_before: int
    used_after: int = 0
    file_bytes: int = 0
    rows_deleted: int = 0
    """Raw rows deleted from the three tables together."""
    rollup_rows_written: int = 0
    rollup_rows_deleted: int = 0
    stacks_deleted: int = 0
    """Rows of ``stacks`` no kept row cites any more, first seen below the raw cutoff."""
    chunks: int = 0
    seconds: float = 0.0
    checkpointed: bool = False


@dataclass
class _Pass:
    report: PassReport
    parts: list[TableGroup]
    started: float
    raw_done: bool = False
    waiters: list[Future[PassReport]] = field(default_factory=list)


class Retention:
    """One pass at a time, one step per :meth:`step`; only the writer thread calls :meth:`step`."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        policy: RetentionPolicy,
        db_path: Path | None,
        checkpoint: Callable[[], bool],
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._con = con
        self._sql = Statements(con)
        self.policy = policy
        self._db_path = db_path
        self._checkpoint = checkpoint
        self._clock_ns = clock_ns
        self._monotonic = monotonic
        self._last_end = monotonic() - policy.every_s  # the first pass is due at once: limits apply at start
        self._again = False
        self._pass: _Pass | None = None
        self._requests: list[Future[PassReport]] = []
        self._lock = threading.Lock()
        self.last: PassReport | None = None
        self.passes = 0
        self.rows_deleted = 0
        """Passes finished and raw rows deleted since this Echo started (``/metrics``)."""

    # -- scheduling ---------------------------------------------------------------------------------
    def record_settings(self) -> None:
        """Write the limits in force into ``retention_state`` (what ``fleet.cluster.summary`` reports)."""
        p = self.policy
        self._sql.run("record_settings", retention_s=p.retention_s, max_db_bytes=p.max_db_bytes,
                      rollup_retention_s=p.rollup_retention_s)  # fmt: skip

    def request(self) -> Future[PassReport]:
        """A pass that starts after this call; the future yields its report (any thread may call)."""
        future: Future[PassReport] = Future()
        with self._lock:
            self._requests.append(future)
        return future

    def due(self) -> bool:
        """A pass is under way, was requested, or its time has come."""
        if self._pass is not None or self._again or self._requests:
            return True
        return self.policy.on and self._monotonic() - self._last_end >= self.policy.every_s

    @property
    def current(self) -> PassReport | None:
        """The report of the pass under way, as far as it got (None between passes)."""
        return self._pass.report if self._pass is not None else None

    def run_pass(self) -> PassReport:
        """Every step of one whole pass that starts now (after the one under way, if any), on the calling
        thread, which must own the connection."""
        requested = self.request()
        while not requested.done():
            self.step()
        return requested.result()

    def step(self) -> bool:
        """One bounded unit of work: begin a pass, delete one chunk, drop old rollups, or checkpoint and
        finish. True while the pass has more to do. A failure ends the pass (logged; retried next time)."""
        try:
            if self._pass is None:
                self._pass = self._begin()
                return True
            current = self._pass
            if not current.raw_done:
                current.raw_done = not self._chunk(current)
                return True
            self._finish(current)
        except Exception as exc:
            failed, self._pass = self._pass, None
            self._last_end = self._monotonic()
            self._again = False
            for waiter in failed.waiters if failed is not None else []:
                waiter.set_exception(exc)
            raise
        return False

    # -- the pass -------------------------------------------------------------------------------------
    def _begin(self) -> _Pass:
        with self._lock:
            waiters, self._requests = self._requests, []
        self._again = False
        try:
            return self._plan(waiters)
        except Exception as exc:
            for waiter in waiters:
                waiter.set_exception(exc)
            raise

    def _plan(self, waiters: list[Future[PassReport]]) -> _Pass:
        """The pass's cutoffs, from the policy, Echo's clock and the bytes in use now."""
        p = self.policy
        now = self._clock_ns()
        used = self._used()[0]
        cutoffs = []
        if p.retention_s is not None:
            cutoffs.append(now - int(p.retention_s * NS))
        if p.max_db_bytes is not None and used > p.max_db_bytes:
            by_size = self._size_cutoff(used, int(p.max_db_bytes * p.size_low_water))
            if by_size is not None:
                cutoffs.append(by_size)
        rollup_cutoff = now - int(p.rollup_retention_s * NS)
        cutoff = max(cutoffs) if cutoffs else None
        first_rows = min(p.first_rows, p.chunk_rows)
        report = PassReport(now, cutoff, rollup_cutoff, used)
        parts = [] if cutoff is None else [
            # typed tables first, by whole minutes: cheap (no index), and the rollups stay one row a minute
            TableGroup("typed_oldest", "typed_count", TYPED_DELETES, cutoff - cutoff % MINUTE_NS,
                       MINUTE_NS, first_rows, MINUTE_NS, True),
            # then events, in chunks of any bound (no rollup to keep whole), sized by the time budget
            TableGroup("events_oldest", "events_count", ("delete_events",), cutoff,
                       int(p.first_span_s * NS), first_rows),
        ]  # fmt: skip
        return _Pass(report, parts, self._monotonic(), waiters=waiters)

    def _size_cutoff(self, used: int, target: int) -> int | None:
        """The time below which the oldest raw rows hold about ``used - target`` bytes, assuming bytes
        spread evenly over the stored time range (the next pass moves on if that was not enough)."""
        oldest, newest = self._sql.one("raw_range")
        if oldest is None or newest is None:
            return None
        share = min(1.0, (used - target) / used)
        return int(oldest) + max(1, int((int(newest) - int(oldest)) * share))

    def _chunk(self, current: _Pass) -> bool:
        """Delete one chunk of the first table group not yet done below its cutoff; False once both are."""
        report, p = current.report, self.policy
        for group in current.parts:
            if not group.done:
                done = delete_chunk(self._sql, group, report.started_ns, p.step_budget_s, p.chunk_rows,
                                    self._monotonic)  # fmt: skip
                group.done = done is None or not done.more
                if done is not None:
                    report.chunks += 1
                    report.rows_deleted += done.deleted
                    report.rollup_rows_written += done.rollup_rows
                return True
        return False

    def _finish(self, current: _Pass) -> None:
        report = current.report
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            report.rollup_rows_deleted = self._sql.count("delete_rollups", cutoff_ns=report.rollup_cutoff_ns)
            if report.raw_cutoff_ns is not None:  # the stacks only the deleted rows cited
                report.stacks_deleted = self._sql.count("delete_stacks", cutoff_ns=report.raw_cutoff_ns)
            con.execute("COMMIT")
        except Exception:
            rollback(con)
            raise
        if report.rows_deleted or report.rollup_rows_deleted:
            report.checkpointed = self._checkpoint()  # deleted row groups become free blocks
        report.used_after, report.file_bytes = self._used()
        report.seconds = self._monotonic() - current.started
        self._sql.run(
            "record_pass", raw_cutoff_ns=report.raw_cutoff_ns, rollup_cutoff_ns=report.rollup_cutoff_ns,
            now_ns=self._clock_ns(), seconds=report.seconds, rows_deleted=report.rows_deleted,
            bytes_freed=report.used_before - report.used_after, used_bytes=report.used_after,
            rollup_rows_deleted=report.rollup_rows_deleted,
        )  # fmt: skip
        limit = self.policy.max_db_bytes
        over = limit is not None and report.used_after > limit
        self._again = over and report.rows_deleted > 0 and report.checkpointed  # keep going while it helps
        if over and not self._again:
            log.warning("the store uses %d MiB, over --max-db-size (%d MiB), and retention freed nothing "
                        "more: rollups and indexes fill it; raise the limit or shorten --rollup-retention",
                        report.used_after >> 20, (limit or 0) >> 20)  # fmt: skip
        if report.rows_deleted or report.rollup_rows_deleted:
            log.info("retention: %d raw rows below %s deleted (%d rollup rows written, %d old ones deleted) "
                     "in %d chunks, %.2f s; used %d -> %d MiB, file %d MiB", report.rows_deleted,
                     report.raw_cutoff_ns, report.rollup_rows_written, report.rollup_rows_deleted,
                     report.chunks, report.seconds, report.used_before >> 20, report.used_after >> 20,
                     report.file_bytes >> 20)  # fmt: skip
        self.last = report
        self.passes += 1
        self.rows_deleted += report.rows_deleted
        self._pass = None
        self._last_end = self._monotonic()
        for waiter in current.waiters:
            waiter.set_result(report)

    def metrics(self) -> str:
        """Prometheus text for ``/metrics``: passes, rows deleted, and the last pass's cutoff, duration
        and bytes in use (absent until a pass ended)."""
        lines = [
            "# HELP rankecho_echo_retention_passes_total Retention passes finished since Echo started.",
            "# TYPE rankecho_echo_retention_passes_total counter",
            f"rankecho_echo_retention_passes_total {self.passes}",
            "# HELP rankecho_echo_retention_rows_deleted_total Raw rows deleted since Echo started.",
            "# TYPE rankecho_echo_retention_rows_deleted_total counter",
            f"rankecho_echo_retention_rows_deleted_total {self.rows_deleted}",
        ]
        last = self.last
        if last is not None:
            gauges = [
                ("last_pass_seconds", "Writer time the last retention pass took, checkpoint included.",
                 last.seconds),
                ("used_bytes", "Bytes of the store's blocks in use (+ write-ahead log) after the last pass.",
                 last.used_after),
                ("raw_cutoff_seconds", "Raw rows older than this (Unix s) were deleted by the last pass.",
                 None if last.raw_cutoff_ns is None else last.raw_cutoff_ns / NS),
            ]  # fmt: skip
            for name, text, value in gauges:
                if value is not None:
                    full = f"rankecho_echo_retention_{name}"
                    lines += [f"# HELP {full} {text}", f"# TYPE {full} gauge", f"{full} {value:g}"]
        return "\n".join(lines) + "\n"

    # -- statements -------------------------------------------------------------------------------------
    def _used(self) -> tuple[int, int]:
        """(bytes of blocks in use + the write-ahead log, file bytes)."""
        found = self._con.execute(RETENTION["used_bytes"].sql).fetchall()
        used, file_bytes = (int(found[0][0]), int(found[0][1])) if found else (0, 0)
        if self._db_path is not None:
            wal = self._db_path.with_name(self._db_path.name + ".wal")
            used += wal.stat().st_size if wal.exists() else 0
        return used, file_bytes
