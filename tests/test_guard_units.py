"""Each piece of the SQL guard on its own, with exact expected values (issue 13's mutation triage).

The corpus and layer tests show that the guard as a whole refuses hostile SQL; they cannot tell which
rule refused it, so a rule that is weakened while another still catches the query goes unnoticed (the
layers overlap by design). These tests call each function directly (the lexical scanner, the literal
blanker, the PIVOT twin, the constant folding of the size limits, the AST walk, the policy) and check
the exact value or the exact refusal reason. They are table-driven and fast: the mutation run
(``scripts/mutation.py guard``) executes them for every mutant. Parsing uses DuckDB's real parser.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest

from rankecho.echo.guard import Policy, Refused, check_sql, project_policy
from rankecho.echo.guard.check import check_sql_uncached
from rankecho.echo.guard.instance import open_sealed, seal
from rankecho.echo.guard.lexical import (
    MAX_QUERY_CHARS,
    _invisible,
    _quoted_source,
    check_lexical,
    path_like,
)
from rankecho.echo.guard.limits import _apply, _arguments, _count, check_sizes, number, range_size
from rankecho.echo.guard.parsed import _parser, _safe, _walk, check_parsed, serialize
from rankecho.echo.guard.pivot import static_twin
from rankecho.echo.guard.policy import DEFAULT_TABLE_FUNCTIONS, is_denied
from rankecho.echo.guard.refusal import ALLOWED, safe_message
from rankecho.echo.guard.tokens import tokens

POLICY = project_policy()


def reason(check: Callable[[], object]) -> str:
    """The reason of the refusal ``check()`` raises (fails the test when it returns)."""
    with pytest.raises(Refused) as refused:
        check()
    return refused.value.reason


# --- lexical layer -------------------------------------------------------------------------------

FILE_READERS = "file readers (read_* / sniff_* / parquet_* / glob) are not allowed"
QUOTED_SOURCE = "a quoted string cannot be a FROM source (that would read a file)"
NON_ASCII = (
    "names outside quotes must be plain ASCII (a look-alike letter can hide a function): "
    'double-quote names such as "métrique"'
)
QUOTED_NAME = "a quoted table name must be a plain name (a replacement scan would read it as a file)"
ESCAPE = "escape-string literals (E'...') are not allowed; use plain '...' strings"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1", "SELECT 1"),
        ("SELECT 1;", "SELECT 1"),
        ("  SELECT 1 ;  ", "SELECT 1"),
        ("\tSELECT 1\n", "SELECT 1"),
        ("SELECT ';'", "SELECT ';'"),
        ('SELECT 1 AS "ｘ"', 'SELECT 1 AS "x"'),  # full-width letters collapse to ASCII (NFKC)
        ('SELECT "métrique" FROM events', 'SELECT "métrique" FROM events'),
        ("SELECT 'ＳＥＴ' AS x", "SELECT 'SET' AS x"),
        ("SELECT 1 AS load", "SELECT 1 AS load"),  # a keyword as a name, not a statement
        (
            "SELECT * FROM events WHERE metric_name = 'update'",
            "SELECT * FROM events WHERE metric_name = 'update'",
        ),
        ("SELECT trim(both 'x' FROM 'xax')", "SELECT trim(both 'x' FROM 'xax')"),
        (
            "SELECT count(*) FROM events WHERE node_id IS DISTINCT FROM 'node-a'",
            "SELECT count(*) FROM events WHERE node_id IS DISTINCT FROM 'node-a'",
        ),
        ("SELECT 1" + " " * (MAX_QUERY_CHARS - 8), "SELECT 1"),  # exactly at the limit
    ],
)
def test_check_lexical_returns_the_normalised_text(sql: str, expected: str) -> None:
    assert check_lexical(sql) == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("", "the query is empty"),
        (" \n\t ", "the query is empty"),
        ("SELECT 1" + " " * (MAX_QUERY_CHARS - 7), f"the query is longer than {MAX_QUERY_CHARS} characters"),
        ("SELECT 1\x00", "the query contains control, invisible or bidirectional characters"),
        ("SELECT\u200b1", "the query contains control, invisible or bidirectional characters"),
        ("SELECT * FROM read_csv('/etc/passwd')", FILE_READERS),
        ("SELECT ｒｅａｄ_csv('x')", FILE_READERS),  # spelled in full-width: found after NFKC
        ("SELECT current_setting('threads')", "DuckDB catalog and settings introspection is not allowed"),
        ("SELECT 1; DELETE FROM events", "'DELETE' statements and clauses are not allowed"),
        ("select 1; drop table events", "'DROP' statements and clauses are not allowed"),
        ("explain SELECT 1", "'EXPLAIN' statements are not allowed"),
        ("SET threads = 1", "'SET' statements are not allowed"),
        ("SELECT * FROM (SHOW TABLES)", "'SHOW' statements are not allowed"),
        ("SELECT * FROM events, ( describe events)", "'DESCRIBE' statements are not allowed"),
        ("FROM (SUMMARIZE events)", "'SUMMARIZE' statements are not allowed"),
        ("SELECT * FROM 'x.csv'", QUOTED_SOURCE),
        ("SELECT 1 WHERE EXISTS (SELECT * FROM 'x.csv')", QUOTED_SOURCE),
        ("SELECT mé FROM events", NON_ASCII),
        ('SELECT "/a/b" FROM events', "quoted names that look like paths or URLs are not allowed"),
        ('SELECT 1 AS "x.parquet"', "quoted names that look like paths or URLs are not allowed"),
        ("SELECT $$x$$", "dollar-quoted literals ($$...$$) are not allowed; use plain '...' strings"),
        ("SELECT U&'\\0061'", "unicode-escape literals and names (U&'...') are not allowed"),
        ('SELECT * FROM "events/s"', QUOTED_NAME),
        ("WITH x AS (SELECT 1) DELETE FROM events", "'DELETE' statements and clauses are not allowed"),
        ("SELECT E'\\x41'", ESCAPE),
    ],
)
def test_check_lexical_refuses_with_the_rule_that_fired(sql: str, expected: str) -> None:
    assert reason(lambda: check_lexical(sql)) == expected


@pytest.mark.parametrize(
    ("ch", "invisible"),
    [
        ("\t", False),
        ("\n", False),
        ("\r", False),
        ("a", False),
        (" ", False),
        ("é", False),
        ("\x00", True),
        ("\x1b", True),  # Cc
        ("\u200b", True),
        ("\u202e", True),  # Cf (zero width space, right-to-left override)
        ("\ud800", True),  # Cs
        ("\ue000", True),  # Co
        ("\u0378", True),  # Cn
        ("\u2028", True),  # Zl
        ("\u2029", True),  # Zp
    ],
)
def test_invisible_characters(ch: str, invisible: bool) -> None:
    assert _invisible(ch) is invisible


@pytest.mark.parametrize(
    ("text", "kinds"),
    [
        ("SELECT 'ab', x", [("SELECT", "keyword"), ("'ab'", "string"), (",", "operator"), ("x", "name")]),
        ("SELECT 'it''s' -- note\nFROM t", [("SELECT", "keyword"), ("'it''s'", "string"), ("FROM", "keyword"),
                                            ("t", "name")]),
        ("SELECT /* a /* b */ c */ 1", [("SELECT", "keyword"), ("1", "number")]),  # nested comment
        ('SELECT "a""b" AS load', [("SELECT", "keyword"), ('"a""b"', "name"), ("AS", "keyword"),
                                   ("load", "keyword")]),
        ("SELECT e'x'", [("SELECT", "keyword"), ("e'x'", "string")]),
        ("SELECT x/*c*/FROM t", [("SELECT", "keyword"), ("x", "name"), ("FROM", "keyword"), ("t", "name")]),
    ],
)
def test_tokens_are_duckdbs(text: str, kinds: list[tuple[str, str]]) -> None:
    assert [(t.text, t.kind) for t in tokens(text)] == kinds


def test_token_names_and_comments() -> None:
    quoted = tokens('SELECT "a""b", "x')
    assert [t.name for t in quoted] == ["SELECT", 'a"b', ",", "x"]
    assert [t.quoted for t in quoted] == [False, True, False, True]
    assert [t.kind for t in tokens("SELECT 1 -- c", comments=True)] == ["keyword", "number", "comment"]
    assert tokens("SELECT  x")[1].start == 8 and tokens("SELECT  x ")[1].end == 9


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("/etc/passwd", True),
        ("~/x", True),
        ("\\\\host\\x", True),
        ("./x", True),
        ("../x", True),
        ("C:x", True),
        ("s3://b/k", True),
        ("a.parquet", True),
        ("A.CSV", True),
        ("events/s", False),
        ("rankecho.health.score", False),
        ("GB/s", False),
        ("ab:c", False),
        ("", False),
    ],
)
def test_path_like(name: str, path: bool) -> None:
    assert path_like(name) is path


@pytest.mark.parametrize(
    ("sql", "quoted"),
    [
        ("SELECT * FROM 'x.csv'", True),
        ("SELECT * FROM events, 'x.csv'", True),
        ("SELECT * FROM events JOIN 'x.csv' ON true", True),
        ("SELECT * FROM a JOIN b ON true JOIN 'x.csv' ON true", True),
        ("SELECT * FROM ('x.csv')", True),
        ("SELECT * FROM events e JOIN ('a.csv') ON true", True),
        ("SELECT * FROM events e, LATERAL ('x.csv')", True),
        ("SELECT * /* c */ FROM 'x.csv'", True),
        ("SELECT * FROM events, /* c */ ('x.csv')", True),
        ("SELECT * FROM events, -- c\n ('x.csv')", True),
        ("SELECT upper('a') FROM 'x.csv'", True),
        ("SELECT 1) FROM 'x.csv'", True),  # an unbalanced ')' does not pop the top level
        ("SELECT * FROM events WHERE rank IN (SELECT 1 FROM 'x.csv')", True),
        ("WITH t AS (SELECT * FROM 'x.csv') SELECT * FROM t", True),
        ("SELECT 1 WHERE EXISTS (SELECT * FROM 'x.csv')", True),
        ("SELECT * FROM (SELECT 1 WHERE EXISTS (SELECT 1 FROM 'x.csv')) t", True),
        ("WITH t AS MATERIALIZED (FROM 'x.csv') SELECT * FROM t", True),
        ("PIVOT (events JOIN 'x.csv' ON true) ON metric_name USING count(*)", True),
        ("SELECT NOT EXISTS (FROM 'x.csv')", True),
        ("SELECT ARRAY(WITH a AS (SELECT 1) FROM 'x.csv')", True),
        ("SELECT 1 WHERE true AND (SELECT count(*) FROM 'x.csv') > 0", True),
        ("SELECT CASE WHEN true THEN (SELECT 1 FROM 'x.csv') END", True),
        ("SELECT 'x'", False),
        ("SELECT * FROM events", False),
        ("SELECT * FROM events WHERE node_id = 'x'", False),
        ("SELECT * FROM (SELECT 'x') t", False),
        ("SELECT 1 -- FROM 'x.csv'\n", False),
        ("(SELECT 'x')", False),
        ("SELECT extract(epoch FROM '2024-01-01'::TIMESTAMP)", False),
        ("SELECT trim(both 'x' FROM 'xax')", False),
        ("SELECT \"trim\"(both 'x' FROM 'xax')", False),
        ("SELECT _trim(both 'x' FROM 'xax')", False),
        ("SELECT a_trim(both 'x' FROM 'xax')", False),
        ("SELECT trim(FROM '  x  ')", False),
        ("SELECT TRIM(FROM '  x  ')", False),
        ("SELECT coalesce(a, ('x')) FROM events", False),
        ("SELECT * FROM unnest(['a.csv'])", False),
        ("SELECT ARRAY(VALUES ('x'))", False),
        ("SELECT count(*) FILTER (WHERE node_id IS DISTINCT FROM 'a') FROM events", False),
        ("SELECT * FROM events WHERE node_id IS DISTINCT FROM 'a'", False),
    ],
)
def test_quoted_source(sql: str, quoted: bool) -> None:
    assert (_quoted_source(tokens(sql)) is not None) is quoted


# --- dynamic PIVOT -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "twin"),
    [
        (
            "PIVOT events ON metric_name USING avg(value_double)",
            "PIVOT events ON metric_name IN (NULL) USING avg(value_double)",
        ),
        (
            "pivot events on metric_name using count(*)",
            "pivot events on metric_name IN (NULL) using count(*)",
        ),
        ("PIVOT_WIDER events ON metric_name", "PIVOT_WIDER events ON metric_name IN (NULL)"),
        ("PIVOT events ON metric_name;", "PIVOT events ON metric_name IN (NULL);"),
        (
            "PIVOT events ON metric_name, node_id USING count(*)",
            "PIVOT events ON metric_name IN (NULL), node_id IN (NULL) USING count(*)",
        ),
        (
            "PIVOT events ON metric_name IN ('a', 'b'), node_id USING count(*)",
            "PIVOT events ON metric_name IN ('a', 'b'), node_id IN (NULL) USING count(*)",
        ),
        (
            "PIVOT events ON metric_name, node_id in ('a') GROUP BY rank",
            "PIVOT events ON metric_name IN (NULL), node_id in ('a') GROUP BY rank",
        ),
        (
            "PIVOT events ON (rank IN (1, 2)) USING count(*)",
            "PIVOT events ON (rank IN (1, 2)) IN (NULL) USING count(*)",
        ),
        ("PIVOT events ON coalesce(a, b) ORDER BY 1", "PIVOT events ON coalesce(a, b) IN (NULL) ORDER BY 1"),
        (
            "PIVOT (events) ON metric_name USING count(*)",
            "PIVOT (events) ON metric_name IN (NULL) USING count(*)",
        ),
        (
            "PIVOT ((events)) ON metric_name USING count(*)",
            "PIVOT ((events)) ON metric_name IN (NULL) USING count(*)",
        ),
        (
            "PIVOT events ON metric_name /* c */ USING count(*)",
            "PIVOT events ON metric_name IN (NULL) /* c */ USING count(*)",
        ),
        (
            "PIVOT (SELECT * FROM events a JOIN events b ON true) ON a.metric_name USING count(*)",
            "PIVOT (SELECT * FROM events a JOIN events b ON true) ON a.metric_name IN (NULL) USING count(*)",
        ),
        (
            "PIVOT events /* ON x */ ON metric_name -- c\n USING count(*)",
            "PIVOT events /* ON x */ ON metric_name IN (NULL) -- c\n USING count(*)",
        ),
        (
            "SELECT * FROM (PIVOT events ON metric_name USING count(*)) a, "
            "(PIVOT events ON node_id USING count(*)) b",
            "SELECT * FROM (PIVOT events ON metric_name IN (NULL) USING count(*)) a, "
            "(PIVOT events ON node_id IN (NULL) USING count(*)) b",
        ),
        (
            "SELECT * FROM (PIVOT events ON metric_name) t",
            "SELECT * FROM (PIVOT events ON metric_name IN (NULL)) t",
        ),
        ("SELECT 1", None),
        ("PIVOT events ON metric_name IN ('a') USING count(*)", None),
        ("PIVOT events; ON metric_name", None),
        ("SELECT (PIVOT events) ON metric_name", None),
    ],
)
def test_static_twin(sql: str, twin: str | None) -> None:
    assert static_twin(sql) == twin


# --- constant sizes ------------------------------------------------------------------------------


def _expr(sql: str) -> dict[str, Any]:
    node: dict[str, Any] = serialize(f"SELECT {sql}")["statements"][0]["node"]["select_list"][0]
    return node


@pytest.mark.parametrize(
    ("sql", "value"),
    [
        ("5", 5.0),
        ("-5", -5.0),
        ("2.5", 2.5),
        ("1e3", 1000.0),
        ("+(5)", 5.0),
        ("-(2 + 3)", -5.0),
        ("CAST(7 AS INTEGER)", 7.0),
        ("7::BIGINT", 7.0),
        ("3 + 4", 7.0),
        ("2 - 3", -1.0),
        ("6 * 7", 42.0),
        ("8 / 2", 4.0),
        ("10 // 4", 2.5),
        ("(2 + 3) * 4", 20.0),
        ("1 / 0", None),
        ("rank + 1", None),
        ("1 + rank", None),
        ("'abc'", None),
        ("NULL", None),
        ("abs(-5)", None),
        ("5 % 2", None),
        ("upper('a')", None),
    ],
)
def test_number_folds_constant_arithmetic(sql: str, value: float | None) -> None:
    assert number(_expr(sql)) == value


def test_number_on_shapes_duckdb_does_not_produce() -> None:
    one = {"class": "CONSTANT", "literal": {"text": "1"}}
    two = {"class": "CONSTANT", "literal": {"text": "2"}}
    assert number(None) is None and number("5") is None
    assert number({"class": "CONSTANT", "literal": "5"}) is None
    assert (
        number({"class": "FUNCTION", "is_operator": True, "function_name": "+", "children": [one, two]})
        == 3.0
    )
    assert number({"class": "FUNCTION", "is_operator": True, "function_name": "+", "arguments": []}) is None
    assert (
        number({"class": "FUNCTION", "is_operator": True, "function_name": "+", "arguments": [1, 2]}) is None
    )


@pytest.mark.parametrize(
    ("op", "values", "result"),
    [
        ("-", [5.0], -5.0),
        ("+", [5.0], 5.0),
        ("+", [2.0, 3.0], 5.0),
        ("-", [2.0, 3.0], -1.0),
        ("*", [2.0, 3.0], 6.0),
        ("/", [3.0, 2.0], 1.5),
        ("//", [3.0, 2.0], 1.5),
        ("/", [3.0, 0.0], None),
    ],
)
def test_apply(op: str, values: list[float], result: float | None) -> None:
    assert _apply(op, values) == result


def test_arguments() -> None:
    assert _arguments({"arguments": [{"expression": 1}]}) == [{"expression": 1}]
    assert _arguments({"children": [1, 2]}) == [{"expression": 1}, {"expression": 2}]
    assert _arguments({"arguments": "x", "children": None}) == []
    assert _arguments({}) == []


@pytest.mark.parametrize(
    ("values", "size"),
    [
        ([], None),
        ([None], None),
        ([1.0, None], None),
        ([5.0], 5.0),
        ([2.0, 10.0], 8.0),
        ([10.0, 2.0], 0.0),
        ([0.0, 10.0, 2.0], 5.0),
        ([10.0, 0.0, -2.0], 5.0),
        ([0.0, 10.0, 2.0, 7.0], 5.0),
        ([0.0, 10.0, 0.0], math.inf),
        ([0.0, math.inf], math.inf),
        ([math.nan], math.inf),
    ],
)
def test_range_size(values: list[float | None], size: float | None) -> None:
    assert range_size(values) == size


RANGE_TAIL = "more than 10,000,000: use a smaller range, or read the rows you need from the tables instead"
REPEAT_TAIL = "more than 1,000,000: use a smaller count (results are capped at a few MB anyway)"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("range(10000001)", f"range() would produce 10,000,001 values, {RANGE_TAIL}"),
        ("RANGE(0, 20000000)", f"range() would produce 20,000,000 values, {RANGE_TAIL}"),
        ("generate_series(0, 2e7, 1)", f"generate_series() would produce 20,000,000 values, {RANGE_TAIL}"),
        ("range(0, 10, 0)", f"range() would produce unboundedly many values, {RANGE_TAIL}"),
        ("repeat('a', 1000001)", f"repeat() asks for 1,000,001 repetitions, {REPEAT_TAIL}"),
        ("lpad('x', 2000000, 'y')", f"lpad() asks for 2,000,000 repetitions, {REPEAT_TAIL}"),
        ("rpad('x', 1e7, 'y')", f"rpad() asks for 10,000,000 repetitions, {REPEAT_TAIL}"),
        ("list_resize([1], 1e12)", f"list_resize() asks for 1,000,000,000,000 repetitions, {REPEAT_TAIL}"),
        ("array_resize([1], 2e6)", f"array_resize() asks for 2,000,000 repetitions, {REPEAT_TAIL}"),
    ],
)
def test_check_sizes_refuses_with_the_size(sql: str, expected: str) -> None:
    node = _expr(sql)
    assert reason(lambda: check_sizes(node["function_name"], node)) == expected
    assert reason(lambda: check_parsed(f"SELECT {sql}", POLICY)) == expected


@pytest.mark.parametrize(
    "sql",
    [
        "range(10000000)",
        "generate_series(0, 10000000)",
        "range(rank)",
        "repeat('a', 1000000)",
        "repeat('a', rank)",
        "repeat('a')",
        "upper('a')",
        "lpad('x', 5, 'y')",
    ],
)
def test_check_sizes_allows_what_is_within_the_limits(sql: str) -> None:
    node = _expr(sql)
    check_sizes(node["function_name"], node)


def test_check_sizes_ignores_arguments_it_cannot_read() -> None:
    check_sizes("repeat", {"arguments": ["x", 10**9]})  # no crash: only a refusal or nothing


def test_count() -> None:
    assert _count(1234567.4) == "1,234,567"
    assert _count(math.inf) == "unboundedly many"


# --- parser layer --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM events",
        "SELECT * FROM EVENTS",
        "SELECT * FROM main.events",
        "SELECT 1, abs(-2), row_number() OVER () FROM events",
        "SELECT node_id.upper() FROM events",  # method-call syntax: a schema that is a column
        "SELECT * FROM range(3) t(x)",
        "SELECT * FROM RANGE(3)",
        "WITH Q AS (SELECT 1) SELECT * FROM q",
        "WITH q AS (SELECT 1) SELECT * FROM Q",
        "WITH a AS (SELECT 1 AS x) SELECT * FROM range((SELECT count(*) FROM a))",
        "WITH a AS (SELECT 1 AS x) SELECT (SELECT x FROM a), * FROM events",
        "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 3) SELECT * FROM t",
        "WITH RECURSIVE T(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 3) SELECT * FROM t",
        "PIVOT events ON metric_name USING count(*)",
        "SELECT * FROM events USING SAMPLE 5",
    ],
)
def test_check_parsed_allows(sql: str) -> None:
    check_parsed(sql, POLICY)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1; SELECT 2", "exactly one statement is allowed, got 2"),
        ("", "exactly one statement is allowed, got 0"),
        ("UPDATE EXTENSIONS", "only SELECT statements are allowed"),
        ("UPDATE events SET rank = 1", "only SELECT statements are allowed, got UPDATE"),
        (
            "PIVOT events ON metric_name IN (SELECT 'a') USING count(*)",
            "only SELECT statements are allowed, got MULTI",
        ),
        (
            "PIVOT events ON rank > 2 USING count(*)",
            "this PIVOT could not be checked (only SELECT statements are allowed, got MULTI); "
            "list the values instead: ON metric_name IN ('a', 'b')",
        ),
        ("SELECT * FROM secrets", "unknown table 'secrets'"),
        ("SELECT * FROM other.events", "only the main schema of this database can be read"),
        ("SELECT * FROM db.main.events", "only the main schema of this database can be read"),
        ("SELECT * FROM events AT (VERSION => 1)", "time-travel (AT ...) clauses are not allowed"),
        ('SELECT * FROM "a b"', "a table name must be a plain identifier (files and URLs cannot be read)"),
        ("SELECT 1 UNION SELECT * FROM secrets", "unknown table 'secrets'"),
        ("WITH a AS (SELECT * FROM secrets) SELECT 1", "unknown table 'secrets'"),
        (
            "WITH RECURSIVE t AS (SELECT 1 UNION ALL SELECT * FROM secrets) SELECT * FROM t",
            "unknown table 'secrets'",
        ),
        ("SELECT * FROM range((SELECT count(*) FROM secrets))", "unknown table 'secrets'"),
        ("SELECT my_udf(1)", "function 'my_udf' is not allowed"),
        ("SELECT 1, getenv('HOME')", "function 'getenv' is not allowed"),
        ("SELECT my_window() OVER ()", "function 'my_window' is not allowed"),
        ('SELECT "fünf"(1)', "function 'f?nf' is not allowed"),
        ("SELECT main.upper('a')", "qualified function names are not allowed ('upper')"),
        ("SELECT MAIN.upper('a')", "qualified function names are not allowed ('upper')"),
        ("SELECT system.main.upper('a')", "qualified function names are not allowed ('upper')"),
        ("SELECT * FROM read_csv('x.csv')", "table function 'read_csv' is not allowed"),
        ("SELECT * FROM main.range(3)", "table function 'range' is not allowed"),
        ("SELECT * FROM system.main.range(3)", "table function 'range' is not allowed"),
        ("SELECT " + "1+" * 900 + "1", "the query is too deeply nested"),
    ],
)
def test_check_parsed_refuses_with_the_rule_that_fired(sql: str, expected: str) -> None:
    assert reason(lambda: check_parsed(sql, POLICY)) == expected


def test_check_parsed_names_duckdbs_parse_error() -> None:
    got = reason(lambda: check_parsed("SELEC 1", POLICY))
    assert got.startswith('DuckDB cannot parse the query (Parser Error: syntax error at or near "SELEC"'), got
    long = reason(lambda: check_parsed("SELEC" + "T" * 300, POLICY))  # the first line of the error, cut
    assert long.startswith(
        "DuckDB cannot parse the query (Parser Error: syntax error at or near"
    ) and long.endswith("TTT)")
    assert len(long) == len("DuckDB cannot parse the query ()") + 160


def test_deep_nesting_is_refused_not_a_crash() -> None:
    """Reading DuckDB's tree of a deeply nested expression runs out of stack: a refusal, never a crash;
    parentheses alone add no depth to the tree and are fine."""
    assert (
        reason(lambda: serialize("SELECT " + "[" * 400 + "1" + "]" * 400)) == "the query is too deeply nested"
    )
    check_parsed("SELECT " + "(" * 900 + "1" + ")" * 900, POLICY)


RANGE_FN = {"class": "FUNCTION", "function_name": "range", "schema": "", "catalog": "", "arguments": []}


def table(name: str) -> dict[str, str]:
    return {"type": "BASE_TABLE", "table_name": name, "schema_name": "", "catalog_name": ""}


SECRETS = table("secrets")


@pytest.mark.parametrize(
    ("tree", "expected"),
    [
        ({"type": "INSERT_NODE"}, "insert node is not allowed"),
        ({"class": "BOUND_REF"}, "bound_ref expressions are not allowed"),
        ({"type": "SELECT_NODE", "cte_map": {"map": ["x"]}}, "this kind of WITH clause is not allowed"),
        (
            {"type": "TABLE_FUNCTION", "function": {"class": "CONSTANT"}},
            "this kind of table function call is not allowed",
        ),
        ({"type": "TABLE_FUNCTION", "function": "range"}, "this kind of table function call is not allowed"),
        (
            {"type": "TABLE_FUNCTION", "function": {**RANGE_FN, "catalog": "other"}},
            "table function 'range' is not allowed",
        ),
        ({"type": "TABLE_FUNCTION", "function": RANGE_FN, "sample": SECRETS}, "unknown table 'secrets'"),
        (
            {
                "type": "TABLE_FUNCTION",
                "function": RANGE_FN,
                "extra": [{"class": "FUNCTION", "function_name": "getenv"}],
            },
            "function 'getenv' is not allowed",
        ),
        (
            {"type": "SELECT_NODE", "from_table": {**SECRETS, "catalog_name": "x", "schema_name": "main"}},
            "only the main schema of this database can be read",
        ),
        # A missing name is the empty name: it neither matches an allowed name nor defines one.
        ({"class": "FUNCTION"}, "function '' is not allowed"),
        (
            {"class": "FUNCTION", "function_name": "upper", "catalog": "x", "schema": ""},
            "qualified function names are not allowed ('upper')",
        ),
        (
            {"type": "BASE_TABLE", "schema_name": ""},
            "a table name must be a plain identifier (files and URLs cannot be read)",
        ),
        ({"type": "TABLE_FUNCTION", "function": {"class": "FUNCTION"}}, "table function '' is not allowed"),
        ({"type": "RECURSIVE_CTE_NODE", "right": table("xxxx")}, "unknown table 'xxxx'"),
        ({"type": "RECURSIVE_CTE_NODE", "right": table("none")}, "unknown table 'none'"),
        (
            {"type": "SELECT_NODE", "cte_map": {"map": [{"value": {}}]}, "from_table": table("xxxx")},
            "unknown table 'xxxx'",
        ),
        (
            {"type": "SELECT_NODE", "cte_map": {"map": [{"value": {}}]}, "from_table": table("none")},
            "unknown table 'none'",
        ),
    ],
)
def test_walk_refuses_hand_built_trees(tree: dict[str, Any], expected: str) -> None:
    """Shapes DuckDB does not produce today: the walk is fail-closed, whatever a later release puts where."""
    assert reason(lambda: _walk(tree, POLICY, frozenset())) == expected


def test_walk_allows_hand_built_trees_without_optional_parts() -> None:
    _walk({"type": "SELECT_NODE", "cte_map": {}}, POLICY, frozenset())
    _walk({"type": "SELECT_NODE", "cte_map": {"map": []}, "select_list": [RANGE_FN]}, POLICY, frozenset())


def test_each_thread_parses_with_its_own_connection() -> None:
    """The parser's private connection is per thread: a new thread opens its own, never shares one."""
    errors: list[BaseException] = []

    def work() -> None:
        try:
            con = _parser()
            assert _parser() is con  # opened once per thread, then reused
            assert con.execute("SELECT current_setting('enable_external_access')").fetchall() == [(False,)]
            paths = con.execute("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchall()
            assert paths == [(None,)]  # in memory: parsing writes no file
            check_parsed("SELECT count(*) FROM events", POLICY)
            assert reason(lambda: check_parsed("SELECT * FROM secrets", POLICY)) == "unknown table 'secrets'"
        except BaseException as error:  # handed to the main thread
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors and not any(thread.is_alive() for thread in threads)


def test_safe_shortens_and_masks_names() -> None:
    assert _safe("a\x01ü" + "x" * 70) == "'a??" + "x" * 57 + "'"
    assert _safe("plain") == "'plain'"


# --- policy, the entry point, the sealed instance, refusal messages --------------------------------


def test_every_allowed_table_function_is_an_allowed_function_name() -> None:
    """Why the walk may see a table function's call node as an expression too (unnest, range as scalars)."""
    assert all(POLICY.allows_function(name) for name in POLICY.table_functions)


def test_policy_for_relations() -> None:
    policy = Policy.for_relations(["Events", "b"], ["My_Macro"], ["Proj_F"])
    assert policy.relations == frozenset({"events", "b"})
    assert policy.table_functions == DEFAULT_TABLE_FUNCTIONS | {"my_macro"}
    assert policy.project_functions == frozenset({"proj_f"})
    assert Policy.for_relations([]) == Policy(frozenset(), DEFAULT_TABLE_FUNCTIONS, frozenset())
    assert policy.allows_relation("EVENTS") and not policy.allows_relation("c")
    assert policy.allows_table_function("MY_MACRO") and policy.allows_table_function("range")
    assert not policy.allows_table_function("read_csv")
    for name in ("quantile_cont", "QUANTILE_CONT", "my_macro", "proj_f", "unnest"):
        assert policy.allows_function(name), name
    for name in ("getenv", "GETENV", "read_csv", "my_udf", "current_setting"):
        assert not policy.allows_function(name), name


@pytest.mark.parametrize(
    ("args", "bad"),
    [
        ((["a b"],), "['a b']"),
        ((["ok"], ["x-y"]), "['x-y']"),
        ((["ok"], [], ["f()"]), "['f()']"),
        ((["a b"], ["x-y"], ["f()"]), "['a b', 'f()', 'x-y']"),
    ],
)
def test_policy_refuses_names_that_are_not_identifiers(args: tuple[list[str], ...], bad: str) -> None:
    with pytest.raises(ValueError) as error:
        Policy.for_relations(*args)
    assert str(error.value) == f"relation and function names must be plain identifiers, got {bad}"


def test_is_denied() -> None:
    assert is_denied("getenv") and is_denied("GETENV") and is_denied("read_parquet") and is_denied("Pragma_x")
    assert not is_denied("abs") and not is_denied("readme")


def test_allowed_text() -> None:
    tables = "generate_series, json_each, json_tree, range, unnest"
    assert Policy.for_relations([]).allowed_text() == ALLOWED.format(
        relations="(none)", table_functions=tables
    )
    assert Policy.for_relations(["b", "a"]).allowed_text() == ALLOWED.format(
        relations="a, b", table_functions=tables
    )


def test_check_sql_entry_point() -> None:
    narrow = Policy.for_relations(["x"])
    with pytest.raises(Refused) as refused:
        check_sql(123)  # type: ignore[arg-type]
    assert (refused.value.reason, refused.value.allowed) == (
        "the query must be a string",
        POLICY.allowed_text(),
    )
    with pytest.raises(Refused) as refused:
        check_sql(None, narrow)  # type: ignore[arg-type]
    assert refused.value.allowed == narrow.allowed_text()
    assert check_sql("SELECT * FROM x;", narrow) == "SELECT * FROM x"
    with pytest.raises(Refused) as refused:
        check_sql_uncached("SELECT * FROM events", narrow)
    assert (refused.value.reason, refused.value.allowed) == ("unknown table 'events'", narrow.allowed_text())
    with pytest.raises(Refused) as refused:
        check_sql_uncached("SELECT * FROM read_csv('a')", narrow)
    assert (refused.value.reason, refused.value.allowed) == (FILE_READERS, narrow.allowed_text())


def test_refused_message() -> None:
    assert str(Refused("no")) == "query refused: no."
    assert str(Refused("no", "Allowed: x")) == "query refused: no. Allowed: x"
    assert (Refused("no", "a").reason, Refused("no", "a").allowed) == ("no", "a")


def test_safe_message() -> None:
    error = ValueError("IO Error: cannot open /home/u/secret.db\n  line two\n\n3\n4\n5")
    assert safe_message(error) == "IO Error: cannot open <path> line two 3"  # the first four lines only
    assert safe_message(ValueError("x" * 500)) == "x" * 400
    assert safe_message(ValueError("")) == "ValueError"


def test_seal_and_open_sealed(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
    with pytest.raises(FileNotFoundError) as missing:
        open_sealed(tmp_path / "none.db")
    assert (
        str(missing.value)
        == f"no database file at {tmp_path / 'none.db'}: pass the path of an Echo store (echo.db)"
    )
    con = open_sealed(path, memory_limit="300MB")
    try:
        settings = con.execute(
            "SELECT current_setting('enable_external_access'), current_setting('lock_configuration'), "
            "current_setting('memory_limit')"
        ).fetchall()
        assert settings[0][:2] == (False, True) and settings[0][2].startswith("286")  # 300 MB in MiB
        assert con.execute("SELECT x FROM t").fetchall() == [(1,)]
        with pytest.raises(duckdb.Error):
            con.execute("CREATE TABLE u AS SELECT 1")
    finally:
        con.close()
    with duckdb.connect(":memory:") as mem:
        seal(mem)
        with pytest.raises(duckdb.Error):
            mem.execute("SET enable_external_access = true")
