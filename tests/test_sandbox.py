"""The analysis sandbox (echo/sandbox): callers' SQL in worker processes with hard limits.

Real worker processes and a real store: a query that grows past the memory cap is stopped and its worker
replaced, one that runs past the deadline is stopped, the row and byte caps cut the stream in the
worker, errors never name the store's file, queries beyond the worker count wait, and on a running Echo
the workers read a snapshot that follows ingest.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from conftest import local_settings
from echo_helpers import TEST_TOKEN, grpc_export, node_request
from guard_corpus.corpus import build_store

from rankecho.echo.app import Echo
from rankecho.echo.guard import Refused
from rankecho.echo.sandbox import Sandbox, SandboxLimits
from rankecho.echo.store.migrate import available
from rankecho.echo.store.reader import QueryBusyError, QueryError, QueryResourceError, QueryTimeoutError
from rankecho.echo.store.snapshot import Snapshots

CAP = 384 << 20
SLOW = "SELECT sum(hash(a.range * b.range)) FROM range(100000) a, range(100000) b"
"""Ten billion pairs in little memory: stopped by time, never by the memory cap."""


def let_through(sql: str) -> str:
    return sql


def own_rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sandbox") / "secretname.db"
    build_store(path).close()
    return path


@pytest.fixture(scope="module")
def sandbox(store: Path) -> Iterator[Sandbox]:
    box = Sandbox(lambda: store, SandboxLimits(memory_bytes=CAP, workers=2, margin_s=1.0), timeout_s=5)
    box.query("SELECT 1")  # the private copy made and pruned, a worker started: the tests time queries
    yield box
    box.close()


def test_a_query_past_the_memory_cap_is_stopped_and_the_worker_replaced(sandbox: Sandbox) -> None:
    before = own_rss()
    started = time.monotonic()
    with pytest.raises(QueryResourceError, match=r"more than 384 MiB and was stopped"):
        sandbox.query("SELECT range(1000000) FROM range(1024)")  # ~8 GB of lists if it ran
    assert time.monotonic() - started < 5
    assert own_rss() - before < 64 << 20  # this process never held the query's memory
    assert sandbox.query("SELECT count(*) FROM events").rows == [(4000,)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT len(range((SELECT 1000000000)))",
        "SELECT repeat('x', (SELECT 1000000000))",
        "SELECT max(length(repeat(event_id, (SELECT 20000000)))) FROM events",
        "SELECT len(string_split(repeat('a,', (SELECT 50000000)), ','))",
    ],
)
def test_sizes_hidden_from_the_guard_hit_the_cap(sandbox: Sandbox, sql: str) -> None:
    with pytest.raises(QueryResourceError):
        sandbox.query(sql)


def test_the_guard_refuses_constant_sizes_before_any_worker_runs(sandbox: Sandbox) -> None:
    kills = sandbox.kills
    with pytest.raises(Refused, match=r"range\(\) would produce 1,000,000,000 values"):
        sandbox.query("SELECT len(range(1000000000))")
    with pytest.raises(Refused, match=r"repeat\(\) asks for 20,000,000 repetitions"):
        sandbox.query("SELECT max(length(repeat(event_id, 20000000))) FROM events")
    assert sandbox.kills == kills


def test_a_query_past_the_deadline_is_stopped(sandbox: Sandbox) -> None:
    slow = SLOW
    started = time.monotonic()
    with pytest.raises(QueryTimeoutError, match=r"ran past 0\.5 s"):
        sandbox.query(slow, timeout_s=0.5)
    assert time.monotonic() - started < 0.5 + sandbox.limits.margin_s + 0.5
    assert sandbox.query("SELECT 1 AS one").rows == [(1,)]


def test_caps_cut_the_stream_in_the_worker(sandbox: Sandbox) -> None:
    by_rows = sandbox.query("SELECT event_id FROM events ORDER BY event_id", max_rows=10)
    assert len(by_rows.rows) == 10 and by_rows.truncated_by == "max_rows"
    assert by_rows.rows[0] == ("ev-000000",)
    by_bytes = sandbox.query("SELECT * FROM events ORDER BY event_id", max_bytes=20_000)
    assert 0 < len(by_bytes.rows) < 4000 and by_bytes.truncated_by == "max_bytes"
    whole = sandbox.query("SELECT node_id, count(*) AS n FROM events GROUP BY 1 ORDER BY 1")
    assert whole.rows == [("node-a", 2000), ("node-b", 2000)] and not whole.truncated
    assert whole.columns == ["node_id", "n"]


def test_errors_name_no_file(sandbox: Sandbox, store: Path) -> None:
    with pytest.raises(Exception) as error:
        sandbox.query("SELECT nope.main.events.node_id FROM events", params=None)
    assert "secretname" not in str(error.value) and str(store.parent) not in str(error.value)
    assert "store.main.events" in str(error.value)  # the catalog is always called 'store'


def test_more_queries_than_workers_wait_their_turn(store: Path) -> None:
    # About turns, not memory: room enough that the slow query's address space (its threads' buffers,
    # which vary with the machine's load) can never end it before its deadline does.
    box = Sandbox(lambda: store, SandboxLimits(memory_bytes=4 * CAP, workers=1, margin_s=0.5), timeout_s=5)
    slow = SLOW
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            box.query(slow, timeout_s=2.0)
        except BaseException as exc:
            errors.append(exc)

    try:
        box.query("SELECT 1")  # the worker is started
        holder = threading.Thread(target=hold)
        holder.start()
        deadline = time.monotonic() + 10
        while box.busy < 1 and time.monotonic() < deadline:  # the slow query holds the only worker
            time.sleep(0.01)
        assert box.busy == 1
        with pytest.raises(QueryBusyError, match="analysis workers stayed busy"):
            box.query("SELECT 1", timeout_s=0.5)
        holder.join(10)
        assert len(errors) == 1 and isinstance(errors[0], QueryTimeoutError)
        assert box.query("SELECT 2 AS two").rows == [(2,)]
    finally:
        box.close()


def test_echo_workers_read_a_snapshot_that_follows_ingest(tmp_path: Path) -> None:
    with Echo(local_settings(tmp_path / "echo.db", analysis_memory_limit="256MB")) as echo:
        assert echo.analysis.query("SELECT count(*) FROM events").rows == [(0,)]
        grpc_export(echo.grpc_address or "", node_request("node-a", 50), TEST_TOKEN)
        assert echo.analysis.query("SELECT count(*) FROM events").rows == [(50,)]
        grpc_export(echo.grpc_address or "", node_request("node-b", 25), TEST_TOKEN)
        rows = echo.analysis.query("SELECT node_id, count(*) FROM events GROUP BY 1 ORDER BY 1").rows
        assert rows == [("node-a", 50), ("node-b", 25)]
        copies = list((tmp_path / "echo.db.analysis").glob("snapshot-*.db"))
        assert 1 <= len(copies) <= 2  # older snapshots are deleted
        newest = max(copies, key=lambda p: int(p.stem.split("-")[1]))  # what the last query read: pruned
        with duckdb.connect(str(newest), read_only=True) as con:
            tables = con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()
        assert tables == [("attr_sets",), ("collective_rollup",), ("collectives",), ("events_generic",),
                          ("host_activity",), ("retention_state",), ("stacks",)]  # fmt: skip
    assert not (tmp_path / "echo.db.analysis").exists()


@pytest.mark.parametrize("held_copy_bytes", [0, 1 << 40], ids=["copy-while-committing", "copy-held"])
def test_snapshots_are_consistent_while_ingest_commits(tmp_path: Path, held_copy_bytes: int) -> None:
    """Copies taken while a producer keeps committing open cleanly and hold whole commits only."""
    with Echo(local_settings(tmp_path / "echo.db")) as echo:
        address = echo.grpc_address or ""
        grpc_export(address, node_request("seed", 500), TEST_TOKEN)
        snapshots = Snapshots(echo.settings.db_path, echo.writer.hold, tmp_path / "snaps", 0.0, 10.0,
                              held_copy_bytes)  # fmt: skip
        stop = threading.Event()

        def produce() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                grpc_export(address, node_request(f"n{n % 4}", 20), TEST_TOKEN)

        producer = threading.Thread(target=produce)
        producer.start()
        counts = []
        try:
            for _ in range(8):
                time.sleep(0.1)
                path = snapshots.current()
                with duckdb.connect(":memory:") as con:
                    con.execute("ATTACH ? AS s (READ_ONLY)", [str(path)])
                    counts.append(con.execute("SELECT count(*) FROM s.events").fetchall()[0][0])
        finally:
            stop.set()
            producer.join(30)
        assert all(c >= 500 and (c - 500) % 20 == 0 for c in counts), counts  # whole exports only
        assert counts == sorted(counts) and counts[-1] > counts[0]
        assert snapshots.copies >= 2 and len(list((tmp_path / "snaps").glob("*.db"))) <= 2


def test_every_value_type_comes_back_as_duckdb_returns_it(sandbox: Sandbox, store: Path) -> None:
    columns = [
        "TIMESTAMPTZ '2026-01-01 10:00:00+02' AS tz",
        "TIMESTAMP '2026-01-01' AS ts",
        "DATE '2026-01-01' AS d",
        "TIME '10:00' AS t",
        "TIMETZ '10:00:00+01' AS ttz",
        "INTERVAL 3 DAY AS iv",
        "1.5::DECIMAL(10,2) AS dec",
        "'ab'::BLOB AS b",
        "[1, 2] AS l",
        "{'a': [TIMESTAMPTZ '2026-01-01 00:00:00+00']} AS s",
        "MAP {'k': 1} AS m",
        "170141183460469231731687303715884105727::HUGEINT AS h",
        "'101'::BIT AS bit",
        "'{\"x\": 1}'::JSON AS j",
        "'a'::ENUM('a', 'b') AS e",
        "[1, 2]::INTEGER[2] AS arr",
        "union_value(k := 1) AS un",
        "'inf'::DOUBLE AS inf",
        "NULL AS n",
        "12345678901234567890::UBIGINT AS ub",
        "'00000000-0000-0000-0000-000000000001'::UUID AS u",
    ]
    sql = "SELECT " + ", ".join(columns)
    with duckdb.connect(str(store), read_only=True) as con:
        want = con.execute(sql).fetchall()
    assert sandbox.query(sql).rows == want


# --- issue 22: nothing to read but what is allowed ----------------------------------------------------


@pytest.fixture(scope="module")
def unguarded(store: Path) -> Iterator[Sandbox]:
    """The sandbox with no guard at all: what the worker's catalog holds is all that protects."""
    limits = SandboxLimits(memory_bytes=CAP, workers=1, margin_s=1.0)
    box = Sandbox(lambda: store, limits, 5, check=let_through)
    yield box
    box.close()


