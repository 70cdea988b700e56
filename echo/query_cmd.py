"""``rankecho query``: one read-only statement on a store file that no Echo holds.

Uses the same :class:`echo.store.reader.Reader` (and statement check) as Echo's own read API.
Exit codes: 0 ok, 1 query refused or failed, 3 store held by a running Echo.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import duckdb

from echo.store.lock import is_locked, read_holder
from echo.store.readcheck import ReadOnlyViolation
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
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.Error as exc:
        print(f"rankecho query: cannot open {db}: {exc}", file=sys.stderr)
        return 1
    try:
        result = Reader(con).query(args.sql, timeout_s=args.timeout, max_rows=args.max_rows)
    except (ReadOnlyViolation, QueryError, QueryTimeoutError) as exc:
        print(f"rankecho query: {exc}", file=sys.stderr)
        return 1
    finally:
        con.close()
    if args.json:
        rows = [[_jsonable(v) for v in row] for row in result.rows]
        print(json.dumps({"columns": result.columns, "rows": rows, "truncated": result.truncated}))
    else:
        print(format_table(result))
    return 0
