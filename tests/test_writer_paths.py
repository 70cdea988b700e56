"""The single writer's paths that only faults and time reach, each checked exactly: rows acknowledged,
duplicates, batching and queue limits, what a failed commit reports (type, message, log, readiness),
rollback, fatal errors, checkpoints and probes at idle, holds (issue 13: the writer's mutants).

Fast and direct on purpose: ``scripts/mutation.py writer`` runs this file first for every mutant of
``echo/store/writer.py``. A real DuckDB in a tmp dir; disk faults on a real full tmpfs (conftest.py's
``small_disk``, root only). The only test hooks are spies that count or pause the real calls.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import rankecho.echo.store.writer as writer_module
from rankecho.echo.ops import Stats
from rankecho.echo.settings import Settings
from rankecho.echo.store.condition import FIXES, checkpoint_room
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.staging import STAGED, stage
from rankecho.echo.store.writer import (
    QueueFullError,
    StoreError,
    Writer,
    WriterClosedError,
    rollback,
)
from tests.echo_helpers import disk_filled, wait_until
from tests.test_echo_writer import count, table

COLLECTIVE = "rankecho.nccl.collective"
"""Rows of this metric are also copied into ``collectives`` (staging), in the same transaction."""


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "w.db"


@pytest.fixture
def con(db: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with duckdb.connect(str(db)) as connection:
        migrate(connection)
        yield connection


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def nulls(n: int) -> pa.Table:
    """Rows only for the queue's arithmetic (never committed)."""
    return pa.table({"x": pa.nulls(n)})


def started(con: duckdb.DuckDBPyConnection, stats: Stats | None = None, **kw: object) -> Writer:
    writer = Writer(con.cursor(), stats or Stats(), **{"queue_rows": 100_000, **kw})  # type: ignore[arg-type]
    writer.start()
    return writer


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == writer_module.__name__]


def hold_entered(writer: Writer) -> threading.Event:
    """Enter ``writer.hold()`` in a thread; the event is set once the hold was granted."""
    entered = threading.Event()

    def hold() -> None:
        with writer.hold():
            entered.set()

    threading.Thread(target=hold, daemon=True).start()
    return entered


def collectives(con: duckdb.DuckDBPyConnection) -> list[tuple[object, ...]]:
    return con.cursor().execute("SELECT count(*), count(DISTINCT event_id) FROM collectives").fetchall()


