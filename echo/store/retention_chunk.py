"""One retention step's delete: a table group's oldest rows below a bound, in one short transaction, the
bound chosen so the step fits its time budget.

Retention (echo/store/retention.py) decides when a pass runs, where its cutoffs lie and how it ends. How
much one step may delete is a job of its own, with state per table group (the span and row count the
last step's measured cost allows): a quiet hour followed by a busy one must not make one step delete
the busy hour, and a step must stay short at any ingest rate and whatever a row costs to delete.

Usage::

    sql = Statements(con)
    group = TableGroup("events_oldest", "events_count", ("delete_events",), cutoff_ns, NS, 5_000)
    while (done := delete_chunk(sql, group, now_ns, budget_s=0.25, chunk_rows=250_000)) and done.more: ...
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb

from rankecho.echo.queries import RETENTION
from rankecho.echo.store.writer import rollback

MIN_STEP_ROWS = 100
"""However slow the last step was, the next may delete this many rows (unless ``chunk_rows`` is lower;
progress is guaranteed anyway: a step deletes at least the oldest minute or nanosecond)."""


@dataclass
class TableGroup:
    """One group of raw tables a pass deletes from, with its own cutoff and chunk span."""

    oldest: str
    """The statement giving the group's oldest time below a cutoff."""
    count: str
    """The statement counting the group's rows below a cutoff."""
    deletes: tuple[str, ...]
    cutoff_ns: int
    span_ns: int
    target_rows: int
    """Rows one step may delete: starts at ``RetentionPolicy.first_rows``, then what fits the step's time
    budget at the cost per row measured by the last step (at most ``chunk_rows``)."""
    quantum_ns: int = 1
    """Chunk bounds are multiples of this (a minute for the collectives, so no minute is rolled up in
    pieces), and so is the span."""
    rollup: bool = False
    done: bool = False


@dataclass(frozen=True)
class ChunkDone:
    """What one chunk's transaction did."""

    deleted: int
    """Raw rows deleted from the group's tables."""
    rollup_rows: int
    """Rollup rows written for them (0 for a group without a rollup)."""
    more: bool
    """Rows remain below the group's cutoff."""


class Statements:
    """The retention statements (echo/queries/retention) on the writer's connection."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def run(self, name: str, **params: Any) -> None:
        query = RETENTION[name]
        self.con.execute(query.sql, query.bind(**params)).fetchall()  # no result left open on the cursor

    def one(self, name: str, **params: Any) -> tuple[Any, ...]:
        query = RETENTION[name]
        found = self.con.execute(query.sql, query.bind(**params)).fetchall()  # all: none left open
        return tuple(found[0]) if found else (None, None)

    def count(self, name: str, **params: Any) -> int:
        """Rows an INSERT or DELETE touched (DuckDB returns the count as its one row)."""
        return int(self.one(name, **params)[0] or 0)


def delete_chunk(
    sql: Statements, group: TableGroup, now_ns: int, budget_s: float, chunk_rows: int,
    monotonic: Callable[[], float] = time.monotonic,
) -> ChunkDone | None:  # fmt: skip
    """One transaction: roll up and delete the group's rows below the chunk's upper bound; None when
    nothing is left below the group's cutoff. The bound is found by counting first (a scan of the time
    column of the old row groups only), halving the span while more than the group's target rows lie
    below it; then the group's target rows and span follow the cost per row this step measured."""
    oldest = sql.one(group.oldest, cutoff_ns=group.cutoff_ns)[0]
    if oldest is None:
        return None
    q = group.quantum_ns
    base, span = int(oldest) - int(oldest) % q, group.span_ns
    below = sql.count(group.count, cutoff_ns=min(group.cutoff_ns, base + span))
    while below > group.target_rows and span > q:
        span = max(q, span // 2 - span // 2 % q)
        below = sql.count(group.count, cutoff_ns=min(group.cutoff_ns, base + span))
    upper = min(group.cutoff_ns, base + span)
    started = monotonic()
    con = sql.con
    con.execute("BEGIN TRANSACTION")
    try:
        rolled_up = sql.count("rollup_collectives", cutoff_ns=upper, now_ns=now_ns) if group.rollup else 0
        deleted = sum(sql.count(name, cutoff_ns=upper) for name in group.deletes)
        con.execute("COMMIT")
    except Exception:
        rollback(con)
        raise
    seconds = monotonic() - started
    if deleted and seconds > 0:  # rows that fit the time budget at the cost just measured
        fit = int(deleted * budget_s / seconds)
        group.target_rows = min(chunk_rows, max(MIN_STEP_ROWS, fit))
    group.span_ns = span * 2 if below < group.target_rows // 2 else span
    return ChunkDone(deleted, rolled_up, upper < group.cutoff_ns)
