"""Binding check: DuckDB's binder resolves every name, and the bound plan must read only what is allowed.

The AST walk (:mod:`rankecho.echo.guard.parsed`) sees names as they are spelled; which table, CTE or
function a name means is decided later, by DuckDB's binder, with schemas, CTE scopes and SQL's special
values (``current_user`` is a function although it has no parentheses). So this layer asks the binder:
:func:`json_serialize_plan` of the statement, in a private instance whose catalog is the one the
analysis workers read (the project's migrated tables, pruned to the policy by
:func:`rankecho.echo.guard.catalog.prune`, empty, plus the analysis macros), with the optimizer off so
the plan holds every bound expression. Then:

- every scan (``LOGICAL_GET``) is a table of the policy in that catalog's ``main``, or an allowed table
  function; a CTE is bound by DuckDB, never a table scan, whatever it is called or however qualified;
- every plan operator is on an allowlist of read-only operators;
- every bound function is off the deny list, and a column reference of the AST that DuckDB bound to a
  function or constant (a special value such as ``current_user`` or ``current_schema``) is checked as
  the function of that name.

Usage::

    text, tree = check_parsed(sql, policy)
    check_bound(text, tree, policy)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import duckdb

from rankecho.echo.guard.catalog import prune
from rankecho.echo.guard.policy import Policy, is_denied
from rankecho.echo.guard.refusal import Refused
from rankecho.echo.guard.refusal import safe_name as _safe

CATALOG = "store"
"""The binding database's name, as in the workers: a table scan must be ``store.main.<allowed relation>``,
and DuckDB's messages name the same catalog here as there."""
PLAN_OPERATORS = frozenset(
    {
        "LOGICAL_AGGREGATE_AND_GROUP_BY",
        "LOGICAL_ANY_JOIN",
        "LOGICAL_ASOF_JOIN",
        "LOGICAL_CHUNK_GET",
        "LOGICAL_COMPARISON_JOIN",
        "LOGICAL_CROSS_PRODUCT",
        "LOGICAL_CTE_REF",
        "LOGICAL_DELIM_GET",
        "LOGICAL_DELIM_JOIN",
        "LOGICAL_DEPENDENT_JOIN",
        "LOGICAL_DISTINCT",
        "LOGICAL_DUMMY_SCAN",
        "LOGICAL_EMPTY_RESULT",
        "LOGICAL_EXCEPT",
        "LOGICAL_EXPRESSION_GET",
        "LOGICAL_FILTER",
        "LOGICAL_GET",
        "LOGICAL_INTERSECT",
        "LOGICAL_JOIN",
        "LOGICAL_LIMIT",
        "LOGICAL_MATERIALIZED_CTE",
        "LOGICAL_ORDER_BY",
        "LOGICAL_PIVOT",
        "LOGICAL_POSITIONAL_JOIN",
        "LOGICAL_PROJECTION",
        "LOGICAL_RECURSIVE_CTE",
        "LOGICAL_SAMPLE",
        "LOGICAL_TOP_N",
        "LOGICAL_UNION",
        "LOGICAL_UNNEST",
        "LOGICAL_WINDOW",
    }
)
"""Read-only plan operators; any other (a write, an extension's operator) is refused until reviewed."""
_FUNCTIONS = frozenset({"BOUND_FUNCTION", "BOUND_AGGREGATE", "BOUND_WINDOW"})
_SYSTEM: tuple[list[str], ...] = ([], ["system", "main"])

_local = threading.local()
_lock = threading.Lock()
_databases: dict[Policy, duckdb.DuckDBPyConnection] = {}


