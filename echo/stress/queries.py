"""The fan-in proof's named queries (``fanin.sql``), loaded once; the tests and the demo run the same text.

Usage::

    sql = FANIN_QUERIES["stragglers"]
"""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_named(path: Path) -> dict[str, str]:
    """``-- name: x`` blocks -> {x: statement}. The comment lines under a name are its docstring and
    are dropped; the statement keeps its text exactly, minus the trailing semicolon."""
    text = path.read_text()
    marks = list(_NAME.finditer(text))
    queries: dict[str, str] = {}
    for mark, nxt in zip(marks, [*marks[1:], None], strict=True):
        body = text[mark.end() : nxt.start() if nxt else len(text)]
        lines = [line for line in body.strip().splitlines() if not line.startswith("--")]
        queries[mark.group(1)] = "\n".join(lines).strip().rstrip(";")
    return queries


FANIN_QUERIES = load_named(Path(__file__).with_name("fanin.sql"))
