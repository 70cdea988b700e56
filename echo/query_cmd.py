"""``rankecho query``: one read-only statement on a store file that no Echo holds.

Uses the same :class:`echo.store.reader.Reader` (and statement check) as Echo's own read API, on a
store opened read-only and sealed like ``rankecho mcp`` does (:func:`echo.guard.instance.open_sealed`):
even a statement that slipped past the check can reach no file, URL or extension and change no setting.
Exit codes: 0 ok, 1 query refused or failed (or a bad ``--memory-limit``), 3 store held by a running Echo.

Usage::

    result = run_query(Path("echo.db"), "SELECT count(*) FROM events", timeout_s=60, max_rows=10)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from echo.guard.instance import open_sealed
from echo.settings import SettingsError, memory_limit_bytes
from echo.store.lock import is_locked, read_holder
from echo.store.readcheck import ReadOnlyViolation, check_read_only
from echo.store.reader import QueryError, QueryResult, QueryTimeoutError, Reader


def _jsonable(value: Any) -> Any:
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def format_table(result: QueryResult) -> str:
    """Pipe-separated rows under a header, like the seed's query listings."""
    lines = [" | ".join(result.columns)]
    lines += [" | ".join("NULL" if v is None else str(v) for v in row) for row in result.rows]
    if result.truncated:
        lines.append(f"... truncated by {result.truncated_by}")
    return "\n".join(lines)


def run_query(
    db: Path,
    sql: str,
    timeout_s: float,
    max_rows: int,
    memory_limit: str | None = None,
    check: Callable[[str], str] = check_read_only,
) -> QueryResult:
    """Open ``db`` sealed, run one statement through ``check`` and the Reader, close. ``check`` is the
    statement gate; tests pass one that lets everything through to show the sealed instance holds."""
    con = open_sealed(db, memory_limit)
    try:
        return Reader(con, check=check).query(sql, timeout_s=timeout_s, max_rows=max_rows)
    finally:
        con.close()


def main(args: argparse.Namespace) -> int:
    db = Path(args.db)
    if not db.exists():
        print(
            f"rankecho query: {db} does not exist: pass the store file Echo was started with", file=sys.stderr
        )
        return 1
    if is_locked(db):
        print(
            f"rankecho query: {db} is held by a running Echo (pid {read_holder(db)}); query it through "
            "Echo's MCP run_analysis tool, or stop that Echo first",
            file=sys.stderr,
        )
        return 3
    try:
        memory_limit_bytes(args.memory_limit, "--memory-limit")
        result = run_query(db, args.sql, args.timeout, args.max_rows, args.memory_limit)
    except (ReadOnlyViolation, QueryError, QueryTimeoutError, SettingsError) as exc:
        print(f"rankecho query: {exc}", file=sys.stderr)
        return 1
    except duckdb.Error as exc:
        print(f"rankecho query: cannot open {db}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        rows = [[_jsonable(v) for v in row] for row in result.rows]
        print(json.dumps({"columns": result.columns, "rows": rows, "truncated": result.truncated}))
    else:
        print(format_table(result))
    return 0
