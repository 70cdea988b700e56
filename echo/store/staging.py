"""Copies of the node agent's events into the typed analysis tables (``collectives``, ``host_activity``).

The straggler analysis joins millions of collective rows across ranks; reading their attributes out of
``attrs_json`` on every question would cost seconds, so the writer extracts them once, inside the same
transaction that stores the events (an acknowledged collective is in both). The statements are named
SQL in ``echo/queries/staging/``; each reads the relation ``staged``.

Usage::

    con.register("staged", arrow_table_of_new_events)
    stage(con)                 # inside the writer's transaction
    backfill(con)              # migration 002: the same statements over every stored event
"""

from __future__ import annotations

import duckdb

from rankecho.echo.queries import STAGING

STAGED = "staged"
"""The relation every staging statement reads: the rows new to ``events`` in this commit."""


def stage(con: duckdb.DuckDBPyConnection) -> None:
    """Run every staging statement on ``staged`` (the caller registered it and owns the transaction)."""
    for statement in STAGING.values():
        con.execute(statement.sql)


def backfill(con: duckdb.DuckDBPyConnection, source: str = "events") -> None:
    """Stage every row of the table ``source`` (by default every stored event: an older store gaining
    the analysis tables). ``source`` is a table name of the ``events`` shape."""
    if not source.isidentifier():
        raise ValueError(f"source must be a table name, got {source!r}")
    con.execute(f"CREATE OR REPLACE TEMP VIEW {STAGED} AS SELECT * FROM {source}")
    try:
        stage(con)
    finally:
        con.execute(f"DROP VIEW IF EXISTS {STAGED}")
