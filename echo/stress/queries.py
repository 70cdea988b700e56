"""The fan-in proof's named queries (``fanin.sql``) as plain SQL text, loaded once with the project's one
named-SQL parser (:func:`echo.queries.parse_named`); the tests and the demo run the same text.

Usage::

    sql = FANIN_QUERIES["stragglers"]
"""

from __future__ import annotations

from echo.queries import FANIN_FILE, parse_named

FANIN_QUERIES: dict[str, str] = {
    name: query.sql for name, query in parse_named(FANIN_FILE.read_text(encoding="utf-8")).items()
}
