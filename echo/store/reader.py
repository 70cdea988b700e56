"""The read API: one read-only statement on a cursor of the store's DuckDB instance, bounded in time,
rows and bytes.

Each query runs on a cursor of its own (a connection to the same database instance, so it sees
committed rows while the writer keeps inserting), inside ``BEGIN TRANSACTION READ ONLY`` after
:func:`echo.guard.check_sql`, and a timer calls ``interrupt()`` on the cursor when the time is up. Every
cursor first defines the straggler analysis's table macros (``echo/queries/layers``: temporary, so
they live on that cursor only and never touch the store); finished cursors are kept for the next
query so that costs once per cursor, not once per query.

Usage::

    reader = Reader(connection)
    result = reader.query("SELECT node_id, count(*) FROM events GROUP BY 1", timeout_s=5)
    result.columns, result.rows, result.truncated
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from rankecho.echo.guard import check_sql
from rankecho.echo.queries import LAYERS

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
ANALYSIS_PRELUDE: tuple[str, ...] = tuple(layer.sql for layer in LAYERS.values())
"""Statements every read cursor runs once before its first query: the analysis layers' macros."""
IDLE_CURSORS = 8
"""Finished cursors kept for reuse; more are closed."""


class QueryTimeoutError(TimeoutError):
    pass


class QueryError(ValueError):
    """DuckDB refused or failed the query; the message is DuckDB's, prefixed with what to check."""


class QueryBusyError(QueryError):
    """Every analysis worker stayed busy for the whole timeout; the query did not start."""


class QueryResourceError(QueryError):
    """The query needed more memory than its worker may use (see :mod:`echo.sandbox`); it was stopped."""


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False
    """True when ``max_rows`` or ``max_bytes`` cut the result; ``truncated_by`` says which."""
    truncated_by: str | None = None
    elapsed_ms: float = 0.0
    types: list[str] = field(default_factory=list)


def row_bytes(row: tuple[Any, ...]) -> int:
    return sum(8 if v is None or isinstance(v, int | float | bool) else len(str(v)) for v in row) + 8


class Reader:
    """Thread-safe: a query never shares its cursor. ``check`` is the statement gate
    (:func:`rankecho.echo.guard.check_sql`); ``prelude`` runs once on each new cursor (trusted project SQL,
    not checked)."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        check: Callable[[str], str] = check_sql,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_rows: int = DEFAULT_MAX_ROWS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        prelude: Sequence[str] = ANALYSIS_PRELUDE,
    ) -> None:
        self._con = con
        self.check = check
        self.timeout_s = timeout_s
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._prelude = tuple(prelude)
        self._idle: list[duckdb.DuckDBPyConnection] = []
        self._lock = threading.Lock()

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        cur = self._con.cursor()
        for statement in self._prelude:
            cur.execute(statement)
        return cur

    def _release(self, cur: duckdb.DuckDBPyConnection) -> None:
        """End the cursor's read transaction and keep it, or close it when that fails or enough are kept."""
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error:
            cur.close()
            return
        with self._lock:
            if len(self._idle) < IDLE_CURSORS:
                self._idle.append(cur)
                return
        cur.close()

    def query(
        self,
        sql: str,
        params: Sequence[Any] | dict[str, Any] | None = None,
        timeout_s: float | None = None,
        max_rows: int | None = None,
        max_bytes: int | None = None,
    ) -> QueryResult:
        """Run ``sql``; raises :class:`echo.guard.Refused`, QueryTimeoutError or QueryError (with why)."""
        statement = self.check(sql)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        row_cap = self.max_rows if max_rows is None else max_rows
        byte_cap = self.max_bytes if max_bytes is None else max_bytes
        started = time.perf_counter()
        cur = self._cursor()
        done = threading.Event()
        stopping = threading.Lock()  # a late timer must never interrupt the cursor's next query

        def interrupt() -> None:
            with stopping:
                if not done.is_set():
                    cur.interrupt()

        timer = threading.Timer(timeout, interrupt)
        timer.daemon = True
        reusable = True
        try:
            cur.execute("BEGIN TRANSACTION READ ONLY")
            timer.start()
            cur.execute(statement, params)
            result = self._fetch(cur, row_cap, byte_cap)
        except duckdb.InterruptException:
            reusable = False
            raise QueryTimeoutError(
                f"query ran past {timeout:g} s and was stopped: narrow it (WHERE timestamp_ns ..., LIMIT)"
            ) from None
        except duckdb.Error as exc:
            raise QueryError(f"query failed: {exc}") from None
        finally:
            with stopping:
                done.set()
            timer.cancel()
            if reusable:
                self._release(cur)  # ends the read transaction
            else:
                cur.close()
        result.elapsed_ms = (time.perf_counter() - started) * 1000
        return result

    @staticmethod
    def _fetch(cur: duckdb.DuckDBPyConnection, row_cap: int, byte_cap: int) -> QueryResult:
        description = cur.description or []
        result = QueryResult([d[0] for d in description], [], types=[str(d[1]) for d in description])
        size = 0
        while True:
            chunk = cur.fetchmany(1024)
            if not chunk:
                return result
            for row in chunk:
                size += row_bytes(row)
                if size > byte_cap:
                    result.truncated, result.truncated_by = True, "max_bytes"
                    return result
                if len(result.rows) >= row_cap:
                    result.truncated, result.truncated_by = True, "max_rows"
                    return result
                result.rows.append(row)
