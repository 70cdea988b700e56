"""Seal a DuckDB instance once its owner has finished setting it up.

After :func:`seal`, no statement on any connection of the instance can reach a file, URL or
extension (``enable_external_access=false``), and no statement can change a setting, including turning
that back on (``lock_configuration=true``). Both apply to the whole instance, the writer included; the
writer's Arrow ``register()`` + ``INSERT`` still work. These settings do not make a query read-only:
the reader's ``BEGIN TRANSACTION READ ONLY`` does that.

Usage::

    con = duckdb.connect(path); migrate(con); seal(con, memory_limit="4GB")
    con = open_sealed(path)   # read-only, for ``rankecho mcp --db``
"""

from __future__ import annotations

from pathlib import Path

import duckdb


def seal(
    con: duckdb.DuckDBPyConnection, memory_limit: str | None = None, spill_limit: str | None = None
) -> None:
    """Set the memory and spill limits (when given), disable external access, then lock the
    configuration."""
    if memory_limit:
        con.execute("SET memory_limit = ?", [memory_limit])
    if spill_limit:
        con.execute("SET max_temp_directory_size = ?", [spill_limit])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def open_sealed(db_path: Path, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """Open an existing store file read-only and sealed (fails if another process holds it)."""
    if not db_path.is_file():
        raise FileNotFoundError(f"no database file at {db_path}: pass the path of an Echo store (echo.db)")
    con = duckdb.connect(str(db_path), read_only=True)
    seal(con, memory_limit)
    return con
