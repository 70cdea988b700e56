"""The one exception the guard raises, and the text that tells a caller what *is* allowed.

A refusal names the rule that fired and the allowed shape of a query; it never echoes stack traces,
file paths or the instance's configuration, because the caller may be hostile. :func:`safe_message`
applies the same rule to DuckDB's own errors (a binder error naming a missing column is useful; a
path in an error is not).
"""

from __future__ import annotations

import re

ALLOWED = (
    "Allowed: exactly one read-only SELECT (WITH/CTEs, joins, subqueries, LATERAL, UNION/INTERSECT/EXCEPT, "
    "window functions, aggregates, JSON functions such as json_extract_string) over the tables and views "
    "{relations}; table functions {table_functions} only. Not allowed: files, URLs, other databases, "
    "catalog or settings introspection, and any statement that changes state."
)

_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:)?[/\\](?:[\w.@+-]+[/\\])+[\w.@+-]*")


class Refused(ValueError):
    """A statement the guard will not run. ``reason`` is short and safe to show to any caller."""

    def __init__(self, reason: str, allowed: str = "") -> None:
        self.reason = reason
        self.allowed = allowed
        super().__init__(f"query refused: {reason}. {allowed}".strip())


def safe_name(name: str) -> str:
    """A caller-supplied name, shortened and reduced to printable ASCII, for a refusal message."""
    cleaned = "".join(ch if ch.isascii() and ch.isprintable() else "?" for ch in name[:60])
    return f"'{cleaned}'"


def safe_message(exc: BaseException, max_chars: int = 400) -> str:
    """An error's first lines with file paths replaced by ``<path>``, bounded in size, never a trace."""
    text = " ".join(line.strip() for line in str(exc).splitlines()[:4] if line.strip())
    return _PATH.sub("<path>", text)[:max_chars] or type(exc).__name__
