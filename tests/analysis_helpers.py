"""What the analysis unit tests ask of a store: rows as dicts, and each significant straggler's late steps."""

from __future__ import annotations

from typing import Any

import duckdb

from rankecho.echo.store.reader import Reader


def query(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    result = Reader(con).query(sql, max_rows=100_000)
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def late_steps(con: duckdb.DuckDBPyConnection, min_late_ms: float | None = None) -> dict[Any, list[int]]:
    rows = query(
        con,
        f"SELECT kind, node_id, rank, episode_list FROM rk_stragglers(NULL, NULL, NULL, min_late_ms := "
        f"{'NULL' if min_late_ms is None else min_late_ms}) WHERE significant",
    )
    return {(r["kind"], r["node_id"], r["rank"]): [e["step"] for e in r["episode_list"]] for r in rows}
