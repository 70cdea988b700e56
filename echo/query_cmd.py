"""``rankecho query``: one read-only statement on a store file that no Echo holds (``--db``), or through a
running Echo's ``fleet.cluster.run_analysis`` MCP tool (``--mcp-url``; the same guard and sandbox run
inside that Echo, with its limits; token as for ``rankecho diagnose``: :mod:`rankecho.echo.ask`).

With ``--db`` it runs like ``fleet.cluster.run_analysis``: the SQL guard
(:func:`rankecho.echo.guard.check_sql`), then one analysis worker process
(:class:`rankecho.echo.sandbox.Sandbox`) that attaches the store read-only in a sealed instance (no file,
URL or extension; settings locked) under a hard memory cap (``--memory-limit``) and a deadline. Errors
are printed with the same masking as MCP (:func:`echo.guard.safe_message`: no paths).
Exit codes (:mod:`rankecho.exitcodes`): 0 ok, 1 query refused or failed (or a bad ``--memory-limit``,
an unreachable Echo), 3 store held by a running Echo (ask it with ``--mcp-url``).

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

from rankecho import exitcodes
from rankecho.echo.ask import AskError, ask_endpoint, held_message, mcp_token
from rankecho.echo.guard import Refused, check_sql, safe_message
from rankecho.echo.sandbox import Sandbox, SandboxLimits
from rankecho.echo.settings import QUERY_MEMORY_LIMIT, SettingsError, memory_limit_bytes
from rankecho.echo.store.lock import is_locked, read_holder
from rankecho.echo.store.reader import QueryError, QueryResult, QueryTimeoutError

TOOL = "fleet.cluster.run_analysis"
MCP_MAX_ROWS = 10_000
"""The most rows ``run_analysis`` returns in one answer (its ``limit``'s bound)."""


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


def run_remote(url: str, token: str | None, sql: str, timeout_s: float, max_rows: int) -> QueryResult:
    """Run one statement through a running Echo's run_analysis tool; its answer as a :class:`QueryResult`."""
    answer = ask_endpoint(url, token, TOOL, {"sql": sql, "limit": min(max_rows, MCP_MAX_ROWS)}, timeout_s)
    columns = list(answer["columns"])
    rows = [tuple(row.get(c) for c in columns) for row in answer["rows"]]
    cut = bool(answer["truncated"])
    return QueryResult(columns, rows, cut, "the row limit" if cut else None, float(answer["elapsed_ms"]))


def _local(args: argparse.Namespace) -> QueryResult | int:
    """The result from ``--db``, or the exit code when the store cannot be read here."""
    db = Path(args.db)
    if not db.exists():
        print(
            f"rankecho query: {db} does not exist: pass the store file Echo was started with", file=sys.stderr
        )
        return exitcodes.FAILED
    if is_locked(db):
        print(held_message("query", db, read_holder(db)), file=sys.stderr)
        return exitcodes.STORE_HELD
    memory_limit_bytes(args.memory_limit, "--memory-limit")
    return run_query(db, args.sql, args.timeout, args.max_rows, args.memory_limit)


def main(args: argparse.Namespace) -> int:
    try:
        if args.mcp_url:
            result: QueryResult | int = run_remote(
                args.mcp_url, mcp_token(args.token_file), args.sql, args.timeout, args.max_rows
            )
        else:
            result = _local(args)
    except (Refused, QueryError, QueryTimeoutError, SettingsError, FileNotFoundError) as exc:
        print(f"rankecho query: {safe_message(exc, 2000)}", file=sys.stderr)
        return exitcodes.FAILED
    except (AskError, OSError, ValueError) as exc:
        print(f"rankecho query: {exc}", file=sys.stderr)
        return exitcodes.FAILED
    if isinstance(result, int):
        return result
    if args.json:
        rows = [[_jsonable(v) for v in row] for row in result.rows]
        print(json.dumps({"columns": result.columns, "rows": rows, "truncated": result.truncated}))
    else:
        print(format_table(result))
    return exitcodes.OK
