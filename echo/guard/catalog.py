"""The catalog a guarded statement may see: exactly the relations the policy allows, nothing else.

:func:`prune` drops from one database every table, view, sequence, macro and schema that the policy
does not allow (the migrations table ``schema_version`` among them). The analysis workers read a store
copy pruned this way (:mod:`rankecho.echo.sandbox.worker`), and the guard binds statements against an
empty catalog of the same shape (:mod:`rankecho.echo.guard.bound`), so a name that slips past every
check still finds nothing: the primary control is what exists, the checks are defence in depth.

Usage::

    dropped = prune(con, project_policy(), "store_copy")   # e.g. ['TABLE main.schema_version']
"""

from __future__ import annotations

import duckdb

from rankecho.echo.guard.policy import Policy


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def unallowed(con: duckdb.DuckDBPyConnection, policy: Policy, database: str) -> list[tuple[str, str, str]]:
    """(kind, schema, name) of every object in ``database`` the policy does not allow, views and macros
    first (they may depend on tables), schemas last (dropped with what is left in them)."""
    allowed = policy.relations
    found: list[tuple[str, str, str]] = []
    for kind, query in (
        (
            "VIEW",
            "SELECT schema_name, view_name FROM duckdb_views() WHERE NOT internal AND database_name = ?",
        ),
        (
            "MACRO",
            "SELECT DISTINCT schema_name, function_name FROM duckdb_functions() "
            "WHERE NOT internal AND database_name = ? AND function_type = 'macro'",
        ),
        (
            "MACRO TABLE",
            "SELECT DISTINCT schema_name, function_name FROM duckdb_functions() "
            "WHERE NOT internal AND database_name = ? AND function_type = 'table_macro'",
        ),
        ("TABLE", "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ?"),
        ("SEQUENCE", "SELECT schema_name, sequence_name FROM duckdb_sequences() WHERE database_name = ?"),
    ):
        for schema, name in con.execute(query, [database]).fetchall():
            if not (kind in ("TABLE", "VIEW") and schema == "main" and name.lower() in allowed):
                found.append((kind, schema, name))
    schemas = con.execute(
        "SELECT schema_name FROM duckdb_schemas() WHERE NOT internal AND database_name = ? "
        "AND schema_name <> 'main'",
        [database],
    ).fetchall()
    found += [("SCHEMA", schema, "") for (schema,) in schemas]
    return found


def prune(con: duckdb.DuckDBPyConnection, policy: Policy, database: str) -> list[str]:
    """Drop every object of ``database`` the policy does not allow; returns what was dropped."""
    dropped = []
    for kind, schema, name in unallowed(con, policy, database):
        if kind == "SCHEMA":
            con.execute(f"DROP SCHEMA IF EXISTS {_quote(database)}.{_quote(schema)} CASCADE")
            dropped.append(f"SCHEMA {schema}")
            continue
        con.execute(f"DROP {kind} IF EXISTS {_quote(database)}.{_quote(schema)}.{_quote(name)}")
        dropped.append(f"{kind} {schema}.{name}")
    return dropped
