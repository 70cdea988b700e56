"""The parser layer's contract with DuckDB: the JSON AST shape it relies on (pinned here so a DuckDB
upgrade that changes it fails loudly), and that anything it does not know is refused (fail closed)."""

from __future__ import annotations

from typing import Any

import pytest

from rankecho.echo.guard import Refused, project_policy
from rankecho.echo.guard.parsed import _walk, check_parsed, serialize


def _node(sql: str) -> dict[str, Any]:
    node: dict[str, Any] = serialize(sql)["statements"][0]["node"]
    return node


def test_ast_shape_the_walk_relies_on() -> None:
    select = _node("SELECT node_id FROM events WHERE rank = 1")
    assert select["type"] == "SELECT_NODE"
    assert select["from_table"]["type"] == "BASE_TABLE" and select["from_table"]["table_name"] == "events"
    assert select["where_clause"]["class"] == "COMPARISON"
    function = _node("SELECT * FROM range(3)")["from_table"]
    assert function["type"] == "TABLE_FUNCTION" and function["function"]["function_name"] == "range"
    union = _node("SELECT 1 UNION SELECT 2")
    assert union["type"] == "SET_OPERATION_NODE"
    cte = _node("WITH x AS (SELECT 1) SELECT * FROM x")
    assert cte["cte_map"]["map"][0]["key"] == "x"
    lateral = _node("SELECT * FROM events e, LATERAL (SELECT 1) l")["from_table"]
    assert lateral["type"] == "JOIN" and lateral["right"]["type"] == "SUBQUERY"


@pytest.mark.parametrize(
    "tree",
    [
        {"type": "SELECT_NODE", "from_table": {"type": "SOME_FUTURE_TABLE_REF"}},
        {"type": "SELECT_NODE", "select_list": [{"class": "SOME_FUTURE_EXPRESSION"}]},
        {"type": "INSERT_NODE"},
        {"type": "SELECT_NODE", "from_table": {"type": "BASE_TABLE", "table_name": "t2", "schema_name": ""}},
        {"type": "SELECT_NODE", "select_list": [{"class": "FUNCTION", "function_name": "my_udf"}]},
    ],
)
def test_unknown_node_kinds_tables_and_functions_are_refused(tree: dict[str, Any]) -> None:
    with pytest.raises(Refused):
        _walk(tree, project_policy(), frozenset())


def test_cte_names_are_scoped_to_their_subtree() -> None:
    # 'inner_t' is defined inside the subquery only; the outer FROM must not be able to use it.
    sql = "SELECT * FROM (WITH inner_t AS (SELECT 1 AS x) SELECT * FROM inner_t) s, inner_t"
    with pytest.raises(Refused, match="unknown table"):
        _walk(serialize(sql)["statements"][0], project_policy(), frozenset())


def test_remembered_decisions_match_fresh_ones() -> None:
    from rankecho.echo.guard import check_sql
    from rankecho.echo.guard.check import check_sql_uncached, clear_guard_cache
    from rankecho.echo.guard.policy import Policy

    clear_guard_cache()
    allowed = "SELECT node_id, count(*) FROM events GROUP BY 1"
    assert check_sql(allowed) == check_sql(allowed) == check_sql_uncached(allowed, project_policy())
    for _ in range(2):  # a refusal is decided afresh every time, never remembered as allowed
        with pytest.raises(Refused):
            check_sql("SELECT * FROM read_csv('/etc/passwd')")
    narrower = Policy.for_relations(["other_table"])
    with pytest.raises(Refused, match="unknown table"):
        check_sql(allowed, narrower)  # same text, other policy: decided for that policy


@pytest.mark.parametrize(
    "sql",
    [
        "WITH schema_version AS (SELECT * FROM schema_version) SELECT * FROM schema_version",
        "WITH a AS (FROM schema_version), schema_version AS (SELECT 1) FROM a",
        "WITH RECURSIVE a AS (FROM schema_version), schema_version AS (SELECT 1) FROM a",
        "WITH RECURSIVE t AS (SELECT * FROM t UNION ALL SELECT 1) SELECT * FROM t",  # the anchor is not t
    ],
)
def test_a_cte_body_does_not_see_its_own_or_later_names(sql: str) -> None:
    """DuckDB binds these references to the real table (issue 10): the walk must check them as such."""
    with pytest.raises(Refused, match=r"unknown table '(schema_version|t)'"):
        check_parsed(sql, project_policy())


@pytest.mark.parametrize(
    "sql",
    [
        "WITH events AS (SELECT * FROM events WHERE rank = 5) SELECT count(*) FROM events",
        "WITH a AS (SELECT 1 AS x), b AS (SELECT * FROM a) SELECT * FROM b, a",
        "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 3) SELECT * FROM t",
        "SELECT * FROM (WITH q AS (SELECT 1) SELECT * FROM q) s WHERE EXISTS (WITH r AS (SELECT 2) FROM r)",
    ],
)
def test_ctes_in_scope_are_allowed(sql: str) -> None:
    check_parsed(sql, project_policy())


def test_constant_sizes_are_refused_with_what_to_change() -> None:
    with pytest.raises(Refused, match=r"range\(\) would produce 100,000,000 values.*use a smaller range"):
        check_parsed("SELECT list_sort(range(10 * 1000 * 1000 * 10))", project_policy())
    with pytest.raises(Refused, match=r"repeat\(\) asks for 50,000,000 repetitions"):
        check_parsed("SELECT repeat('a,', 5e7)", project_policy())
    within = "SELECT len(range(10000000)), repeat('ab', 1000000), repeat('x', rank) FROM events"
    check_parsed(within, project_policy())
