"""Stores one commit's new events: agent events into the typed tables, everything else as generic rows.

The straggler analysis joins millions of collective rows across ranks; reading their attributes out of
JSON on every question would cost seconds, so the writer extracts them once, inside the transaction
that stores the events. The extraction is named SQL (``echo/queries/staging/``): each statement reads
the relation ``staged`` and fills a temporary ``staging_<table>``. Then, per row, :func:`stage` keeps
the typed row as the event's only copy when it rebuilds the event exactly (schema v7,
:mod:`rankecho.echo.store.typed_events`): its leftover attributes go to ``attr_sets`` once per distinct
set; every other event (and an agent event that does not rebuild exactly) is stored in
``events_generic`` as sent. ``events`` is the view over both.

Usage::

    con.register("staged", arrow_table_of_new_events)
    stage(con)                 # inside the writer's transaction
    backfill(con)              # a migration: the typed copies of every event in a table of events' shape
"""

from __future__ import annotations

import duckdb

from rankecho.echo.queries import STAGING
from rankecho.echo.store.typed_events import (
    EVENT_COLUMNS,
    EVENT_ROWS,
    FIELDS,
    GENERATED,
    HOST_KINDS,
    derived_id,
    exact_sql,
    sent_sql,
    strip_patch,
)
from rankecho.shared import contract as c

STAGED = "staged"
"""The relation every staging statement reads: the rows new to the store in this commit."""
TYPED = tuple(FIELDS)
"""The typed tables, each filled through its temporary ``staging_<table>``."""


def prepare(con: duckdb.DuckDBPyConnection) -> None:
    """Create the temporary staging tables (the typed tables' columns) on this connection; again after
    a migration changed them."""
    for table in TYPED:
        con.execute(f"CREATE OR REPLACE TEMP TABLE staging_{table} AS {_stored_columns(table)}")


def _stored_columns(table: str) -> str:
    """An empty SELECT of ``table``'s columns as staging fills them: the stored ones (the generated ones
    left out: none can be inserted), with the event's id as sent in ``event_id``."""
    return (f"SELECT * EXCLUDE ({', '.join(GENERATED[table])}, event_id_sent), "
            f"CAST(NULL AS VARCHAR) AS event_id FROM {table} LIMIT 0")  # fmt: skip


def _id_to_store(table: str, alias: str) -> str:
    """The staging row's ``event_id`` as stored (schema v8): NULL when the typed row computes it."""
    id_sent = f"{alias}.event_id"
    return f"CASE WHEN {id_sent} = {derived_id(table)} THEN NULL ELSE {id_sent} END AS event_id_sent"


READS: dict[str, frozenset[str]] = {
    "stage_collectives": frozenset({c.M_COLLECTIVE}),
    "stage_host_activity": frozenset(HOST_KINDS.values()),
    "stage_stacks": frozenset({c.M_STACK}),
}
"""The metrics each staging statement copies: a commit without any of them skips the statement (planning
one costs milliseconds; most commits of a busy store hold every kind, a quiet one's few)."""
TABLE_OF = {"stage_collectives": "collectives", "stage_host_activity": "host_activity"}


def _extract(con: duckdb.DuckDBPyConnection, metrics: frozenset[str] | None) -> list[str]:
    """Run the staging statements the commit's metrics need; returns the typed tables they filled."""
    filled = []
    for name, statement in STAGING.items():
        if metrics is not None and name in READS and not READS[name] & metrics:
            continue
        table = TABLE_OF.get(name)
        if table is not None:  # temporary tables belong to a connection: a writer's cursor makes its own
            con.execute(f"CREATE TEMP TABLE IF NOT EXISTS staging_{table} AS {_stored_columns(table)}")
            con.execute(f"DELETE FROM staging_{table}")
            filled.append(table)
        con.execute(statement.sql)
    return filled


def _event_of(table: str, alias: str) -> str:
    """The id of the event a typed row came from (a 'runq' row is the second piece of an off-CPU event)."""
    if table == "host_activity":
        return (f"CASE WHEN {alias}.kind = 'runq' THEN left({alias}.event_id, length({alias}.event_id) - 5) "
                f"ELSE {alias}.event_id END")
    return f"{alias}.event_id"


