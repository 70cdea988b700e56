"""Dynamic PIVOT (no IN list) for the parser layer: check the static twin DuckDB can serialise.

``PIVOT events ON metric_name USING avg(value_double)`` is a MULTI statement to DuckDB (it first
collects the distinct ``metric_name`` values, then pivots), and ``json_serialize_sql`` refuses it, so
the AST walk cannot see it. :func:`static_twin` returns the same text with ``IN (NULL)`` added after
each ON expression that has no IN list. Only constants are added, nothing is removed, so every
relation, function and expression of the original is in the twin's AST; the twin passing the walk
means the original reads nothing more. The original is what runs.

Usage::

    static_twin("PIVOT events ON metric_name USING avg(value_double)")
    # 'PIVOT events ON metric_name IN (NULL) USING avg(value_double)'
"""

from __future__ import annotations

from rankecho.echo.guard.tokens import tokens as scan

_END_OF_ON = frozenset({"using", "group", "order", "limit", "offset", "qualify", "where", "having"})


def static_twin(sql: str) -> str | None:
    """``sql`` with ``IN (NULL)`` after every PIVOT ON expression lacking an IN list; None if none."""
    tokens = [(tok.start, tok.end, tok.text) for tok in scan(sql)]
    inserts: list[int] = []
    for i, (_, _, text) in enumerate(tokens):
        if text.lower() not in ("pivot", "pivot_wider"):
            continue
        on = _find_on(tokens, i + 1)
        if on is not None:
            inserts += _missing_in(tokens, on + 1)
    if not inserts:
        return None
    out = sql
    for at in sorted(set(inserts), reverse=True):
        out = out[:at] + " IN (NULL)" + out[at:]
    return out


def _find_on(tokens: list[tuple[int, int, str]], start: int) -> int | None:
    """Index of the PIVOT's own ON (at its parenthesis depth), or None."""
    depth = 0
    for j in range(start, len(tokens)):
        text = tokens[j][2]
        if text == "(":
            depth += 1
        elif text == ")":
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0 and text.lower() == "on":
            return j
        elif depth == 0 and text == ";":
            return None
    return None


def _missing_in(tokens: list[tuple[int, int, str]], start: int) -> list[int]:
    """Offsets after each ON item (comma-separated, at depth 0) that has no IN of its own."""
    depth, has_in, last_end, out = 0, False, None, []
    for j in range(start, len(tokens)):
        _, end, text = tokens[j]
        low = text.lower()
        if text == "(":
            depth += 1
        elif text == ")":
            depth -= 1
            if depth < 0:
                break
        elif depth == 0 and (low in _END_OF_ON or text == ";"):
            break
        elif depth == 0 and text == ",":
            if not has_in and last_end is not None:
                out.append(last_end)
            has_in, last_end = False, None
            continue
        elif depth == 0 and low == "in":
            has_in = True
        last_end = end
    if not has_in and last_end is not None:
        out.append(last_end)
    return out
