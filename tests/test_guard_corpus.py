"""The SQL guard against the hostile and legitimate corpora (tests/guard_corpus/*.sql) on a real store.

Every hostile query is refused by the guard and at the MCP boundary, with a message that says what is
allowed and leaks no path or trace. Every legitimate query is allowed and returns exactly what DuckDB
returns for it unguarded, and the same in an analysis worker (how Echo runs it). After all of it the
store is unchanged. The parser layer refuses what the lexical layer lets through, and the sealed
read-only instance refuses writes and file access with no guard in front; tests/test_guard_layers.py
runs each layer alone over the whole corpus.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from guard_corpus.corpus import build_store, fingerprint, load

from rankecho.echo.guard import Refused, check_sql, project_policy
from rankecho.echo.guard.bound import check_bound
from rankecho.echo.guard.lexical import check_lexical
from rankecho.echo.guard.parsed import check_parsed
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.sanitize import json_safe
from rankecho.echo.mcp.tools import Investigation, InvestigationError, Limits
from rankecho.echo.sandbox import Sandbox, SandboxLimits
from rankecho.echo.store.reader import Reader

HOSTILE = load("hostile")
LEGIT = load("legit")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[duckdb.DuckDBPyConnection, Path]]:
    path = tmp_path_factory.mktemp("guard") / "echo.db"
    con = build_store(path)
    yield con, path
    con.close()


@pytest.fixture(scope="module")
def sandboxed(store: tuple[duckdb.DuckDBPyConnection, Path]) -> Iterator[Investigation]:
    """run_analysis as Echo runs it: in an analysis worker, here on a copy of the store (this process
    holds the store itself open for writing)."""
    store[0].execute("CHECKPOINT")
    copy = store[1].with_name("copy.db")
    shutil.copyfile(store[1], copy)
    box = Sandbox(lambda: copy, SandboxLimits(memory_bytes=512 << 20), timeout_s=5.0)
    yield Investigation(Reader(store[0]), load_rates(), Limits(timeout_s=5.0), analysis=box)
    box.close()


@pytest.fixture(scope="module")
def inv(store: tuple[duckdb.DuckDBPyConnection, Path]) -> Investigation:
    return Investigation(Reader(store[0]), load_rates(), Limits(timeout_s=5.0))


def test_corpora_are_big_enough() -> None:
    assert len(HOSTILE) >= 150 and len(LEGIT) >= 50
    assert len(set(HOSTILE)) == len(HOSTILE) and len(set(LEGIT)) == len(LEGIT)


@pytest.mark.parametrize("sql", HOSTILE, ids=[f"hostile{i:03d}" for i in range(len(HOSTILE))])
def test_hostile_refused_everywhere(
    sql: str, inv: Investigation, store: tuple[duckdb.DuckDBPyConnection, Path]
) -> None:
    with pytest.raises(Refused) as refused:
        check_sql(sql)
    assert "Allowed:" in str(refused.value) and "events" in str(refused.value)
    with pytest.raises(InvestigationError) as at_boundary:
        inv.run_analysis(sql)
    message = str(at_boundary.value)
    for leak in ("Traceback", str(store[1].parent), "/etc/", "/tmp/", os.path.expanduser("~") + "/"):
        assert leak not in message


@pytest.mark.parametrize("sql", LEGIT, ids=[f"legit{i:03d}" for i in range(len(LEGIT))])
def test_legit_allowed_and_correct(
    sql: str, inv: Investigation, store: tuple[duckdb.DuckDBPyConnection, Path]
) -> None:
    answer = inv.run_analysis(sql, limit=10_000)
    cur = store[0].cursor()
    try:
        expected = cur.execute(sql).fetchall()
        columns = [d[0] for d in cur.description or []]
    finally:
        cur.close()
    assert answer["truncated"] is False and answer["row_count"] == len(expected)
    assert answer["columns"] == columns
    got = [tuple(row.values()) for row in answer["rows"]]
    want = [tuple(json_safe(v) for v in row) for row in expected]
    if "ORDER BY" in sql.upper():
        assert got == want
    else:
        assert sorted(map(repr, got)) == sorted(map(repr, want))


@pytest.mark.parametrize("sql", LEGIT, ids=[f"legit{i:03d}" for i in range(len(LEGIT))])
def test_legit_answers_the_same_in_an_analysis_worker(
    sql: str, inv: Investigation, sandboxed: Investigation
) -> None:
    here, there = inv.run_analysis(sql, limit=10_000), sandboxed.run_analysis(sql, limit=10_000)
    assert there["columns"] == here["columns"] and there["truncated"] == here["truncated"]
    if "ORDER BY" in sql.upper():
        assert there["rows"] == here["rows"]
    else:
        assert sorted(map(repr, there["rows"])) == sorted(map(repr, here["rows"]))


def test_seed_queries_answer_on_the_synthetic_store(inv: Investigation) -> None:
    per_node, chains, stragglers, quantiles = (inv.run_analysis(q)["rows"] for q in LEGIT[:4])
    assert per_node == [
        {"cluster_id": "demo-cluster", "node_id": "node-a", "events": 2000},
        {"cluster_id": "demo-cluster", "node_id": "node-b", "events": 2000},
    ]
    assert chains == [{"chains": 100}]
    assert stragglers == [{"node_id": "node-b", "straggler_events": 100}]
    assert {r["node_id"] for r in quantiles} == {"node-a", "node-b"}


def test_store_unchanged_after_both_corpora(
    inv: Investigation, store: tuple[duckdb.DuckDBPyConnection, Path]
) -> None:
    before = fingerprint(store[0])
    for sql in HOSTILE:
        with pytest.raises(InvestigationError):
            inv.run_analysis(sql)
    for sql in LEGIT:
        inv.run_analysis(sql)
    assert fingerprint(store[0]) == before
    for written in ("/tmp/leak.csv", "/tmp/leak.parquet", "/tmp/export", "/tmp/other.db"):
        assert not Path(written).exists(), f"{written} exists: something wrote outside the store"


def test_parser_and_binding_layers_refuse_what_the_lexical_layer_lets_through() -> None:
    passed_lexical, passed_parser = [], []
    for sql in HOSTILE:
        try:
            text = check_lexical(sql)
        except Refused:
            continue
        passed_lexical.append(sql)
        with pytest.raises(Refused):
            checked, tree = check_parsed(text, project_policy())
            passed_parser.append(sql)
            check_bound(checked, tree, project_policy(), twin=checked != text)
    # Homoglyphs, other schemas and unknown tables get past spelling rules: the AST walk must catch them;
    # special values (current_user: a column reference to the parser) only DuckDB's binder resolves.
    assert len(passed_lexical) >= 10
    assert "SELECT current_user" in passed_parser


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM events UNION ALL SELECT * FROM events WHERE node_id = (SELECT 'x')",
        "WITH q AS (SELECT * FROM events) SELECT * FROM q, LATERAL (SELECT * FROM schema_version) s",
        "SELECT * FROM range(3) r, LATERAL (SELECT * FROM other_db.main.t) x",
        "SELECT (SELECT count(*) FROM (SELECT * FROM information_schema.tables)) AS n",
        "SELECT * FROM events WHERE rank IN (SELECT x FROM unnest((SELECT list(rank) FROM secrets)) t(x))",
    ],
)
def test_parser_layer_checks_every_nested_relation(sql: str) -> None:
    if "UNION ALL SELECT * FROM events WHERE" in sql:
        check_parsed(sql, project_policy())  # nested reads of allowed relations are fine
        return
    with pytest.raises(Refused):
        check_parsed(sql, project_policy())


def test_sealed_read_only_instance_holds_without_the_guard(
    store: tuple[duckdb.DuckDBPyConnection, Path], tmp_path: Path
) -> None:
    before = fingerprint(store[0])
    outside = tmp_path / "leak.csv"
    attempts = [
        "DELETE FROM events",
        "UPDATE events SET rank = 0",
        "CREATE TABLE t AS SELECT 1",
        f"COPY events TO '{outside}'",
        "SELECT * FROM read_text('/etc/hostname')",
        f"ATTACH '{tmp_path / 'other.db'}' AS other",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "INSTALL httpfs",
    ]
    for sql in attempts:
        cur = store[0].cursor()
        try:
            cur.execute("BEGIN TRANSACTION READ ONLY")
            with pytest.raises(duckdb.Error):
                cur.execute(sql)
        finally:
            cur.close()
    assert fingerprint(store[0]) == before
    assert not outside.exists() and not (tmp_path / "other.db").exists()


def test_a_long_query_is_interrupted(store: tuple[duckdb.DuckDBPyConnection, Path]) -> None:
    slow = Investigation(Reader(store[0]), load_rates(), Limits(timeout_s=0.3))
    with pytest.raises(InvestigationError, match=r"ran past 0\.3 s"):
        slow.run_analysis(
            "SELECT count(*) FROM range(10000000) a, range(10000000) b WHERE (a.range + b.range) % 7 = 3"
        )
    assert slow.run_analysis("SELECT count(*) AS n FROM events")["rows"] == [{"n": 4000}]


def test_results_are_capped_with_a_truncated_flag(store: tuple[duckdb.DuckDBPyConnection, Path]) -> None:
    inv = Investigation(Reader(store[0]), load_rates(), Limits(max_bytes=20_000))
    by_rows = inv.run_analysis("SELECT event_id FROM events ORDER BY event_id", limit=10)
    assert by_rows["row_count"] == 10 and by_rows["truncated"] is True
    by_bytes = inv.run_analysis("SELECT * FROM events ORDER BY event_id", limit=10_000)
    assert 0 < by_bytes["row_count"] < 4000 and by_bytes["truncated"] is True
    whole = inv.run_analysis("SELECT count(*) AS n FROM events")
    assert whole["truncated"] is False