def stage(
    con: duckdb.DuckDBPyConnection, metrics: frozenset[str] | None = None, with_rest: bool = False
) -> int:
    """Store the rows of ``staged`` (the caller registered them and owns the transaction); returns how
    many events were kept only in typed tables. ``metrics``: the metric names the rows hold, when the
    caller knows them (None: any). ``with_rest``: ``staged`` has the ``rest_json`` column ingest
    computes (:data:`REST_COLUMN`); without it the leftover attributes are computed here."""
    typed = _extract(con, metrics)
    columns = ", ".join(EVENT_COLUMNS)
    if not typed:
        con.execute(f"INSERT INTO events_generic ({columns}) SELECT {columns} FROM {STAGED}")
        return 0
    for table in typed:  # which events the typed rows rebuild exactly, and their leftover attributes
        patch = strip_patch(table)
        rest = "sent_rest" if with_rest else f"CAST(json_merge_patch(sent_attrs, '{patch}') AS VARCHAR)"
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE exact_{table} AS "
            f"SELECT t.event_id, {rest} AS rest "
            f"FROM (SELECT * FROM staging_{table} WHERE {EVENT_ROWS[table]}) t "
            f"JOIN ({sent_sql(table, STAGED, with_rest)}) s ON s.sent_id = t.event_id "
            f"WHERE sent_attrs IS NOT NULL AND {exact_sql(table)}"
        )
    rests = " UNION ".join(f"SELECT DISTINCT rest FROM exact_{table}" for table in typed)
    con.execute(
        "INSERT INTO attr_sets "
        "SELECT (SELECT coalesce(max(attrs_id), 0) FROM attr_sets) + row_number() OVER (), hash(rest), rest "
        f"FROM ({rests}) n "
        "WHERE NOT EXISTS "
        "(SELECT 1 FROM attr_sets a WHERE a.attrs_hash = hash(n.rest) AND a.attrs_json = n.rest)"
    )
    for table in typed:
        con.execute(
            f"INSERT INTO {table} BY NAME "
            f"SELECT t.* EXCLUDE (event_id) "
            f"REPLACE (x.event_id IS NULL AS in_generic, a.attrs_id AS attrs_id), "
            f"{_id_to_store(table, 't')} "
            f"FROM staging_{table} t "
            f"LEFT JOIN exact_{table} x ON x.event_id = {_event_of(table, 't')} "
            f"LEFT JOIN attr_sets a ON a.attrs_hash = hash(x.rest) AND a.attrs_json = x.rest"
        )
    typed_only = " UNION ALL ".join(f"SELECT event_id FROM exact_{table}" for table in typed)
    con.execute(
        f"INSERT INTO events_generic ({columns}) SELECT {columns} FROM {STAGED} "
        f"WHERE event_id NOT IN ({typed_only})"
    )
    counted = " + ".join(f"(SELECT count(*) FROM exact_{table})" for table in typed)
    return int(con.execute(f"SELECT {counted}").fetchall()[0][0])


def backfill(con: duckdb.DuckDBPyConnection, source: str = "events") -> None:
    """Add the typed copies of every row of the table ``source`` (an older store gaining the analysis
    tables: its events stay where they are, so every typed row says ``in_generic``)."""
    if not source.isidentifier():
        raise ValueError(f"source must be a table name, got {source!r}")
    prepare(con)
    con.execute(f"CREATE OR REPLACE TEMP VIEW {STAGED} AS SELECT * FROM {source}")
    try:
        for table in _extract(con, None):
            con.execute(
                f"INSERT INTO {table} BY NAME SELECT t.* EXCLUDE (event_id) REPLACE (true AS in_generic), "
                f"t.event_id AS event_id_sent FROM staging_{table} t"
            )
    finally:
        con.execute(f"DROP VIEW IF EXISTS {STAGED}")


def store_events(con: duckdb.DuckDBPyConnection, source: str) -> int:
    """Store every row of the table ``source`` (the ``events`` columns) as the writer stores a commit's
    new rows, in the caller's transaction (generators and tests that build a store without Echo); no
    resend check. Returns how many events went to typed tables only."""
    if not source.isidentifier():
        raise ValueError(f"source must be a table name, got {source!r}")
    prepare(con)
    con.execute(f"CREATE OR REPLACE TEMP VIEW {STAGED} AS SELECT * FROM {source}")
    try:
        return stage(con)
    finally:
        con.execute(f"DROP VIEW IF EXISTS {STAGED}")
