"""The single writer: the only code that writes the store (the typed tables and ``events_generic``).

Receivers decode a request into an Arrow table (the ``events`` columns) and :meth:`Writer.submit` it;
they get a future that resolves only after the rows are COMMITted (acknowledged = durable). The writer
thread merges queued batches into commits of up to ``batch_rows`` rows. An event whose id is already
stored is skipped (:func:`rankecho.echo.store.resend.fresh_events`), so resends are no-ops (counted as
duplicates skipped); the rest is stored by :func:`rankecho.echo.store.staging.stage`. The queue is
bounded in rows: :class:`QueueFullError` tells the receiver to answer "retry later" instead of growing
memory.

Usage::

    writer = Writer(cursor, stats, queue_rows=500_000)
    writer.start()
    writer.submit(table).result()   # returns once committed
    writer.stop()                   # drains and commits everything queued

A commit that fails for the store's sake (disk full, permissions, a damaged file) fails its request
with :class:`StoreError`, whose message names the cause (:mod:`echo.store.condition`); the writer keeps
running, marks the store unhealthy until a commit (or, when idle, a probe write) succeeds, and
checkpoints the write-ahead log every ``checkpoint_every_s`` when idle, so the log that a restart
replays stays small.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from rankecho.echo.ops import Stats
from rankecho.echo.store.condition import (
    StoreCondition,
    cause_of,
    checkpoint_room,
    fix_for,
    probe_write,
    store_caused,
)
from rankecho.echo.store.resend import fresh_events
from rankecho.echo.store.staging import STAGED, stage
from rankecho.echo.store.typed_events import REST_COLUMN

if TYPE_CHECKING:
    from rankecho.echo.store.retention import PassReport, Retention, RetentionPolicy

log = logging.getLogger(__name__)
PROBE_EVERY_S = 1.0
"""While commits fail and nothing is queued, how often the writer probes whether the disk takes writes."""
DATA_ERRORS = (duckdb.ConstraintException, duckdb.ConversionException, duckdb.InvalidInputException)
"""Commit failures caused by the rows themselves (the writer isolates them to one request)."""


class QueueFullError(RuntimeError):
    """The queue holds ``queue_rows`` rows already; retry after ``retry_after_s``."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"Echo's write queue is full: retry in {retry_after_s:g} s")
        self.retry_after_s = retry_after_s


class StoreError(RuntimeError):
    """The store could not commit for its own sake (not the rows'): the message leads with the cause
    (``disk full: ...``); a resend may succeed once the cause is fixed."""


class WriterClosedError(RuntimeError):
    """Echo is shutting down and accepts no new rows; the producer should retry (another Echo)."""


@dataclass
class _Pending:
    table: pa.Table
    future: Future[int]


