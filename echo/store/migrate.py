"""Versioned schema migrations: ``echo/migrations/NNN_name.sql`` applied in order, each in one transaction.

The applied version is recorded in ``schema_version``; a store newer than this Echo is refused rather
than guessed at. A migration that adds derived tables fills them from the stored events in the same
transaction (:data:`AFTER`), so an upgraded store answers like a fresh one.

Usage::

    version = migrate(connection)   # -> highest applied version
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import duckdb

from rankecho.echo.store.staging import backfill, prepare
from rankecho.echo.store.typed_events import EVENT_COLUMNS, events_view_sql
from rankecho.echo.store.writer import rollback

log = logging.getLogger(__name__)
_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


class SchemaTooNewError(RuntimeError):
    pass


def events_to_view(con: duckdb.DuckDBPyConnection) -> None:
    """v7: the stored events move to ``events_generic`` (unchanged; their typed copies say
    ``in_generic``), and ``events`` becomes the view (:func:`migrate` creates it)."""
    columns = ", ".join(EVENT_COLUMNS)
    counted = con.execute("SELECT count(*) FROM events").fetchall()[0][0]
    if counted:  # one copy of every stored event: minutes for a large store, and the disk for a second copy
        log.info("schema v7: moving %d stored events to events_generic (one copy, in one transaction; "
                 "about a million events a second)", counted)  # fmt: skip
    started = time.monotonic()
    con.execute(f"INSERT INTO events_generic ({columns}) SELECT {columns} FROM events")
    con.execute("DROP TABLE events")
    if counted:
        log.info("schema v7: %d events moved in %.1f s", counted, time.monotonic() - started)


AFTER: dict[int, Callable[[duckdb.DuckDBPyConnection], None]] = {2: backfill, 7: events_to_view}
"""Work that completes a migration, in version order after every pending migration's DDL (staging
writes the newest tables' columns): v2 stages every stored agent event; v7 moves the events table's rows
to ``events_generic``. (v3's pre-call columns stay NULL on collectives stored before it: the analysis
explains those from their raw intervals, as it did.)"""


def available() -> list[Migration]:
    """Every migration shipped with this package, lowest version first."""
    found = []
    for entry in resources.files("rankecho.echo.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    return found


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_version "
        "(version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_ns BIGINT NOT NULL)"
    )
    row = con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
    return int(row[0]) if row else 0


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply every pending migration; returns the store's schema version afterwards."""
    migrations = available()
    have = current_version(con)
    newest = migrations[-1].version if migrations else 0
    if have > newest:
        raise SchemaTooNewError(
            f"store schema is v{have} but this Echo knows up to v{newest}: upgrade rankecho"
        )
    # Every migration not recorded, not only those above the newest one: migrations are numbered on
    # parallel branches, so a store may hold v6 without v5 (v5 merged later); each adds its own columns.
    applied = {int(r[0]) for r in con.execute("SELECT version FROM schema_version").fetchall()}
    pending = [m for m in migrations if m.version not in applied]
    if not pending:
        _finish(con)
        return have
    # One transaction for every pending migration: a crash leaves the store at its old version, and the
    # completing work (AFTER) runs once, on the newest tables.
    con.execute("BEGIN TRANSACTION")
    try:
        for m in pending:
            con.execute(m.sql)
        for m in pending:
            if m.version in AFTER:
                AFTER[m.version](con)
        for m in pending:
            con.execute("INSERT INTO schema_version VALUES (?, ?, epoch_ns(now()))", [m.version, m.name])
        con.execute(events_view_sql())
        con.execute("COMMIT")
    except Exception:
        rollback(con)  # keeps the migration's own error (e.g. disk full) as the one raised
        raise
    prepare(con)
    return max(have, pending[-1].version)


def _finish(con: duckdb.DuckDBPyConnection) -> None:
    """On a current store: the ``events`` view as this release builds it (its SQL is generated from the
    typed field lists, which a release may change), and this connection's staging tables. The view is
    replaced only when it differs (compared with a temporary twin as DuckDB stores it): replacing it
    writes to the store, which must not be needed to open a store whose disk is full."""
    probe = events_view_sql().replace("VIEW events AS", "TEMP VIEW rk_events_probe AS", 1)
    con.execute(probe)
    stored = con.execute("SELECT view_name, sql FROM duckdb_views() WHERE view_name IN ('events', "
                         "'rk_events_probe') ORDER BY view_name").fetchall()  # fmt: skip
    con.execute("DROP VIEW rk_events_probe")
    body = {name: sql.split(" AS ", 1)[1] for name, sql in stored}
    if body.get("events") != body["rk_events_probe"]:
        con.execute(events_view_sql())
    prepare(con)
