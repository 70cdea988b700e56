"""Parser-level check: DuckDB parses the query, and every node of its AST must be on an allowlist.

DuckDB's own parser decides what the text means (``duckdb.extract_statements`` for the statement
count and type, ``json_serialize_sql`` for the tree), so no spelling trick can make this layer see a
different query than the executor will. The walk visits every dict in the serialised tree: query
nodes, table references, modifiers and expressions alike, inside subqueries, CTEs, LATERAL joins and
set operations; any kind of node not listed here is refused, so a construct added by a future DuckDB
release is refused until someone reviews it.

Usage::

    check_parsed("SELECT node_id FROM events", Policy.for_relations(["events"]))
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

import duckdb

from rankecho.echo.guard.limits import check_sizes
from rankecho.echo.guard.pivot import static_twin
from rankecho.echo.guard.policy import IDENTIFIER, Policy
from rankecho.echo.guard.refusal import Refused
from rankecho.echo.guard.refusal import safe_name as _safe

QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
TABLE_REFS = frozenset(
    {"BASE_TABLE", "JOIN", "SUBQUERY", "TABLE_FUNCTION", "EMPTY", "EXPRESSION_LIST", "PIVOT"}
)
MODIFIERS = frozenset({"ORDER_MODIFIER", "LIMIT_MODIFIER", "LIMIT_PERCENT_MODIFIER", "DISTINCT_MODIFIER"})
ORDER_KINDS = frozenset({"ORDER_DEFAULT", "ASCENDING", "DESCENDING"})
TYPE_INFO_KINDS = frozenset(
    {
        "DECIMAL_TYPE_INFO",
        "STRING_TYPE_INFO",
        "LIST_TYPE_INFO",
        "STRUCT_TYPE_INFO",
        "ENUM_TYPE_INFO",
        "ARRAY_TYPE_INFO",
        "GENERIC_TYPE_INFO",
        "INTEGER_LITERAL_TYPE_INFO",
        "UNBOUND_TYPE_INFO",
    }
)
NODE_KINDS = QUERY_NODES | TABLE_REFS | MODIFIERS | ORDER_KINDS | TYPE_INFO_KINDS
EXPRESSION_CLASSES = frozenset(
    {
        "BETWEEN",
        "CASE",
        "CAST",
        "COLLATE",
        "COLUMN_REF",
        "COMPARISON",
        "CONJUNCTION",
        "CONSTANT",
        "FUNCTION",
        "LAMBDA",
        "LAMBDA_REF",
        "OPERATOR",
        "PARAMETER",
        "POSITIONAL_REFERENCE",
        "STAR",
        "SUBQUERY",
        "WINDOW",
        "TYPE",
    }
)

CATALOG_SCHEMAS = frozenset({"main", "temp", "system", "pg_catalog", "information_schema", "store", "memory"})
"""Schema and catalog names where a qualified function call would look a function up, not a column."""

_local = threading.local()


def _parser() -> duckdb.DuckDBPyConnection:
    """A private in-memory instance per thread, used only to run ``json_serialize_sql``."""
    con = getattr(_local, "con", None)
    if con is None:
        con = duckdb.connect(":memory:", config={"enable_external_access": False})
        _local.con = con
    return con


def serialize(sql: str) -> dict[str, Any]:
    """DuckDB's AST for one SELECT, as JSON; refuses anything DuckDB will not serialise."""
    return serialized(sql)[1]


def serialized(sql: str) -> tuple[str, dict[str, Any]]:
    """The text DuckDB's AST was made from (``sql``, or a dynamic PIVOT's static twin) and the AST."""
    try:
        statements = duckdb.extract_statements(sql)
        if len(statements) != 1:
            raise Refused(f"exactly one statement is allowed, got {len(statements)}")
        kind = statements[0].type
    except duckdb.Error as exc:
        raise Refused(f"DuckDB cannot parse the query ({_first_line(exc)})") from None
    except ValueError as exc:  # a statement type the Python API has no name for (UPDATE EXTENSIONS)
        if isinstance(exc, Refused):
            raise
        raise Refused("only SELECT statements are allowed") from None
    if kind == duckdb.StatementType.MULTI:
        twin = static_twin(sql)
        if twin is None or twin == sql:
            raise Refused("only SELECT statements are allowed, got MULTI")
        try:
            return serialized(twin)
        except Refused as refused:
            raise Refused(
                f"this PIVOT could not be checked ({refused.reason}); list the values instead: "
                "ON metric_name IN ('a', 'b')"
            ) from None
    if kind != duckdb.StatementType.SELECT:
        raise Refused(f"only SELECT statements are allowed, got {kind.name}")
    raw = _parser().execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    try:
        tree = json.loads(raw[0]) if raw else None
    except (ValueError, RecursionError):
        raise Refused("the query is too deeply nested") from None
    if not isinstance(tree, dict) or tree.get("error") or len(tree.get("statements", ())) != 1:
        reason = tree.get("error_message", "not a plain SELECT") if isinstance(tree, dict) else "unknown"
        raise Refused(f"only plain SELECT queries are allowed ({str(reason)[:120]})")
    return sql, tree


