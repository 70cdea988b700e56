"""Versioned schema migrations: ``echo/migrations/NNN_name.sql`` applied in order, each in one transaction.

The applied version is recorded in ``schema_version``; a store newer than this Echo is refused rather
than guessed at.

Usage::

    version = migrate(connection)   # -> highest applied version
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import duckdb

_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


class SchemaTooNewError(RuntimeError):
    pass


def available() -> list[Migration]:
    """Every migration shipped with this package, lowest version first."""
    found = []
    for entry in resources.files("echo.migrations").iterdir():
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
    for m in migrations:
        if m.version <= have:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(m.sql)
            con.execute("INSERT INTO schema_version VALUES (?, ?, epoch_ns(now()))", [m.version, m.name])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        have = m.version
    return have