def _database(policy: Policy) -> duckdb.DuckDBPyConnection:
    """The binding database for ``policy``, built once per process: the project's migrated tables pruned
    to the policy, a placeholder for any policy relation they lack, the analysis macros it allows."""
    with _lock:
        con = _databases.get(policy)
        if con is not None:
            return con
        from rankecho.echo.queries import LAYERS
        from rankecho.echo.store.migrate import migrate  # the store package imports the guard

        con = duckdb.connect(":memory:", config={"enable_external_access": False})
        con.execute(f"ATTACH ':memory:' AS {CATALOG}")
        con.execute(f"USE {CATALOG}")
        migrate(con)
        prune(con, policy, CATALOG)
        tables = con.execute(
            "SELECT lower(table_name) FROM duckdb_tables() "
            "UNION ALL SELECT lower(view_name) FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
        for name in sorted(policy.relations - {name for (name,) in tables}):
            con.execute(f'CREATE TABLE "{name}" (value VARCHAR)')
        for name, layer in LAYERS.items():  # the macros the workers define (TEMP there, per connection)
            if layer.is_macro and (policy.allows_table_function(name) or name in policy.project_functions):
                con.execute(layer.sql.replace("TEMP MACRO", "MACRO", 1))
        _databases[policy] = con
        return con


def _layer_settings() -> list[str]:
    """The analysis layers' statements that are no macro (the parameter table's ``SET VARIABLE``)."""
    from rankecho.echo.queries import LAYERS

    return [layer.sql for layer in LAYERS.values() if not layer.is_macro]


def binder(policy: Policy) -> duckdb.DuckDBPyConnection:
    """This thread's connection to the binding database of ``policy``, with the optimizer off."""
    cursors: dict[Policy, duckdb.DuckDBPyConnection] = _local.__dict__.setdefault("cursors", {})
    cur = cursors.get(policy)
    if cur is None:
        cur = _database(policy).cursor()
        cur.execute(f"USE {CATALOG}")
        for statement in _layer_settings():  # per connection, as in the workers: the parameter table
            cur.execute(statement)
        cur.execute("PRAGMA disable_optimizer")
        cursors[policy] = cur
    return cur


def check_bound(text: str, tree: Mapping[str, Any], policy: Policy, twin: bool = False) -> None:
    """Raise :class:`Refused` unless DuckDB binds ``text`` (whose AST is ``tree``) to an allowed plan.

    ``twin``: ``text`` is a dynamic PIVOT's static twin (:mod:`echo.guard.pivot`), whose ``IN (NULL)``
    lacks the pivoted columns the rest of the query may name; when it cannot be bound for that reason
    there is no plan to check, and the AST walk and the pruned catalog are what hold. Parameters
    (``$start_ns``, ``?``) are bound as NULL when DuckDB needs their values to plan; when even that does
    not bind (a parameter's type shapes the query: ``unnest($windows)``), the same holds. Only the
    project's named queries run with parameter values; a caller's statement with a parameter fails to
    run ("values were not provided").
    """
    specials: dict[tuple[int, int], str] = {}
    _column_refs(tree, specials)
    plan = _plan(text, policy)
    unplanned = twin  # the statement runs only as something this check cannot bind: see above and below
    if isinstance(plan, dict) and "parameters need to have a known value" in str(plan.get("error_message")):
        text, shift = _without_parameters(text, tree)
        specials = {(shift(at), length): name for (at, length), name in specials.items()}
        plan = _plan(text, policy)
        unplanned = True  # a value's type may shape the query (unnest($rows)); callers' SQL has no values
    if unplanned and isinstance(plan, dict) and plan.get("error_type") == "binder":
        return
    if not isinstance(plan, dict) or plan.get("error"):
        kind = str(plan.get("error_type", "")).title() if isinstance(plan, dict) else ""
        message = str(plan.get("error_message", "unknown")) if isinstance(plan, dict) else "unknown"
        detail = " ".join(line.strip() for line in message.splitlines()[:3])[:300]
        raise Refused(f"{kind} Error: {detail}".strip())
    try:
        _walk(plan.get("plans"), policy, specials)
    except RecursionError:
        raise Refused("the query is too deeply nested") from None


def _plan(text: str, policy: Policy) -> Any:
    try:
        row = binder(policy).execute("SELECT json_serialize_plan(?)", [text]).fetchone()
        return json.loads(row[0]) if row else None
    except duckdb.Error as exc:
        raise Refused(f"DuckDB cannot plan the query ({str(exc).splitlines()[0][:160]})") from None
    except (ValueError, RecursionError):
        raise Refused("the query is too deeply nested") from None


def _without_parameters(text: str, tree: Mapping[str, Any]) -> tuple[str, Callable[[int], int]]:
    """``text`` with every parameter the AST found replaced by NULL, and the map from an offset in
    ``text`` to the same place in the result."""
    spans: list[tuple[int, int]] = []
    _parameters(tree, spans)
    out, edits, last = [], [], 0
    for at, length in sorted(set(spans)):
        if at < last:
            continue
        out += [text[last:at], "NULL"]
        edits.append((at + length, 4 - length))
        last = at + length
    out.append(text[last:])

    def shift(offset: int) -> int:
        return offset + sum(delta for end, delta in edits if end <= offset)

    return "".join(out), shift


def _parameters(node: Any, out: list[tuple[int, int]]) -> None:
    if isinstance(node, list):
        for item in node:
            _parameters(item, out)
    elif isinstance(node, Mapping):
        where = _location(node)
        if node.get("class") == "PARAMETER" and where:
            out.append(where)
        for value in node.values():
            if isinstance(value, (Mapping, list)):
                _parameters(value, out)


def _column_refs(node: Any, out: dict[tuple[int, int], str]) -> None:
    """Unqualified column references of the AST, by (location, length): the names DuckDB may bind to a
    special value instead of a column."""
    if isinstance(node, list):
        for item in node:
            _column_refs(item, out)
    elif isinstance(node, Mapping):
        names = node.get("column_names")
        where = _location(node)
        if node.get("class") == "COLUMN_REF" and isinstance(names, list) and len(names) == 1 and where:
            out[where] = str(names[0])
        for value in node.values():
            if isinstance(value, (Mapping, list)):
                _column_refs(value, out)


def _location(node: Mapping[str, Any]) -> tuple[int, int] | None:
    """Where an AST or plan node was written in the statement: (offset, length); None if unknown (DuckDB
    writes 2**64 - 1 and 0 for a node it made itself, which matches nothing the caller wrote)."""
    at, length = node.get("query_location"), node.get("query_location_length")
    if isinstance(at, int) and isinstance(length, int) and length > 0 and at < 1 << 63:
        return (at, length)
    return None


def _walk(node: Any, policy: Policy, specials: Mapping[tuple[int, int], str]) -> None:
    if isinstance(node, list):
        for item in node:
            _walk(item, policy, specials)
        return
    if not isinstance(node, Mapping):
        return
    if "expression_class" in node:
        _check_expression(node, policy, specials)
    else:
        kind = node.get("type")
        if isinstance(kind, str) and kind.startswith("LOGICAL_"):
            if kind not in PLAN_OPERATORS:
                raise Refused(f"{kind.removeprefix('LOGICAL_').replace('_', ' ').lower()} is not allowed")
            if kind == "LOGICAL_GET":
                _check_scan(node, policy)
    for value in node.values():
        if isinstance(value, (Mapping, list)):
            _walk(value, policy, specials)


def _path(node: Any) -> list[str]:
    path = node.get("path") if isinstance(node, Mapping) else None
    return [str(p) for p in path] if isinstance(path, list) else []


def _check_scan(node: Mapping[str, Any], policy: Policy) -> None:
    """A table scan of an allowed relation, or an allowed table function (a macro's body is expanded)."""
    function = _path(node.get("qname"))
    if function == ["seq_scan"]:
        data = node.get("function_data")
        table = _path(data.get("qualified_name")) if isinstance(data, Mapping) else []
        if len(table) != 3 or table[:2] != [CATALOG, "main"] or not policy.allows_relation(table[2]):
            raise Refused(f"unknown table {_safe(table[-1] if table else '?')}")
        return
    if not function or function[:-1] not in _SYSTEM or not policy.allows_table_function(function[-1]):
        raise Refused(f"table function {_safe(function[-1] if function else '?')} is not allowed")


def _check_expression(
    node: Mapping[str, Any], policy: Policy, specials: Mapping[tuple[int, int], str]
) -> None:
    cls = node.get("expression_class")
    if cls in _FUNCTIONS:
        path = _path(node.get("qname"))
        name = path[-1] if path else str(node.get("name", ""))
        if is_denied(name):
            raise Refused(f"function {_safe(name)} is not allowed")
    if cls == "BOUND_CONSTANT" or (cls == "BOUND_FUNCTION" and not node.get("children")):
        where = _location(node)
        special = specials.get(where) if where else None
        if special is not None and not policy.allows_function(special):
            raise Refused(f"{_safe(special)} is the function {_safe(special)}(), which is not allowed")