def check_parsed(sql: str, policy: Policy) -> tuple[str, dict[str, Any]]:
    """Raise :class:`Refused` unless every node of the query's AST is allowed by ``policy``; return what
    :func:`serialized` returns (the binding layer checks the same text)."""
    text, tree = serialized(sql)
    try:
        _walk(tree["statements"][0], policy, frozenset())
    except RecursionError:
        raise Refused("the query is too deeply nested") from None
    return text, tree


def _walk(node: Any, policy: Policy, ctes: frozenset[str]) -> None:
    """Check ``node`` and everything under it; ``ctes`` are the CTE names a table reference here binds to.

    CTE names are scoped the way DuckDB binds them: the body of a WITH entry sees only the entries
    before it (and the enclosing query's), never itself or later ones, so ``WITH t AS (SELECT * FROM t)``
    or ``WITH a AS (FROM t), t AS (...) FROM a`` reads the real table ``t`` and is checked as such; the
    recursive part of a recursive CTE sees its own name; the query after WITH sees all of them.
    """
    if isinstance(node, list):
        for item in node:
            _walk(item, policy, ctes)
        return
    if not isinstance(node, Mapping):
        return
    skip = {"qualified_name", "cte_map"}
    if "class" in node:
        _check_expression(node, policy)
    else:
        kind = node.get("type")
        if isinstance(kind, str):
            if kind not in NODE_KINDS:
                raise Refused(f"{kind.replace('_', ' ').lower()} is not allowed")
            if kind == "BASE_TABLE":
                _check_table(node, policy, ctes)
            elif kind == "TABLE_FUNCTION":
                _check_table_function(node, policy, ctes)
                return
            elif kind == "RECURSIVE_CTE_NODE":
                name = str(node.get("cte_name", "")).lower()
                _walk(node.get("right"), policy, ctes | {name} if IDENTIFIER.match(name) else ctes)
                skip.add("right")
    ctes = _walk_ctes(node.get("cte_map"), policy, ctes)
    for key, value in node.items():
        if isinstance(value, (Mapping, list)) and key not in skip:
            _walk(value, policy, ctes)


def _walk_ctes(cte_map: Any, policy: Policy, ctes: frozenset[str]) -> frozenset[str]:
    """Check each WITH entry with the names defined before it; return the names the query sees."""
    if not isinstance(cte_map, Mapping):
        return ctes
    for entry in cte_map.get("map", ()):
        if not isinstance(entry, Mapping):
            raise Refused("this kind of WITH clause is not allowed")
        _walk(entry.get("value"), policy, ctes)
        name = str(entry.get("key", "")).lower()
        if IDENTIFIER.match(name):
            ctes = ctes | {name}
    return ctes


def _check_expression(node: Mapping[str, Any], policy: Policy) -> None:
    cls = node.get("class")
    if cls not in EXPRESSION_CLASSES:
        raise Refused(f"{str(cls).lower()} expressions are not allowed")
    if cls in {"FUNCTION", "WINDOW"}:
        name = str(node.get("function_name", ""))
        if node.get("catalog") or str(node.get("schema", "")).lower() in CATALOG_SCHEMAS:
            raise Refused(f"qualified function names are not allowed ({_safe(name)})")
        # Another ``schema`` is method-call syntax (``node_id.upper()`` is ``upper(node_id)``): the store
        # defines no schemas or functions of its own, so only the built-in of that name can bind.
        if not policy.allows_function(name):
            raise Refused(f"function {_safe(name)} is not allowed")
        check_sizes(name, node)


def _check_table(node: Mapping[str, Any], policy: Policy, ctes: frozenset[str]) -> None:
    name = str(node.get("table_name", ""))
    if node.get("catalog_name") or str(node.get("schema_name", "")).lower() not in ("", "main"):
        raise Refused("only the main schema of this database can be read")
    if node.get("at_clause"):
        raise Refused("time-travel (AT ...) clauses are not allowed")
    if not IDENTIFIER.match(name):
        raise Refused("a table name must be a plain identifier (files and URLs cannot be read)")
    # Only an unqualified name can be a CTE: DuckDB binds ``main.x`` to the table even inside
    # ``WITH x AS (...)``.
    if not (policy.allows_relation(name) or (name.lower() in ctes and not node.get("schema_name"))):
        raise Refused(f"unknown table {_safe(name)}")


def _check_table_function(node: Mapping[str, Any], policy: Policy, ctes: frozenset[str]) -> None:
    function = node.get("function")
    if not isinstance(function, Mapping) or function.get("class") != "FUNCTION":
        raise Refused("this kind of table function call is not allowed")
    name = str(function.get("function_name", ""))
    if function.get("schema") or function.get("catalog") or not policy.allows_table_function(name):
        raise Refused(f"table function {_safe(name)} is not allowed")
    check_sizes(name, function)
    for key, value in function.items():
        if isinstance(value, (Mapping, list)) and key != "qualified_name":
            _walk(value, policy, ctes)
    for key, value in node.items():
        if key != "function" and isinstance(value, (Mapping, list)):
            _walk(value, policy, ctes)


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
