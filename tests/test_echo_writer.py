"""The single writer on its own: merged commits, isolation of a bad request, bounded queue, drain."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from rankecho.echo.ingest.rows import ARROW_SCHEMA
from rankecho.echo.ops import Stats
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.writer import QueueFullError, Writer, WriterClosedError


def table(ids: list[str], metric_name: str | None = "m") -> pa.Table:
    n = len(ids)
    columns = {f.name: [None] * n for f in ARROW_SCHEMA}
    columns.update(event_id=ids, timestamp_ns=[1_800_000_000_000_000_000 + i for i in range(n)],
                   received_ns=[0] * n, signal=["metric"] * n, metric_name=[metric_name] * n)  # fmt: skip
    return pa.table(columns, schema=ARROW_SCHEMA)


@pytest.fixture
def con(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with duckdb.connect(str(tmp_path / "w.db")) as connection:
        migrate(connection)
        yield connection


def count(con: duckdb.DuckDBPyConnection) -> int:
    row = con.cursor().execute("SELECT count(*) FROM events").fetchone()
    return int(row[0]) if row else -1


def test_merged_commit_isolates_a_bad_request(con: duckdb.DuckDBPyConnection) -> None:
    stats = Stats()
    writer = Writer(con.cursor(), stats, queue_rows=1000)
    writer.start()
    with writer.hold():
        good = writer.submit(table(["a", "b"]))
        bad = writer.submit(table(["c"], metric_name=None))  # violates NOT NULL
        also_good = writer.submit(table(["d", "a"]))  # "a" is a duplicate of the first request
    # The merged commit fails on the bad request, so each request is committed on its own and its
    # future carries the rows that request added: both of "a", "b"; only "d" of "d", "a".
    assert good.result(10) == 2 and also_good.result(10) == 1
    with pytest.raises(duckdb.ConstraintException):
        bad.result(10)
    writer.stop()
    assert count(con) == 3
    snapshot = stats.snapshot()
    assert (snapshot.committed, snapshot.duplicates) == (3, 1)


def test_queue_is_bounded_in_rows_and_stop_drains_it(con: duckdb.DuckDBPyConnection) -> None:
    writer = Writer(con.cursor(), Stats(), queue_rows=5)
    writer.start()
    with writer.hold():
        first = writer.submit(table(["a", "b", "c"]))
        with pytest.raises(QueueFullError):
            writer.submit(table(["d", "e", "f"]))
        second = writer.submit(table(["g", "h"]))
        assert writer.queued_rows == 5
        writer.stop(timeout=0)  # asks to stop while held: the queued rows must still be committed
    writer.stop(timeout=10)
    assert first.done() and second.done() and count(con) == 5
    with pytest.raises(WriterClosedError):
        writer.submit(table(["z"]))


def test_an_oversized_request_is_accepted_into_an_empty_queue(con: duckdb.DuckDBPyConnection) -> None:
    writer = Writer(con.cursor(), Stats(), queue_rows=2)
    writer.start()
    assert writer.submit(table([str(i) for i in range(10)])).result(10) == 10
    writer.stop()