def test_the_workers_catalog_holds_only_the_allowed_relations(unguarded: Sandbox, store: Path) -> None:
    tables = unguarded.query("SELECT database_name, schema_name, table_name FROM duckdb_tables() ORDER BY 3")
    allowed = ("attr_sets", "collective_rollup", "collectives", "events_generic", "host_activity",
               "retention_state", "stacks")  # and the view `events` over them
    assert tables.rows == [("store", "main", name) for name in allowed]
    databases = unguarded.query("SELECT database_name FROM duckdb_databases() WHERE NOT internal ORDER BY 1")
    assert databases.rows == [("memory",), ("store",)]
    views = unguarded.query("SELECT database_name, view_name FROM duckdb_views() WHERE NOT internal")
    assert views.rows == [("store", "events")]
    for objects in (
        "duckdb_sequences()",
        "duckdb_indexes() WHERE table_name NOT IN ('events', 'collectives', 'host_activity')",
        "duckdb_tables() WHERE database_name = 'memory'",
    ):
        assert unguarded.query(f"SELECT count(*) FROM {objects}").rows == [(0,)], objects
    assert unguarded.query("SELECT count(*) FROM events").rows == [(4000,)]
    with duckdb.connect(str(store), read_only=True) as con:  # the caller's file is never changed
        assert con.execute("SELECT count(*) FROM schema_version").fetchone() == (len(available()),)
    assert sorted(p.name for p in store.parent.iterdir()) == [store.name]