def test_the_writers_defaults_are_echos_settings(db: Path) -> None:
    """The writer used alone (tests, tools) batches, retries and checkpoints like Echo does. Checked by
    behaviour, not by signature: mutmut's trampolines keep the original signature."""
    defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    writer = Writer(duckdb.connect(), Stats(), queue_rows=1, db_path=db)
    writer.submit(nulls(1))
    with pytest.raises(QueueFullError) as full:
        writer.submit(nulls(1))
    assert full.value.retry_after_s == defaults["retry_after_s"] == 1.0
    every = defaults["checkpoint_every_s"]
    writer._last_checkpoint = time.monotonic() - every
    assert writer._idle_work_due()  # the interval has passed
    writer._last_checkpoint = time.monotonic() - every + 1
    assert not writer._idle_work_due()
    batch = defaults["batch_rows"]
    merging = Writer(duckdb.connect(), Stats(), queue_rows=2 * batch)
    for n in (batch // 2, batch - batch // 2, 1):
        merging.submit(nulls(n))
    taken = merging._take()
    assert taken is not None and sum(p.table.num_rows for p in taken) == batch


def test_take_merges_queued_requests_up_to_batch_rows() -> None:
    writer = Writer(duckdb.connect(), Stats(), queue_rows=100, batch_rows=5)
    assert writer.submit(nulls(0)).result(0) == 0  # nothing to store: answered at once, never queued
    for n in (3, 2, 4, 1, 1, 1, 1):
        writer.submit(nulls(n))
    assert writer.queued_rows == 13

    def take() -> list[int]:
        taken = writer._take()
        assert taken is not None
        return [p.table.num_rows for p in taken]

    assert take() == [3, 2] and writer.queued_rows == 8  # exactly batch_rows: merged
    assert take() == [4, 1] and writer.queued_rows == 3
    assert take() == [1, 1, 1] and writer.queued_rows == 0


def test_the_queue_limit_and_the_retry_it_names() -> None:
    writer = Writer(duckdb.connect(), Stats(), queue_rows=5, retry_after_s=2.5)
    writer.submit(nulls(3))
    writer.submit(nulls(2))  # exactly full is accepted
    assert writer.queued_rows == 5
    with pytest.raises(QueueFullError) as full:
        writer.submit(nulls(1))
    assert full.value.retry_after_s == 2.5
    assert str(full.value) == "Echo's write queue is full: retry in 2.5 s"
    assert writer.queued_rows == 5


def test_flags_thread_hold_and_stop(con: duckdb.DuckDBPyConnection) -> None:
    writer = Writer(con.cursor(), Stats(), queue_rows=10)
    assert not writer.running and not writer.healthy
    writer.start()
    time.sleep(0.1)  # idle, nothing queued: still running
    assert writer.running and writer.healthy
    assert writer._thread.name == "echo-writer" and writer._thread.daemon  # never keeps a process alive
    with writer.hold():
        held = writer.submit(table(["a"]))
        time.sleep(0.2)
        assert not held.done() and writer.queued_rows == 1  # no commit while held
    assert held.result(10) == 1 and writer.queued_rows == 0
    assert writer.submit(table(["b"])).result(10) == 1
    t0 = time.monotonic()
    writer.stop(timeout=5)
    assert time.monotonic() - t0 < 2 and not writer._thread.is_alive()
    assert not writer.running and not writer.healthy
    with pytest.raises(WriterClosedError) as closed:
        writer.submit(table(["c"]))
    assert str(closed.value) == "Echo is shutting down: retry against the restarted Echo"
    assert count(con) == 2


def test_acknowledged_counts_are_the_rows_new_to_the_store(con: duckdb.DuckDBPyConnection) -> None:
    stats = Stats()
    writer = started(con, stats)
    assert writer.submit(table(ids("a", 3), COLLECTIVE)).result(10) == 3
    resend = ["a2", "d", "a0"]
    assert writer.submit(table(resend, COLLECTIVE)).result(10) == 1  # only "d" is new
    assert writer.submit(table(["e", "f"], COLLECTIVE)).result(10) == 2  # after a resend: ON CONFLICT first
    assert writer.submit(table(["e", "f"], COLLECTIVE)).result(10) == 0  # all resent
    writer.stop(timeout=5)
    for name in ("incoming", writer_module.STAGED):  # no batch stays registered (held in memory)
        with pytest.raises(duckdb.CatalogException):
            writer._con.execute(f"SELECT count(*) FROM {name}")
    assert count(con) == 6
    assert collectives(con) == [(6, 6)]  # the typed copies hold each event once, resends included
    snap = stats.snapshot()
    assert (snap.committed, snap.duplicates) == (6, 4)
    assert snap.commit_seconds.n == 4 and 0 < snap.commit_seconds.total < 30
    assert (snap.batch_rows.n, snap.batch_rows.total) == (4, 10)


def test_a_bad_request_fails_alone_with_the_rows_error(
    con: duckdb.DuckDBPyConnection, caplog: pytest.LogCaptureFixture
) -> None:
    writer = started(con)
    with writer.hold():
        good = writer.submit(table(["a", "b"]))
        bad = writer.submit(table(["c"], metric_name=None))  # violates NOT NULL: merged, then isolated
    assert good.result(10) == 2
    with pytest.raises(duckdb.ConstraintException):
        bad.result(10)
    assert f"commit failed for a request of 1 rows: {bad.exception()}" in messages(caplog)
    with pytest.raises(duckdb.ConstraintException):  # alone in its commit: fails at once, no retry loop
        writer.submit(table(["c"], metric_name=None)).result(10)
    with writer.hold():  # a merged commit acknowledges each request with the commit's new rows
        first = writer.submit(table(["d"]))
        second = writer.submit(table(["e", "f"]))
    assert (first.result(10), second.result(10)) == (3, 3)
    assert writer.healthy and writer.condition.failures == 0  # the rows' fault, not the store's
    writer.stop(timeout=5)
    assert count(con) == 5


def test_rollback_undoes_and_keeps_a_failed_commits_cause(
    con: duckdb.DuckDBPyConnection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=writer_module.__name__)
    rows = table(["a"])
    con.register(STAGED, rows)
    con.execute("BEGIN TRANSACTION")
    stage(con)
    rollback(con)
    assert count(con) == 0
    con.execute("BEGIN TRANSACTION")  # the transaction ended: a new one starts
    con.execute("COMMIT")
    rollback(con)  # after a COMMIT there is nothing to roll back: logged at debug, nothing raised
    (logged,) = messages(caplog)
    assert logged.startswith("ROLLBACK after a failed statement: ") and "no transaction is active" in logged


def test_hold_waits_for_the_commit_in_progress(con: duckdb.DuckDBPyConnection) -> None:
    class GatedStats(Stats):
        """Pauses the writer at the end of its commit (before the acknowledgement)."""

        def __init__(self) -> None:
            super().__init__()
            self.inside, self.gate = threading.Event(), threading.Event()

        def committed(self, rows: int, inserted: int, seconds: float) -> None:
            self.inside.set()
            self.gate.wait(10)
            super().committed(rows, inserted, seconds)

    stats = GatedStats()
    writer = started(con, stats)
    done = writer.submit(table(["a"]))
    assert stats.inside.wait(5)
    entered = hold_entered(writer)
    assert not entered.wait(0.3)
    t0 = time.monotonic()
    writer.stop(timeout=0.2)  # gives up waiting after its timeout
    assert time.monotonic() - t0 < 2 and not done.done()
    stats.gate.set()
    assert done.result(10) == 1 and entered.wait(5)


def test_no_checkpoint_before_the_interval(
    con: duckdb.DuckDBPyConnection, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Writer(con.cursor(), Stats(), queue_rows=100, db_path=db)  # every 60 s, like Echo
    calls: list[bool] = []
    real = writer.checkpoint
    monkeypatch.setattr(writer, "checkpoint", lambda: calls.append(real()) or calls[-1])
    writer.start()
    assert writer.submit(table(["a"])).result(10) == 1
    time.sleep(0.3)
    wal = db.with_name(db.name + ".wal")
    assert calls == [] and wal.stat().st_size > 0 and writer.running
    writer.stop(timeout=5)
    assert writer.checkpoint() is True and not wal.exists()  # folded on demand


def test_idle_checkpoint_after_the_interval_only_when_the_log_holds_something(
    con: duckdb.DuckDBPyConnection, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Writer(con.cursor(), Stats(), queue_rows=100, db_path=db, checkpoint_every_s=0.2)
    calls: list[bool] = []
    real = writer.checkpoint
    monkeypatch.setattr(writer, "checkpoint", lambda: calls.append(real()) or calls[-1])
    writer.start()
    assert writer.submit(table(["a"])).result(10) == 1
    wal = db.with_name(db.name + ".wal")
    wait_until(lambda: not wal.exists(), "an idle checkpoint", timeout_s=5)
    time.sleep(writer_module.PROBE_EVERY_S + 0.3)  # the idle thread wakes again, finds no log: no work
    assert calls == [True] and writer.running
    assert hold_entered(writer).wait(2)  # idle work done: a hold is granted
    assert writer.submit(table(["b"])).result(10) == 1
    writer.stop(timeout=5)
    assert count(con) == 2


def test_hold_waits_for_an_idle_checkpoint(
    con: duckdb.DuckDBPyConnection, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = Writer(con.cursor(), Stats(), queue_rows=100, db_path=db, checkpoint_every_s=0.1)
    inside, gate = threading.Event(), threading.Event()
    real = writer.checkpoint

    def gated() -> bool:
        inside.set()
        gate.wait(10)
        return real()

    monkeypatch.setattr(writer, "checkpoint", gated)
    writer.start()
    assert writer.submit(table(["a"])).result(10) == 1
    assert inside.wait(5)
    entered = hold_entered(writer)
    assert not entered.wait(0.3)  # e.g. a snapshot copy must not see the file mid-checkpoint
    gate.set()
    assert entered.wait(5)
    writer.stop(timeout=5)


def test_an_in_memory_writer_idles_without_checkpoints() -> None:
    with duckdb.connect() as memory:
        migrate(memory)
        writer = started(memory, checkpoint_every_s=0.05)
        assert writer.submit(table(["a"])).result(10) == 1
        time.sleep(writer_module.PROBE_EVERY_S + 0.3)  # idle past the interval: nothing to fold in memory
        assert writer.running
        assert writer.submit(table(["b"])).result(10) == 1
        writer.stop(timeout=5)
        assert writer.checkpoint() is False


def test_a_probe_that_writes_makes_the_store_ready_again(
    con: duckdb.DuckDBPyConnection, db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = Writer(con.cursor(), Stats(), queue_rows=100, db_path=db)
    writer.condition.failed("disk full: test")  # what a failed commit records
    writer.start()
    wait_until(lambda: writer.healthy, "a successful probe", timeout_s=5)
    assert "the store's volume takes writes again: ready, waiting for the next commit" in messages(caplog)
    writer.stop(timeout=5)


def test_a_failing_probe_keeps_the_store_unready_and_runs_once_a_second(
    con: duckdb.DuckDBPyConnection, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (db.parent / f".rankecho-probe-{os.getpid()}").mkdir()  # the probe's file cannot be created
    probes: list[str | None] = []
    real = writer_module.probe_write
    monkeypatch.setattr(writer_module, "probe_write", lambda d: probes.append(real(d)) or probes[-1])
    writer = Writer(con.cursor(), Stats(), queue_rows=100, db_path=db)
    writer.condition.failed("disk full: test")
    writer.start()
    time.sleep(1.5)
    assert 1 <= len(probes) <= 3 and None not in probes, probes  # PROBE_EVERY_S apart, not in a loop
    assert writer.running and not writer.healthy and writer.condition.reason == "disk full: test"
    writer.stop(timeout=5)


OnDisk = tuple[duckdb.DuckDBPyConnection, Writer, Path]
"""The store's connection, its started writer and the store file (on the ``small_disk`` tmpfs)."""


@pytest.fixture
def on_disk(small_disk: Path) -> Iterator[OnDisk]:
    """A writer on the small tmpfs, 2000 rows committed (in the write-ahead log), no idle checkpoints."""
    db = small_disk / "w.db"
    with duckdb.connect(str(db)) as con:
        migrate(con)
        writer = started(con, db_path=db, checkpoint_every_s=3600)
        assert writer.submit(table(ids("a", 2000))).result(10) == 2000
        yield con, writer, db
        writer.stop(timeout=5)


def test_a_full_disk_fails_commits_with_the_cause_then_recovers(
    small_disk: Path, on_disk: OnDisk, caplog: pytest.LogCaptureFixture
) -> None:
    con, writer, _ = on_disk
    with disk_filled(small_disk) as filler:
        with writer.hold():
            merged = [writer.submit(table(ids("b", 1000))), writer.submit(table(ids("c", 1000)))]
        for future in merged:
            with pytest.raises(StoreError) as failed:
                future.result(10)
            reason = str(failed.value)
            assert reason.startswith("disk full: ") and "no transaction is active" not in reason
            assert isinstance(failed.value.__cause__, duckdb.Error)
        assert writer.condition.failures == 1  # one merged commit, not isolated: the store's fault
        assert writer.condition.reason == reason and writer.running and not writer.healthy
        loud = (f"the store cannot commit: {reason} (fix: {FIXES['disk full']}); producers are told to "
                "retry and /readyz answers 503 until a commit succeeds")  # fmt: skip
        assert loud in messages(caplog)  # once, at the start of the run of failures
        with pytest.raises(StoreError):
            writer.submit(table(ids("d", 500))).result(10)
        assert any(m.startswith("commit of 500 rows failed: disk full: ") for m in messages(caplog))
        assert writer.condition.failures == 2
        with writer.hold():  # no probe in between: the commit itself ends the run of failures
            filler.unlink()
            again = writer.submit(table(ids("d", 500)))
        assert again.result(10) == 500  # rolled back cleanly: the next commit works
    assert writer.healthy and "commits succeed again" in messages(caplog)
    writer.stop(timeout=5)
    assert count(con) == 2500


def test_a_fatal_error_in_a_commit_stops_the_writer(small_disk: Path, on_disk: OnDisk) -> None:
    con, writer, _ = on_disk
    with disk_filled(small_disk), pytest.raises(duckdb.FatalException):
        con.cursor().execute("CHECKPOINT")  # past the writer's room check: DuckDB invalidates the store
    with pytest.raises(StoreError) as failed:
        writer.submit(table(["b"])).result(10)
    assert str(failed.value).startswith("disk full: ")
    assert isinstance(failed.value.__cause__, duckdb.FatalException)
    assert writer.failed is failed.value.__cause__ and not writer.running and not writer.healthy
    with pytest.raises(WriterClosedError) as closed:
        writer.submit(table(["c"]))
    assert str(closed.value) == f"the store failed ({writer.failed}): restart Echo, then retry"


def test_a_fatal_error_in_a_checkpoint_is_logged_and_stops_the_writer(
    small_disk: Path, on_disk: OnDisk, caplog: pytest.LogCaptureFixture
) -> None:
    con, writer, _ = on_disk
    writer.stop(timeout=5)
    with disk_filled(small_disk), pytest.raises(duckdb.FatalException):
        con.cursor().execute("CHECKPOINT")
    assert writer.checkpoint() is False  # room again, but the store stays invalid until a restart
    assert isinstance(writer.failed, duckdb.FatalException)
    (logged,) = [m for m in messages(caplog) if m.startswith("checkpoint failed: ")]
    assert logged.startswith("checkpoint failed: disk full: FATAL Error: ")
    assert logged.endswith(f" (fix: {FIXES['disk full']})")


def test_a_checkpoint_without_room_is_skipped_and_says_why(
    small_disk: Path, on_disk: OnDisk, caplog: pytest.LogCaptureFixture
) -> None:
    _, writer, db = on_disk
    writer.stop(timeout=5)
    wal = db.with_name(db.name + ".wal")
    size = wal.stat().st_size
    with disk_filled(small_disk) as filler:
        os.truncate(filler, filler.stat().st_size - (3 << 20))  # 3 MiB free: under the reserve
        room = checkpoint_room(db)
        assert not room.enough and room.free_bytes >= 2 << 20
        assert writer.checkpoint() is False
        assert wal.stat().st_size == size
    assert (f"checkpoint skipped: {room.free_bytes >> 20} MiB free on the store's volume, "
            f"{room.need_bytes >> 20} MiB needed; the write-ahead log stays and replays at the next "
            "start (free space on the volume)") in messages(caplog)  # fmt: skip
    assert writer.checkpoint() is True and not wal.exists()
