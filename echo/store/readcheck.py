"""The one place that decides whether SQL may run on the read API.

:func:`check_read_only` accepts exactly one SELECT statement. It is the store-side gate that every read
goes through (MCP tools, ``rankecho query``); the read transaction is additionally opened READ ONLY, so
anything that slipped past this check still cannot write.

Usage::

    statement = check_read_only("SELECT count(*) FROM events")   # -> the statement's SQL text
"""

from __future__ import annotations

import duckdb


class ReadOnlyViolation(ValueError):
    """The SQL is not a single read-only statement; the message says what to change."""


def check_read_only(sql: str) -> str:
    """Return the single statement's text, or raise :class:`ReadOnlyViolation`."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ReadOnlyViolation(f"SQL does not parse: {exc}") from None
    if len(statements) != 1:
        raise ReadOnlyViolation(
            f"send exactly one statement (got {len(statements)}); drop the extra ';' parts"
        )
    statement = statements[0]
    if statement.type != duckdb.StatementType.SELECT:
        kind = statement.type.name
        raise ReadOnlyViolation(
            f"only SELECT queries may run here (got {kind}); the store is read-only to queries"
        )
    return statement.query
