"""Retention (issue 20, part 4): old raw rows deleted in chunks on the writer thread, collectives rolled up
per minute first and equal to what the raw rows said, young rows never touched, --max-db-size moving the
cutoff, ingest going on during a pass, the store fine after a reopen, and the flags."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pyarrow as pa
import pytest
from conftest import local_settings
from echo_helpers import TEST_TOKEN, grpc_export, rows
from fastmcp import Client

from rankecho.cli import build_parser
from rankecho.echo.app import Echo
from rankecho.echo.ingest.rows import ARROW_SCHEMA
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.server import build_server
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.ops import Stats
from rankecho.echo.settings import SettingsError, settings_from_args
from rankecho.echo.store.migrate import available, migrate
from rankecho.echo.store.reader import Reader
from rankecho.echo.store.retention import MINUTE_NS, NS, Retention, RetentionPolicy
from rankecho.echo.store.writer import Writer
from rankecho.launch.echo import EchoProcess
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request

HOUR_NS = 3600 * NS
RAW = (("events", "timestamp_ns"), ("collectives", "enter_ns"), ("host_activity", "start_ns"))
"""Each raw relation (``events``: the view over the stored rows) and the time column retention cuts it on."""
STORED = (("events_generic", "timestamp_ns"), ("collectives", "enter_ns"), ("host_activity", "start_ns"))
"""The tables that hold them."""
ROLLUP_OF_RAW = """
SELECT cluster_id, node_id, rank, comm_id, (enter_ns // 60000000000) * 60000000000 AS minute_ns,
       count(*), count(complete_ns), sum(complete_ns - enter_ns), max(complete_ns - enter_ns), sum(bytes),
       min(enter_ns), max(enter_ns), min(seq), max(seq)
FROM collectives WHERE enter_ns < {cutoff} GROUP BY ALL ORDER BY ALL"""
MERGED_ROLLUP = """
SELECT cluster_id, node_id, rank, comm_id, minute_ns, sum(calls), sum(completed), sum(wait_sum_ns),
       max(wait_max_ns), sum(bytes_sum), min(first_enter_ns), max(last_enter_ns), min(min_seq), max(max_seq)
FROM collective_rollup GROUP BY ALL ORDER BY ALL"""


def resource(rank: int) -> dict[str, Any]:
    return {c.CLUSTER_NAME: "c1", c.NODE_NAME: f"node-{rank // 2}", c.RANK: rank, c.NRANKS: 4,
            c.PROCESS_PID: 100 + rank, c.PROCESS_START_NS: 7, c.SERVICE_INSTANCE_ID: f"a/{rank}"}  # fmt: skip


def collective(rank: int, comm: str, seq: int, enter_ns: int, wait_ns: int | None) -> Point:
    attrs: dict[str, Any] = {
        c.OP: "ncclAllReduce", c.COMM_ID: comm, c.SEQ: seq, c.SEQ_ALIGNED: True, c.COMM_RANK: rank,
        c.COMM_NRANKS: 4, c.BYTES: 1024 * (seq % 3 + 1), c.ENTER_NS: enter_ns, c.RETURN_NS: enter_ns + 10,
        c.CAUSAL_CHAIN_ID: f"{comm}:{seq}", c.TID: 9, c.EVENT_ID: f"coll-{rank}-{comm}-{seq}-{enter_ns}",
    }  # fmt: skip
    if wait_ns is not None:
        attrs[c.COMPLETE_NS] = enter_ns + wait_ns
    return Point(c.M_COLLECTIVE, enter_ns, 0.5, attrs)


def interval(rank: int, start_ns: int) -> Point:
    attrs = {c.CUDA_CALL: "cudaMalloc", c.TID: 9, c.EVENT_ID: f"malloc-{rank}-{start_ns}"}
    return Point(c.M_CUDA_MALLOC, start_ns, 1.0, attrs)


def send_job(address: str, start_ns: int, seconds: int, step_ns: int = 2 * NS) -> int:
    """4 ranks, 2 communicators, a collective per communicator per step (some never completed) and a
    malloc per step, from ``start_ns`` for ``seconds``; returns the events sent."""
    sent = 0
    for rank in range(4):
        points = []
        for step, at in enumerate(range(start_ns, start_ns + seconds * NS, step_ns)):
            for k, comm in enumerate(("tp", "dp")):
                wait = None if step % 7 == 3 else 1_000 * (rank + 1) * (step % 5 + 1) + k
                points.append(collective(rank, comm, step, at + k * 1_000_000 + rank * 1_000, wait))
            points.append(interval(rank, at + 500_000))
        grpc_export(address, metrics_request(resource(rank), points), TEST_TOKEN)
        sent += len(points)
    return sent


def count(echo: Echo, table: str, column: str, cutoff: int) -> tuple[int, int]:
    """(rows below ``cutoff``, rows at or above it) of ``table`` by its time ``column``."""
    got = rows(echo, f"SELECT count(*) FILTER (WHERE {column} < {cutoff}), "
                     f"count(*) FILTER (WHERE {column} >= {cutoff}) FROM {table}")  # fmt: skip
    return int(got[0][0]), int(got[0][1])


def settled(echo: Echo) -> Echo:
    """``echo`` once the pass it starts with (limits apply at start) is over: the next pass is the test's."""
    echo.writer.retention_pass().result(timeout=60)
    return echo


# --- a real Echo: gRPC in, the writer's own pass ------------------------------------------------------


def test_a_pass_rolls_up_then_deletes_old_rows_and_keeps_young_ones(tmp_path: Path) -> None:
    path = tmp_path / "echo.db"
    settings = local_settings(path, retention_s=2 * 3600.0, retention_every_s=3600.0)  # passes on request
    now = time.time_ns()
    # Half a minute into a minute: the 300 s job then touches 6 minutes whatever the clock says (started
    # less than 2 s into one, its last step would end inside the fifth).
    old, young = now - 5 * HOUR_NS - now % MINUTE_NS + 30 * NS, now - 30 * MINUTE_NS
    with Echo(settings) as echo:
        settled(echo)
        sent_old = send_job(echo.grpc_address or "", old, 300)
        sent_young = send_job(echo.grpc_address or "", young, 120)
        expected = rows(echo, ROLLUP_OF_RAW.format(cutoff=now - 2 * HOUR_NS))
        young_sql = "SELECT * FROM {table} WHERE {column} >= {young} ORDER BY ALL"
        young_before = {t: rows(echo, young_sql.format(table=t, column=col, young=young)) for t, col in RAW}
        # rows stored for the old job: an event rebuilt exactly by its typed row is that row alone, one
        # that is not (the intervals here lack rankecho.enter_ns) is also a row of events_generic
        stored_old = sum(count(echo, t, col, young)[0] for t, col in STORED)
        report = echo.writer.retention_pass().result(timeout=120)
        cutoff = report.raw_cutoff_ns
        assert cutoff is not None and now - 2 * HOUR_NS <= cutoff <= time.time_ns() - 2 * HOUR_NS
        for table, column in RAW:
            assert count(echo, table, column, cutoff - MINUTE_NS)[0] == 0, table  # old rows gone
            young_after = rows(echo, young_sql.format(table=table, column=column, young=young))
            assert young_after == young_before[table]  # acknowledged rows younger than the cutoff: untouched
        assert count(echo, "events", "timestamp_ns", young)[1] == sent_young
        assert len(expected) == 4 * 2 * 6  # 4 ranks x 2 communicators x the 5 minutes (+ 1 partial)
        assert rows(echo, MERGED_ROLLUP) == expected  # the rollup says what the raw rows said
        assert report.rollup_rows_written == len(expected) and report.rows_deleted > 0
        state = rows(echo, "SELECT retention_s, raw_cutoff_ns, raw_rows_deleted, last_rows_deleted "
                           "FROM retention_state")  # fmt: skip
        assert state == [(2 * 3600.0, cutoff, stored_old, stored_old)] and stored_old > sent_old
        metrics = httpx.get(f"http://{echo.http_address}/metrics", timeout=30).text
        assert f"rankecho_echo_retention_rows_deleted_total {stored_old}\n" in metrics
        assert f"rankecho_echo_retention_raw_cutoff_seconds {cutoff / NS:g}\n" in metrics
    with Echo(local_settings(path)) as echo:  # reopened, retention off now: everything still there
        assert rows(echo, MERGED_ROLLUP) == expected
        assert count(echo, "events", "timestamp_ns", young)[1] == sent_young
        assert rows(echo, "SELECT retention_s, raw_cutoff_ns FROM retention_state") == [(None, cutoff)]
        send_job(echo.grpc_address or "", now - 10 * NS, 4)  # and it takes new rows
        assert count(echo, "collectives", "enter_ns", now - 10 * NS)[1] == 4 * 2 * 2


def test_a_late_collective_below_the_cutoff_is_rolled_up_by_the_next_pass(tmp_path: Path) -> None:
    now = time.time_ns()
    old = now - 5 * HOUR_NS - (now % MINUTE_NS)  # the start of a minute
    with Echo(local_settings(tmp_path / "echo.db", retention_s=3600.0, retention_every_s=3600.0)) as echo:
        settled(echo)
        send_job(echo.grpc_address or "", old, 60)
        expected = rows(echo, ROLLUP_OF_RAW.format(cutoff=now))
        echo.writer.retention_pass().result(timeout=60)
        late = collective(0, "tp", 999, old + 7 * NS, 4_000)  # a spool replayed hours late
        grpc_export(echo.grpc_address or "", metrics_request(resource(0), [late]), TEST_TOKEN)
        echo.writer.retention_pass().result(timeout=60)
        assert rows(echo, "SELECT count(*) FROM collectives") == [(0,)]
        merged = rows(echo, MERGED_ROLLUP)
        first = [r for r in merged if r[2] == 0 and r[3] == "tp" and r[4] == old]
        before = [r for r in expected if r[2] == 0 and r[3] == "tp" and r[4] == old]
        assert first[0][5] == before[0][5] + 1 and first[0][13] == 999  # one more call, counted once
        assert len(merged) == len(expected)


def test_ingest_goes_on_while_a_pass_runs_in_small_chunks(tmp_path: Path) -> None:
    """Chunks of a few rows make a pass hundreds of steps long; commits keep landing between them and
    every acknowledged young row stays."""
    now = time.time_ns()
    with Echo(local_settings(tmp_path / "echo.db", retention_s=3600.0, retention_every_s=3600.0)) as echo:
        settled(echo)
        send_job(echo.grpc_address or "", now - 3 * HOUR_NS, 120, step_ns=NS)
        assert echo.writer.retention is not None
        echo.writer.retention.policy = RetentionPolicy(3600.0, chunk_rows=4, first_span_s=0.001)
        passing: Future[Any] = echo.writer.retention_pass()
        sent = 0
        while not passing.done():
            sent += send_job(echo.grpc_address or "", now - 60 * NS + sent * 1000, 1)
        report = passing.result(timeout=120)
        sent += send_job(echo.grpc_address or "", now - 30 * NS, 1)
        assert report.chunks > 20 and sent > 0
        assert count(echo, "events", "timestamp_ns", now - 2 * HOUR_NS) == (0, sent)


def test_rankecho_serve_with_retention_trims_an_existing_store(tmp_path: Path) -> None:
    """End to end: a store filled by a plain ``rankecho serve`` with hours-old points, then served with
    ``--retention 1h``: the pass at start rolls up and deletes the old rows, the young ones stay."""
    db, log = tmp_path / "echo.db", tmp_path / "echo.log"
    now = time.time_ns()
    with EchoProcess(db, TEST_TOKEN, log=log) as echo:
        send_job(echo.otlp_grpc, now - 3 * HOUR_NS, 120)
        sent_young = send_job(echo.otlp_grpc, now - 10 * MINUTE_NS, 60)
    with EchoProcess(db, TEST_TOKEN, log=log, extra_args=("--retention", "1h", "--max-db-size", "10GB")):
        deadline = time.monotonic() + 120
        while "retention: " not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    assert "retention: " in log.read_text(), log.read_text()[-2000:]
    with duckdb.connect(str(db), read_only=True) as con:
        kept = con.execute("SELECT count(*), min(timestamp_ns) FROM events").fetchone()
        assert kept is not None and kept[0] == sent_young and kept[1] >= now - HOUR_NS
        rolled = con.execute("SELECT sum(calls), count(DISTINCT rank) FROM collective_rollup").fetchone()
        assert rolled == (60 * 2 * 4, 4)  # 60 steps x 2 communicators x 4 ranks, rolled up before they went
        limits = con.execute("SELECT retention_s, max_db_bytes FROM retention_state").fetchone()
        assert limits == (3600.0, 10**10)


def events_table(first: int, n: int, at_ns: int) -> pa.Table:
    """``n`` events rows for :meth:`Writer.submit`, ids ``young-<first>``..., all at ``at_ns``."""
    columns: dict[str, list[Any]] = {f.name: [None] * n for f in ARROW_SCHEMA}
    columns.update(event_id=[f"young-{first + i}" for i in range(n)], timestamp_ns=[at_ns] * n,
                   received_ns=[0] * n, signal=["metric"] * n, metric_name=["m"] * n)  # fmt: skip
    return pa.table(columns, schema=ARROW_SCHEMA)


def test_the_writer_commits_between_the_steps_of_a_pass(tmp_path: Path) -> None:
    """Requests queued while a pass runs are committed one step later, not after the whole pass."""
    now = time.time_ns()
    with duckdb.connect(str(tmp_path / "w.db")) as con:
        migrate(con)
        writer = Writer(con.cursor(), Stats(), queue_rows=10_000, batch_rows=10, db_path=tmp_path / "w.db")
        writer.use_retention(RetentionPolicy(3600.0, chunk_rows=4, first_span_s=0.001, every_s=3600.0))
        during: list[bool] = []
        writer.start()
        writer.retention_pass().result(timeout=60)  # after the pass at start
        fill(con.cursor(), now - 2 * HOUR_NS, 500, NS)  # old rows: with 4-row chunks, a pass of many steps
        with writer.hold():
            passing = writer.retention_pass()
            futures = [writer.submit(events_table(10 * i, 10, now)) for i in range(5)]
            for future in futures:  # commit by commit, was the pass under way?
                future.add_done_callback(lambda _: during.append(not passing.done()))
        report = passing.result(timeout=60)
        assert [f.result(timeout=60) for f in futures] == [10] * 5
        writer.stop()
        assert report.chunks > 10 and during == [True] * 5
        assert con.execute("SELECT count(*) FROM events WHERE timestamp_ns >= ?", [now]).fetchone() == (50,)


def test_a_failing_pass_is_reported_and_the_writer_goes_on(tmp_path: Path) -> None:
    """A step that fails ends its pass (its waiters get the error, the log says so); commits continue."""
    now = time.time_ns()
    with duckdb.connect(str(tmp_path / "w.db")) as con:
        migrate(con)
        writer = Writer(con.cursor(), Stats(), queue_rows=10_000, db_path=tmp_path / "w.db")
        writer.use_retention(RetentionPolicy(3600.0, every_s=3600.0))
        writer.start()
        writer.retention_pass().result(timeout=60)  # after the pass at start
        fill(con.cursor(), now - 2 * HOUR_NS, 100, NS)
        con.cursor().execute("ALTER TABLE collective_rollup RENAME TO elsewhere")  # no rollup can be written
        with pytest.raises(duckdb.CatalogException, match="collective_rollup"):
            writer.retention_pass().result(timeout=60)
        assert writer.submit(events_table(0, 10, now)).result(timeout=60) == 10
        con.cursor().execute("ALTER TABLE elsewhere RENAME TO collective_rollup")
        report = writer.retention_pass().result(timeout=60)  # the next pass does the work
        writer.stop()
        assert report.rows_deleted == 200 and writer.failed is None


# --- the pass on a connection: sizes and limits -------------------------------------------------------


def fill(con: duckdb.DuckDBPyConnection, start_ns: int, n: int, every_ns: int) -> None:
    """``n`` events and collectives, one every ``every_ns`` from ``start_ns`` (SQL: fast, realistic size);
    the collectives of 8 ranks on 2 communicators, so a minute rolls up into at most 16 rows."""
    typed = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'events_generic'").fetchall()
    events = "events_generic" if typed == [(1,)] else "events"  # a store before v7: events is the table
    con.execute(f"""INSERT INTO {events} (event_id, timestamp_ns, received_ns, signal, cluster_id,
                       node_id, metric_name, rank, attrs_json)
                   SELECT md5(i::VARCHAR)[:16], $s + i * $e, 0, 'metric', 'c1', 'node-' || (i % 16),
                          'rankecho.nccl.collective', i % 128, '{{"comm": "' || (i % 7) || '"}}'
                   FROM range($n) t(i)""", {"s": start_ns, "e": every_ns, "n": n})  # fmt: skip
    described = con.execute("DESCRIBE collectives").fetchall()
    id_column = "event_id_sent" if ("event_id_sent",) in [r[:1] for r in described] else "event_id"  # v8 / v2
    con.execute(f"""INSERT INTO collectives ({id_column}, cluster_id, node_id, rank, comm_id, seq, bytes,
                       enter_ns, complete_ns)
                   SELECT md5(i::VARCHAR)[:16], 'c1', 'node-' || (i % 8) // 4, i % 8, 'comm' || (i % 2), i,
                          1024, $s + i * $e, $s + i * $e + i % 5000
                   FROM range($n) t(i)""", {"s": start_ns, "e": every_ns, "n": n})  # fmt: skip
    con.execute("CHECKPOINT")


def test_max_db_size_moves_the_cutoff_until_the_store_fits(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    now = time.time_ns()
    with duckdb.connect(str(path)) as con:
        migrate(con)
        fill(con, now - 4 * HOUR_NS, 600_000, 4 * HOUR_NS // 600_000)  # ~5 row groups a table
        used = int(con.execute("SELECT used_blocks * block_size FROM pragma_database_size()").fetchone()[0])
        limit = used // 2
        policy = RetentionPolicy(max_db_bytes=limit)
        retention = Retention(con, policy, path, lambda: bool(con.execute("CHECKPOINT")), lambda: now)
        reports = [retention.run_pass()]
        while reports[-1].used_after > limit and len(reports) < 6:
            assert retention.due()  # over the size: the next pass is due at once
            reports.append(retention.run_pass())
        assert reports[-1].used_after <= limit < reports[0].used_before
        cutoffs = [r.raw_cutoff_ns for r in reports if r.raw_cutoff_ns is not None]
        assert cutoffs == sorted(cutoffs) and now - 4 * HOUR_NS < cutoffs[-1] < now  # oldest first
        kept = con.execute("SELECT min(timestamp_ns), max(timestamp_ns), count(*) FROM events").fetchone()
        assert kept is not None and kept[0] >= cutoffs[-1] and kept[1] == now - 4 * HOUR_NS + 599_999 * (
            4 * HOUR_NS // 600_000
        )  # the newest row stays
        assert 0 < kept[2] < 600_000
        file_bytes = path.stat().st_size
        fill(con, now, 50_000, 1000)  # new rows reuse the freed blocks: the file does not grow
        assert path.stat().st_size <= file_bytes  # a checkpoint may also truncate free blocks at the end


def test_a_busy_minute_after_quiet_hours_is_deleted_in_bounded_steps(tmp_path: Path) -> None:
    """Quiet hours (sparse rows) let the span grow; the busy minute after them is still cut into steps of
    at most chunk_rows, because each step counts before it deletes."""
    now = time.time_ns()
    quiet, busy = now - 3 * 86_400 * NS, now - 86_400 * NS
    with duckdb.connect(str(tmp_path / "s.db")) as con:
        migrate(con)
        con.execute("""INSERT INTO events_generic (event_id, timestamp_ns, received_ns, signal, metric_name)
                       SELECT 'q' || i, $q + i * 600 * 1000000000, 0, 'metric', 'm' FROM range(280) t(i)
                       UNION ALL
                       SELECT 'b' || i, $b + i * 1000000, 0, 'metric', 'm' FROM range(20000) t(i)""",
                    {"q": quiet, "b": busy})  # fmt: skip
        policy = RetentionPolicy(3600.0, chunk_rows=1000, first_rows=1000, step_budget_s=1e6)
        retention = Retention(con, policy, None, lambda: True, lambda: now)
        retention.request()
        per_step, before = [], 0
        while retention.step():
            if retention.current is not None:
                per_step.append(retention.current.rows_deleted - before)
                before = retention.current.rows_deleted
        assert retention.last is not None and retention.last.rows_deleted == 20_280
        assert max(per_step) <= 1000 and sum(per_step) == 20_280
        assert con.execute("SELECT count(*) FROM events").fetchone() == (0,)


def test_old_rollups_go_after_rollup_retention(tmp_path: Path) -> None:
    now = time.time_ns()
    with duckdb.connect(str(tmp_path / "s.db")) as con:
        migrate(con)
        fill(con, now - 10 * 86_400 * NS, 1000, 10 * MINUTE_NS)  # from 10 to 3 days ago
        policy = RetentionPolicy(retention_s=86_400.0, rollup_retention_s=9 * 86_400.0)
        first = Retention(con, policy, None, lambda: True, lambda: now).run_pass()
        assert first.rollup_rows_written == 1000 and 100 < first.rollup_rows_deleted < 200  # the 10th day
        later = Retention(con, policy, None, lambda: True, lambda: now + 86_400 * NS).run_pass()
        assert 100 < later.rollup_rows_deleted < 200
        oldest = con.execute("SELECT min(minute_ns) FROM collective_rollup").fetchone()
        assert oldest is not None and oldest[0] >= now - 8 * 86_400 * NS
        assert con.execute("SELECT rollup_rows_deleted FROM retention_state").fetchone() == (
            first.rollup_rows_deleted + later.rollup_rows_deleted,
        )


def test_without_limits_no_pass_is_due_and_a_requested_one_deletes_nothing(tmp_path: Path) -> None:
    now = time.time_ns()
    with duckdb.connect(str(tmp_path / "s.db")) as con:
        migrate(con)
        fill(con, now - 1000 * 86_400 * NS, 100, NS)
        retention = Retention(con, RetentionPolicy(), None, lambda: True, lambda: now, lambda: 1e12)
        assert not retention.due()
        report = retention.run_pass()
        assert (report.raw_cutoff_ns, report.rows_deleted) == (None, 0)
        assert con.execute("SELECT count(*) FROM events").fetchone() == (100,)


# --- fleet.cluster.summary ---------------------------------------------------------------------------


def summary(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """``fleet.cluster.summary`` through the MCP server, in process."""

    async def go() -> dict[str, Any]:
        async with Client(build_server(Investigation(Reader(con), load_rates()))) as client:
            result = await client.call_tool("fleet.cluster.summary", {})
            assert result.structured_content is not None
            return dict(result.structured_content)

    return asyncio.run(go())


def test_summary_says_which_raw_and_rolled_up_ranges_exist(tmp_path: Path) -> None:
    now = time.time_ns()
    with duckdb.connect(str(tmp_path / "s.db")) as con:
        migrate(con)
        fill(con, now - 3 * HOUR_NS, 3 * 3600, NS)  # one row a second for 3 hours
        before = summary(con)
        assert before["retention"]["raw_from_ns"] == now - 3 * HOUR_NS
        assert before["retention"]["rollup_from_ns"] is None and before["retention"]["retention_s"] is None
        policy = RetentionPolicy(retention_s=3600.0, max_db_bytes=10**12)
        retention = Retention(con, policy, None, lambda: True, lambda: now)
        retention.record_settings()
        report = retention.run_pass()
        got = summary(con)
        assert set(before) <= set(got)  # a field added, none renamed
        r = got["retention"]
        assert (r["retention_s"], r["max_db_bytes"]) == (3600.0, 10**12)
        assert r["raw_cutoff_ns"] == report.raw_cutoff_ns and r["raw_from_ns"] >= now - HOUR_NS
        assert r["raw_to_ns"] == now - 3 * HOUR_NS + (3 * 3600 - 1) * NS
        minute = (now - 3 * HOUR_NS) // MINUTE_NS * MINUTE_NS
        assert r["rollup_from_ns"] == minute
        assert now - HOUR_NS - MINUTE_NS <= r["rollup_to_ns"] <= now - HOUR_NS
        assert r["raw_from"].endswith("Z") and r["last_rows_deleted"] == report.rows_deleted


# --- migration and flags ------------------------------------------------------------------------------


def v2_store(con: duckdb.DuckDBPyConnection) -> None:
    """A store as Echo left it before migration 004."""
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
                "applied_ns BIGINT NOT NULL)")  # fmt: skip
    for m in available():
        if m.version <= 2:
            con.execute(m.sql)
            con.execute("INSERT INTO schema_version VALUES (?, ?, 0)", [m.version, m.name])


def test_a_v2_store_gains_the_retention_tables(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with duckdb.connect(str(path)) as con:
        v2_store(con)
        fill(con, time.time_ns() - 3 * HOUR_NS, 1000, NS)
    with Echo(local_settings(path, retention_s=3600.0, retention_every_s=3600.0)) as echo:
        settled(echo)  # the pass at start did it
        assert rows(echo, "SELECT raw_rows_deleted FROM retention_state") == [(2000,)]
        assert rows(echo, "SELECT sum(calls) FROM collective_rollup") == [(1000,)]
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone() == (available()[-1].version,)


def parse(*argv: str) -> Any:
    args = build_parser().parse_args(["serve", "--db", "x.db", *argv])
    return settings_from_args(args, {"RANKECHO_TOKEN": "t"})


def test_flags_parse_into_seconds_and_bytes() -> None:
    default = parse()
    assert (default.retention_s, default.max_db_bytes) == (None, None) and not default.retention_on
    assert default.rollup_retention_s == 90 * 86_400.0
    s = parse("--retention", "7d", "--max-db-size", "200GB", "--rollup-retention", "30d")
    assert (s.retention_s, s.max_db_bytes, s.rollup_retention_s) == (7 * 86_400.0, 200 * 10**9, 30 * 86_400.0)
    assert parse("--retention", "12h").retention_s == 12 * 3600.0
    assert parse("--retention", "30m").retention_s == 1800
    assert parse("--max-db-size", "500MB").max_db_bytes == 500 * 10**6
    assert parse("--max-db-size", "1GiB").retention_on


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--retention", "7"), r"--retention '7' is not a duration: .* e\.g\. 7d, 12h or 30m"),
        (("--retention", "a week"), "is not a duration"),
        (("--retention", "10s"), "--retention must be at least 60s"),
        (("--max-db-size", "200"), r"--max-db-size '200' is not a size: .* e\.g\. 200GB or 500MB"),
        (("--max-db-size", "1MB"), "--max-db-size must be at least 64MiB"),
        (("--rollup-retention", "0d"), "--rollup-retention .0d. is not a duration"),
    ],
)
def test_bad_flag_values_are_refused_with_the_accepted_form(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse(*argv)