class Writer:
    """Owns one DuckDB connection for writing; one daemon thread, started by :meth:`start`."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        stats: Stats,
        queue_rows: int,
        batch_rows: int = 50_000,
        retry_after_s: float = 1.0,
        db_path: Path | None = None,
        checkpoint_every_s: float = 60.0,
    ) -> None:
        self._con = con
        self._db_path = db_path
        """The store file (None: in memory), for probes and checkpoint room; see :mod:`condition`."""
        self._checkpoint_every_s = checkpoint_every_s
        self._last_checkpoint = time.monotonic()
        self._last_probe = 0.0
        self.condition = StoreCondition()
        self._stats = stats
        self._max_rows = queue_rows
        self._batch_rows = batch_rows
        self._retry_after_s = retry_after_s
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._cond = threading.Condition()
        self._closing = False
        self._held = False
        self._busy = False
        self.failed: BaseException | None = None
        """Set when DuckDB reported a fatal error: nothing more can be committed until a restart."""
        self.retention: Retention | None = None
        """Set by :meth:`use_retention`: its steps run between commits."""
        self._stepped = False
        self._thread = threading.Thread(target=self._run, name="echo-writer", daemon=True)

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._closing and self.failed is None

    @property
    def healthy(self) -> bool:
        """Running and the last commit (or probe) succeeded: what ``/readyz`` reports."""
        return self.running and self.condition.reason is None

    def start(self) -> None:
        self._thread.start()

    def submit(self, table: pa.Table) -> Future[int]:
        """Queue rows (an Arrow table in the ``events`` column order, built by the receiver thread so
        the writer spends its time in DuckDB); the future yields the rows newly stored by the commit
        that included them."""
        future: Future[int] = Future()
        n = table.num_rows
        if n == 0:
            future.set_result(0)
            return future
        with self._cond:
            if self._closing:
                raise WriterClosedError("Echo is shutting down: retry against the restarted Echo")
            if self.failed is not None:
                raise WriterClosedError(f"the store failed ({self.failed}): restart Echo, then retry")
            if self._queued_rows and self._queued_rows + n > self._max_rows:
                raise QueueFullError(self._retry_after_s)
            self._queue.append(_Pending(table, future))
            self._queued_rows += n
            self._cond.notify()
        return future

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new rows, commit everything already queued, then end the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """No commits while the block runs (after the one in progress ends), e.g. to copy the store
        file; receivers keep queueing until the queue is full. :meth:`stop` ends a hold."""
        with self._cond:
            self._held = True
            while self._busy:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()

    def _take(self) -> list[_Pending] | None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()
            while True:
                if self._closing and not self._queue:
                    return None
                if not self._held and not self._closing and not self._queue_waits() and self._retention_due():
                    self._unlocked(self._retention_step)  # one bounded step between commits
                    self._stepped = True
                    continue
                if self._queue and (not self._held or self._closing):
                    break
                if not self._held and self._idle_work_due():
                    self._unlocked(self._idle_work)
                    continue
                self._cond.wait(timeout=PROBE_EVERY_S)
            self._busy = True
            self._stepped = False
            taken = [self._queue.popleft()]
            rows = taken[0].table.num_rows
            while self._queue and rows + self._queue[0].table.num_rows <= self._batch_rows:
                item = self._queue.popleft()
                taken.append(item)
                rows += item.table.num_rows
            self._queued_rows -= rows
            return taken

    def _queue_waits(self) -> bool:
        """A retention step ran last and rows are queued: commit them before the next step."""
        return self._stepped and bool(self._queue)

    def _unlocked(self, work: Callable[[], None]) -> None:
        """Run ``work`` with the queue's lock released (DuckDB and the disk are slow) but marked busy, so
        a :meth:`hold` waits for it as for a commit. Called with the lock held."""
        self._busy = True
        self._cond.release()
        try:
            work()
        finally:
            self._cond.acquire()
            self._busy = False
            self._cond.notify_all()

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            self._commit_all(taken)

    def use_retention(self, policy: RetentionPolicy, clock_ns: Callable[[], int] = time.time_ns) -> Retention:
        """Run retention passes on this writer's thread and connection, one step between commits (before
        :meth:`start`); records the policy in ``retention_state``."""
        from rankecho.echo.store.retention import Retention  # retention imports this module

        self.retention = Retention(self._con, policy, self._db_path, self.checkpoint, clock_ns)
        self.retention.record_settings()
        return self.retention

    def retention_pass(self) -> Future[PassReport]:
        """Ask for a retention pass that starts after this call; the future yields its report."""
        if self.retention is None:
            raise RuntimeError("retention is off: call use_retention() first")
        future = self.retention.request()
        with self._cond:
            self._cond.notify_all()
        return future

    def _retention_due(self) -> bool:
        if self.retention is None or self.failed is not None or self.condition.reason is not None:
            return False
        return self.retention.due()

    def _retention_step(self) -> None:
        assert self.retention is not None
        try:
            self.retention.step()
        except Exception as exc:
            log.error("retention pass failed, retried at the next one: %s (fix: %s)", cause_of(exc),
                      fix_for(cause_of(exc)))  # fmt: skip
            if isinstance(exc, duckdb.FatalException):
                self.failed = exc

    def _idle_work_due(self) -> bool:
        now = time.monotonic()
        if self._db_path is None or self.failed is not None:
            return False
        if self.condition.reason is not None:
            return now - self._last_probe >= PROBE_EVERY_S
        return now - self._last_checkpoint >= self._checkpoint_every_s

    def _idle_work(self) -> None:
        """Nothing queued: probe a failing store, or checkpoint a healthy one."""
        assert self._db_path is not None
        if self.condition.reason is not None:
            self._last_probe = time.monotonic()
            if probe_write(self._db_path.parent) is None and self.condition.ok():
                log.warning("the store's volume takes writes again: ready, waiting for the next commit")
            return
        self._last_checkpoint = time.monotonic()
        wal = self._db_path.with_name(self._db_path.name + ".wal")
        if wal.exists() and wal.stat().st_size > 0:  # nothing committed since the last one: no work
            self.checkpoint()

    def checkpoint(self) -> bool:
        """Fold the write-ahead log into the file when there is room (the writer thread, or after
        :meth:`stop`); True when done. Without room it is skipped: the log replays at the next start."""
        if self._db_path is None:
            return False
        room = checkpoint_room(self._db_path)
        if not room.enough:
            log.warning("checkpoint skipped: %d MiB free on the store's volume, %d MiB needed; the "
                        "write-ahead log stays and replays at the next start (free space on the volume)",
                        room.free_bytes >> 20, room.need_bytes >> 20)  # fmt: skip
            return False
        try:
            self._con.execute("CHECKPOINT")
        except Exception as exc:
            log.error("checkpoint failed: %s (fix: %s)", cause_of(exc), fix_for(cause_of(exc)))
            if isinstance(exc, duckdb.FatalException):
                self.failed = exc
            return False
        return True

    def _commit_all(self, taken: list[_Pending]) -> None:
        try:
            inserted = self._commit([p.table for p in taken])
        except Exception as exc:
            if len(taken) > 1 and not store_caused(exc):  # isolate the bad request
                for pending in taken:
                    self._commit_all([pending])
                return
            self._failed_commit(taken, exc)
            return
        if self.condition.ok():
            log.warning("commits succeed again")
        for pending in taken:
            pending.future.set_result(inserted)

    def _failed_commit(self, taken: list[_Pending], exc: Exception) -> None:
        rows = sum(p.table.num_rows for p in taken)
        if isinstance(exc, DATA_ERRORS):
            log.error("commit failed for a request of %d rows: %s", rows, exc)
            error: Exception = exc
        else:
            reason = cause_of(exc)
            if self.condition.failed(reason):
                log.error("the store cannot commit: %s (fix: %s); producers are told to retry and "
                          "/readyz answers 503 until a commit succeeds", reason, fix_for(reason))  # fmt: skip
            else:
                log.error("commit of %d rows failed: %s", rows, reason)
            error = StoreError(reason)
            error.__cause__ = exc
        if isinstance(exc, duckdb.FatalException):
            self.failed = exc  # the database is invalidated: stop being ready, keep refusing
        for pending in taken:
            pending.future.set_exception(error)

    def _commit(self, tables: list[pa.Table]) -> int:
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        started = time.perf_counter()
        inserted = self._insert(table)
        self._stats.committed(table.num_rows, inserted, time.perf_counter() - started)
        return inserted

    def _insert(self, table: pa.Table) -> int:
        """One transaction: the events new to the store (:func:`fresh_events`), stored by :func:`stage`
        (typed rows, generic rows), so an acknowledged event is stored whole and a resend nowhere twice."""
        con = self._con
        con.execute("BEGIN TRANSACTION")
        staged = False
        try:
            new = fresh_events(con, table)
            if new.num_rows:
                con.register(STAGED, new)
                staged = True
                metrics = frozenset(pc.unique(new["metric_name"]).to_pylist())
                stage(con, metrics, with_rest=REST_COLUMN in new.schema.names)
            con.execute("COMMIT")
        except Exception:
            rollback(con)  # first: a failed transaction refuses even unregistering
            raise
        finally:
            if staged:
                con.unregister(STAGED)
        return new.num_rows


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Undo a failed transaction without hiding why it failed: a COMMIT that failed has already ended
    the transaction, so DuckDB's "no transaction is active" from ROLLBACK would replace the real
    cause (e.g. "No space left on device")."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error as exc:
        log.debug("ROLLBACK after a failed statement: %s", exc)
