"""The read API on the store's own DuckDB instance: one read-only statement, a timeout that really
interrupts DuckDB, row and byte caps; and ``rankecho query`` on a store no Echo holds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from echo_helpers import TEST_TOKEN, grpc_export, node_request

from rankecho.echo.app import Echo
from rankecho.echo.guard import Refused
from rankecho.echo.query_cmd import run_query
from rankecho.echo.store.reader import QueryError, QueryTimeoutError, Reader


@pytest.fixture
def filled(echo_inproc: Echo) -> Echo:
    grpc_export(echo_inproc.grpc_address or "", node_request("n1", 2000), TEST_TOKEN)
    return echo_inproc


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO events (event_id) VALUES ('x')",
        "DELETE FROM events",
        "DROP TABLE events",
        "CREATE TABLE t AS SELECT 1",
        "SELECT 1; DELETE FROM events",
        "COPY events TO '/tmp/x.csv'",
        "ATTACH '/tmp/other.db'",
        "SET threads = 1",
    ],
)
def test_refuses_writes_and_multiple_statements(filled: Echo, sql: str) -> None:
    with pytest.raises(Refused):
        filled.reader.query(sql)
    assert filled.reader.query("SELECT count(*) FROM events").rows == [(2000,)]


def test_read_only_transaction_stops_writes_even_past_the_check(filled: Echo) -> None:
    unchecked = Reader(filled.reader._con, check=lambda sql: sql)
    with pytest.raises(QueryError, match="read-only"):
        unchecked.query("DELETE FROM events_generic")
    assert filled.reader.query("SELECT count(*) FROM events").rows == [(2000,)]


def test_timeout_interrupts_a_running_query(filled: Echo) -> None:
    started = time.monotonic()
    slow = "SELECT count(*) FROM events a, events b, events c WHERE a.value_double < b.value_double + c.rank"
    with pytest.raises(QueryTimeoutError, match=r"0\.3 s"):
        filled.reader.query(slow, timeout_s=0.3)
    assert time.monotonic() - started < 5
    assert filled.reader.query("SELECT count(*) FROM events").rows == [(2000,)]  # the store is fine after


def test_row_and_byte_caps_truncate_and_say_so(filled: Echo) -> None:
    result = filled.reader.query("SELECT event_id FROM events", max_rows=5)
    assert len(result.rows) == 5 and result.truncated and result.truncated_by == "max_rows"
    result = filled.reader.query("SELECT attrs_json, event_id FROM events", max_bytes=1000)
    assert 0 < len(result.rows) < 30 and result.truncated_by == "max_bytes"
    full = filled.reader.query("SELECT count(*) AS n FROM events")
    assert not full.truncated and full.columns == ["n"]


def test_reads_see_commits_while_echo_keeps_writing(filled: Echo) -> None:
    for i in range(3):
        grpc_export(filled.grpc_address or "", node_request(f"m{i}", 10), TEST_TOKEN)
        assert filled.reader.query("SELECT count(*) FROM events").rows == [(2000 + 10 * (i + 1),)]


def test_query_cli_on_a_stopped_store(filled: Echo) -> None:
    db = str(filled.settings.db_path)
    filled.stop()
    cmd = [sys.executable, "-m", "rankecho", "query", "--db", db]
    out = subprocess.run(
        [*cmd, "--json", "SELECT node_id, count(*) AS n FROM events GROUP BY 1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"columns": ["node_id", "n"], "rows": [["n1", 2000]], "truncated": False}
    table = subprocess.run(
        [*cmd, "SELECT count(*) AS n FROM events"], capture_output=True, text=True, timeout=60
    )
    assert table.stdout.splitlines() == ["n", "2000"]
    refused = subprocess.run([*cmd, "DELETE FROM events"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "rankecho query:" in refused.stderr
    bad = subprocess.run(
        [*cmd, "--memory-limit", "4", "SELECT 1"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1 and "--memory-limit '4'" in bad.stderr and "Traceback" not in bad.stderr
    # errors are masked as MCP masks them: the store is 'store', never its file name or folder
    named = subprocess.run(
        [*cmd, "SELECT nope.main.events.node_id FROM events"], capture_output=True, text=True, timeout=60
    )
    assert named.returncode == 1 and 'Candidate tables: "store.main.events"' in named.stderr
    assert f'"{Path(db).stem}.' not in named.stderr and Path(db).name not in named.stderr
    assert str(Path(db).parent) not in named.stderr
    hog = subprocess.run(
        [*cmd, "--memory-limit", "256MB", "SELECT range(1000000) FROM range(1024)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert hog.returncode == 1 and "and was stopped" in hog.stderr and "Traceback" not in hog.stderr


def let_through(sql: str) -> str:
    """A statement gate that allows everything: what the store must withstand if the guard had a hole."""
    return sql


def test_query_cmd_opens_the_store_sealed(filled: Echo, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n42\n")
    db = filled.settings.db_path
    filled.stop()
    read_file = f"SELECT * FROM read_csv('{secret}')"
    with pytest.raises(Refused):
        run_query(db, read_file, timeout_s=5, max_rows=10)  # the guard refuses first
    with pytest.raises(QueryError, match="file system operations are disabled"):
        run_query(db, read_file, timeout_s=5, max_rows=10, check=let_through)
    with pytest.raises(QueryError, match="configuration has been locked"):
        run_query(db, "SET enable_external_access = true", timeout_s=5, max_rows=10, check=let_through)
    limit = "SELECT current_setting('memory_limit')"
    # the worker gives DuckDB 60% of its cap; the rest is headroom for what DuckDB does not count
    assert run_query(db, limit, 5, 10, "256MiB", check=let_through).rows == [("153.0 MiB",)]
    assert run_query(db, "SELECT count(*) FROM events", timeout_s=5, max_rows=10).rows == [(2000,)]
