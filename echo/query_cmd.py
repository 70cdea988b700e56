"""``rankecho query``: one read-only statement on a store file that no Echo holds.

Runs like ``fleet.cluster.run_analysis``: the SQL guard (:func:`rankecho.echo.guard.check_sql`), then one
analysis worker process (:class:`rankecho.echo.sandbox.Sandbox`) that attaches the store read-only in a sealed
instance (no file, URL or extension; settings locked) under a hard memory cap (``--memory-limit``) and
a deadline. Errors are printed with the same masking as MCP (:func:`echo.guard.safe_message`: no paths).
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

from rankecho.echo.guard import Refused, check_sql, safe_message
from rankecho.echo.sandbox import Sandbox, SandboxLimits
from rankecho.echo.settings import QUERY_MEMORY_LIMIT, SettingsError, memory_limit_bytes
from rankecho.echo.store.lock import is_locked, read_holder
from rankecho.echo.store.reader import QueryError, QueryResult, QueryTimeoutError


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
    check: Callable[[str], str] = check_sql,
) -> QueryResult:
    """Run one statement through ``check`` in a sandbox worker reading ``db``. ``check`` is the
    statement gate; tests pass one that lets everything through to show the sealed worker holds."""
    if not db.is_file():
        raise FileNotFoundError(f"no database file at {db}: pass the path of an Echo store (echo.db)")
    cap = memory_limit_bytes(memory_limit or QUERY_MEMORY_LIMIT, "--memory-limit")
    limits = SandboxLimits(cap, workers=1)
    sandbox = Sandbox(lambda: db, limits, check=check)
    try:
        return sandbox.query(sql, timeout_s=timeout_s, max_rows=max_rows)
    finally:
        sandbox.close()


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
    except (Refused, QueryError, QueryTimeoutError, SettingsError, FileNotFoundError) as exc:
        print(f"rankecho query: {safe_message(exc, 2000)}", file=sys.stderr)
        return 1
    if args.json:
        rows = [[_jsonable(v) for v in row] for row in result.rows]
        print(json.dumps({"columns": result.columns, "rows": rows, "truncated": result.truncated}))
    else:
        print(format_table(result))
    return 0