def test_the_internal_table_family_finds_nothing_without_the_guard(unguarded: Sandbox) -> None:
    """Every statement of tests/test_guard_bound.py's family against schema_version, with no guard: each
    fails to find the table or reads only its CTE; none returns a migration's name."""
    from test_guard_bound import INTERNAL

    answered = 0
    for sql in INTERNAL:
        try:
            result = unguarded.query(sql)
        except QueryError as error:
            assert "schema_version" in str(error).lower() or "Binder Error" in str(error)
            continue
        answered += 1
        assert "_events.sql" not in repr(result.rows) and "analysis_tables" not in repr(result.rows), sql
    assert answered < len(INTERNAL) // 2


def test_a_store_another_process_writes_is_refused_not_copied(tmp_path: Path) -> None:
    path = tmp_path / "live.db"
    build_store(path).close()
    hold = f"import duckdb, time; c = duckdb.connect({str(path)!r}); print(1, flush=True); time.sleep(30)"
    writer = subprocess.Popen(
        [sys.executable, "-c", hold],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "1"
        box = Sandbox(lambda: path, SandboxLimits(memory_bytes=CAP, workers=1), 5)
        try:
            with pytest.raises(QueryError, match="open for writing by another process"):
                box.query("SELECT count(*) FROM events")
        finally:
            box.close()
    finally:
        writer.kill()
        writer.wait()
