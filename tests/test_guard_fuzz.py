"""Property-based fuzzing of the SQL guard: it never crashes, and nothing it lets through can write.

Statements are built from SQL fragments (write keywords, file readers, catalog functions, quotes,
comments, separators, unicode look-alikes) plus arbitrary text. For every input the guard either
returns a statement or raises ``Refused``; whatever it returns is one SELECT per DuckDB's own parser,
and running it read-only on a sealed store leaves the store unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import duckdb
import pytest
from guard_corpus.corpus import build_store, fingerprint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankecho.echo.guard import Refused, check_sql
from rankecho.echo.store.reader import QueryError, QueryTimeoutError, Reader

FRAGMENTS = [
    "SELECT",
    "select",
    "FROM",
    "events",
    "WHERE",
    "node_id",
    "rank",
    "value_double",
    "attrs_json",
    "*",
    "count(*)",
    "GROUP BY",
    "ORDER BY",
    "LIMIT 3",
    "UNION",
    "UNION ALL",
    "INTERSECT",
    "EXCEPT",
    "WITH x AS",
    "LATERAL",
    "JOIN",
    "ON true",
    "(",
    ")",
    ",",
    ";",
    "'",
    '"',
    "--",
    "/*",
    "*/",
    "\n",
    "\t",
    "$$",
    "E'",
    "INSERT INTO",
    "UPDATE",
    "SET",
    "DELETE",
    "DROP TABLE",
    "CREATE TABLE t AS",
    "COPY",
    "TO",
    "ATTACH",
    "DETACH",
    "PRAGMA",
    "CALL",
    "CHECKPOINT",
    "INSTALL",
    "LOAD",
    "EXPORT DATABASE",
    "IMPORT DATABASE",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "RESET",
    "VACUUM",
    "read_csv('/etc/passwd')",
    "read_text('x')",
    "'/etc/passwd'",
    "'s3://b/k'",
    "'https://h/x.csv'",
    "duckdb_settings()",
    "information_schema.tables",
    "getenv('HOME')",
    "current_setting('x')",
    "query('SELECT 1')",
    "glob('*')",
    "range(3)",
    "unnest([1])",
    "json_extract_string(attrs_json, '$.a')",
    "quantile_cont(value_double, 0.5)",
    "ｒｅａｄ_csv",
    "reаd_csv",
    "\u200b",
    "\u202e",
    "system.main.events",
    "schema_version",
    "AT (VERSION => 1)",
    "1",
    "'a'",
    "x",
]
token_soup = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=14).map(" ".join)
glued_soup = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=10).map("".join)
WRITES = [
    "INSERT INTO events SELECT * FROM events",
    "DELETE FROM events",
    "UPDATE events SET rank = 0",
    "DROP TABLE events",
    "CREATE TABLE t AS SELECT 1",
    "COPY events TO 'out.csv'",
    "ATTACH 'x.db'",
    "TRUNCATE events",
    "ALTER TABLE events ADD COLUMN z INT",
    "CHECKPOINT",
    "SET threads = 1",
    "INSTALL httpfs",
    "PRAGMA database_list",
    "EXPORT DATABASE 'dir'",
    "CALL pragma_version()",
]
EXPRS = [
    "node_id",
    "rank",
    "count(*)",
    "max(value_double)",
    "json_extract_string(attrs_json, '$.a')",
    "getenv('HOME')",
    "current_setting('memory_limit')",
    "(SELECT count(*) FROM read_text('/etc/hosts'))",
    "1",
    "'x'",
    "upper(node_id)",
    "nextval('s')",
    "version()",
]
SOURCES = [
    "events",
    "events e",
    "range(5) r",
    "'/etc/passwd'",
    "read_csv('/etc/passwd')",
    "duckdb_settings()",
    "(SELECT * FROM events)",
    "events, LATERAL (SELECT 1) l",
    "schema_version",
    "system.main.events",
    "glob('*')",
    "(SELECT * FROM events UNION ALL SELECT * FROM events) u",
]
TAILS = [
    "",
    " WHERE rank > 2",
    " GROUP BY ALL",
    " ORDER BY 1",
    " LIMIT 5",
    "; DROP TABLE events",
    " WHERE node_id IN (SELECT content FROM read_text('/x'))",
    " -- done",
    ";",
]
plausible_select = st.builds(
    lambda exprs, source, tail, prefix: f"{prefix}SELECT {', '.join(exprs)} FROM {source}{tail}",
    st.lists(st.sampled_from(EXPRS), min_size=1, max_size=3),
    st.sampled_from(SOURCES),
    st.sampled_from(TAILS),
    st.sampled_from(["", "WITH w AS (SELECT 1) ", "/* c */ ", "EXPLAIN "]),
)
wrapped_write = st.tuples(
    st.sampled_from(["", "SELECT 1;", "/* c */", "-- c\n", " ", "WITH x AS (SELECT 1) ", "SELECT 1; ;"]),
    st.sampled_from(WRITES),
    st.sampled_from(["", ";", "; SELECT 1", " -- tail", "/* */"]),
).map("".join)


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    con = build_store(tmp_path_factory.mktemp("fuzz") / "echo.db")
    yield con
    con.close()


ALLOWED_SEEN: list[str] = []


def _run_if_allowed(sql: str, reader: Reader) -> None:
    try:
        statement = check_sql(sql)
    except Refused:
        return
    ALLOWED_SEEN.append(statement)
    parsed = duckdb.extract_statements(statement)
    assert len(parsed) == 1 and parsed[0].type == duckdb.StatementType.SELECT, sql
    with contextlib.suppress(QueryError, QueryTimeoutError):  # a failing SELECT is fine
        reader.query(statement, timeout_s=2.0, max_rows=50)


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,  # CI must see the same examples every run; the strategies still cover the space
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(sql=st.one_of(plausible_select, token_soup, glued_soup, st.text(max_size=200)))
def test_guard_never_crashes_and_only_passes_single_selects(
    sql: str, sealed: duckdb.DuckDBPyConnection
) -> None:
    _run_if_allowed(sql, Reader(sealed))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(sql=wrapped_write)
def test_no_write_form_is_ever_allowed(sql: str) -> None:
    with pytest.raises(Refused):
        check_sql(sql)


def test_store_unchanged_after_fuzzing(sealed: duckdb.DuckDBPyConnection) -> None:
    before = fingerprint(sealed)
    ALLOWED_SEEN.clear()
    test_guard_never_crashes_and_only_passes_single_selects(sealed=sealed)
    assert fingerprint(sealed) == before
    assert len(set(ALLOWED_SEEN)) >= 10, "the fuzzer should also reach the execution path"
