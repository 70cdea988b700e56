"""The one place that decides whether SQL may run on the read API.

:func:`check_read_only` accepts exactly one guarded read-only SELECT (see :mod:`echo.guard`).
It is the store-side gate that every read goes through (MCP tools, ``rankecho query``); the read
transaction is additionally opened READ ONLY, so anything that slipped past this check still cannot
write.

Usage::

    statement = check_read_only("SELECT count(*) FROM events")   # -> the statement's SQL text
"""

from __future__ import annotations

from echo.guard import Refused, check_sql


class ReadOnlyViolation(ValueError):
    """The SQL is not a single read-only statement; the message says what to change."""


def check_read_only(sql: str) -> str:
    """Return the statement to run, or raise :class:`ReadOnlyViolation` with what is allowed.

    The decision is :func:`echo.guard.check_sql` (lexical pre-check, DuckDB's parser, AST allowlists),
    the same guard the MCP boundary applies, so the two layers cannot drift.
    """
    try:
        return check_sql(sql)
    except Refused as refused:
        raise ReadOnlyViolation(str(refused)) from None
