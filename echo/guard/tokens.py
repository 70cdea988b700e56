"""DuckDB's own tokenizer, as tokens with their text: what the guard's spelling rules read.

:func:`duckdb.tokenize` gives each token's start and kind as DuckDB's scanner sees it: string literals
(plain, ``E'...'``, ``$$...$$``), quoted and bare names, keywords, numbers, operators and comments,
nested comments included. Reading the text through it, not through a regular expression of our own,
means a rule never reads inside a literal or a quoted name by mistake, and costs time linear in the
text (DuckDB's scanner is a single pass; no backtracking).

Usage::

    [t.text for t in tokens("SELECT 'a' AS \\"x\\" -- c")]   # ["SELECT", "'a'", "AS", '"x"']
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from rankecho.echo.guard.refusal import Refused

_KINDS = {
    "identifier": "name",
    "numeric_const": "number",
    "string_const": "string",
    "operator": "operator",
    "keyword": "keyword",
    "comment": "comment",
}


@dataclass(frozen=True)
class Token:
    start: int
    end: int
    kind: str
    """name, number, string, operator, keyword or comment."""
    text: str

    @property
    def lower(self) -> str:
        return self.text.lower()

    @property
    def quoted(self) -> bool:
        """A double-quoted name (``"events/s"``): always a name, never a keyword."""
        return self.kind == "name" and self.text.startswith('"')

    @property
    def name(self) -> str:
        """The name a quoted token spells (quotes removed, doubled quotes undone); else the text."""
        if not self.quoted:
            return self.text
        return self.text[1:].removesuffix('"').replace('""', '"')


def tokens(sql: str, comments: bool = False) -> list[Token]:
    """The tokens of ``sql`` in order, comments left out unless asked for."""
    try:
        raw = duckdb.tokenize(sql)
    except (duckdb.Error, RuntimeError, ValueError) as exc:
        first = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise Refused(f"DuckDB cannot read the query ({first})") from None
    out = []
    for i, (start, kind) in enumerate(raw):
        stop = raw[i + 1][0] if i + 1 < len(raw) else len(sql)
        text = sql[start:stop].rstrip()
        name = _KINDS.get(str(kind).rsplit(".", 1)[-1], "operator")
        if name == "comment" and not comments:
            continue
        out.append(Token(start, start + len(text), name, text))
    return out
