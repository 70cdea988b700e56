"""Named SQL (aiosql-style ``-- name: x`` blocks in ``*.sql`` files), the one loader for all of it.

The comment lines right under a name are that statement's docstring. Tools call queries by name and bind
``$name`` parameters; none of them builds SQL text. Five folders, five roles:

- ``echo/queries/*.sql`` (:data:`QUERIES`): read queries the tools, the CLI and the tests run;
- ``echo/queries/layers/*.sql`` (:data:`LAYERS`): the straggler analysis as layered DuckDB table macros
  (``CREATE OR REPLACE TEMP MACRO rk_...``), defined on every read connection (see
  :class:`rankecho.echo.store.reader.Reader`) and called by the read queries, or by an analyst, like tables;
- ``echo/queries/staging/*.sql`` (:data:`STAGING`): the writer's copies of agent events into the typed
  analysis tables;
- ``echo/queries/retention/*.sql`` (:data:`RETENTION`): the writer's rollups and deletions of old rows;
- ``echo/queries/fanin/*.sql`` (:data:`FANIN`): the fan-in proof's queries (``rankecho stress``, tests,
  demo), four of which agents get as examples.

Usage::

    q = QUERIES["event_history"]
    reader.query(q.sql, q.bind(start_ns=None, end_ns=None, ...))
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_PARAM = re.compile(r"\$([A-Za-z_]\w*)")
_MACRO = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\s+)?MACRO\b", re.IGNORECASE)
OPTIONAL: Mapping[str, Any] = {"job_id": None}
"""Parameters a caller may leave out: ``$job_id`` NULL = every job (the analysis layers' ``job := NULL``)."""


@dataclass(frozen=True)
class NamedQuery:
    name: str
    sql: str
    doc: str
    params: frozenset[str]

    def bind(self, **values: Any) -> dict[str, Any]:
        """The parameter dict for this query; every ``$param`` must be given, and nothing else, except
        those of :data:`OPTIONAL`, which default to their value there."""
        values = {k: v for k, v in OPTIONAL.items() if k in self.params} | values
        missing = sorted(self.params - values.keys())
        extra = sorted(values.keys() - self.params)
        if missing or extra:
            raise KeyError(f"query {self.name}: missing parameters {missing}, unknown parameters {extra}")
        return values

    @property
    def is_macro(self) -> bool:
        """A ``CREATE ... MACRO`` (a function callers may name), not a setting such as the parameter
        table's ``SET VARIABLE`` (``layers/00_params.sql``)."""
        return _MACRO.match(self.sql) is not None


def parse_named(text: str) -> dict[str, NamedQuery]:
    """``-- name: x`` blocks -> {x: NamedQuery}; text before the first name is the file's header."""
    marks = list(_NAME.finditer(text))
    queries: dict[str, NamedQuery] = {}
    for mark, nxt in zip(marks, [*marks[1:], None], strict=True):
        lines = text[mark.end() : nxt.start() if nxt else len(text)].strip().splitlines()
        doc_lines = []
        while lines and lines[0].startswith("--"):
            doc_lines.append(lines.pop(0).removeprefix("--").strip())
        sql = "\n".join(lines).strip().removesuffix(";").rstrip()
        name = mark.group(1)
        if name in queries:
            raise ValueError(f"query name {name!r} is defined twice")
        queries[name] = NamedQuery(name, sql, " ".join(doc_lines), frozenset(_PARAM.findall(sql)))
    return queries


def load_dir(folder: Path) -> Mapping[str, NamedQuery]:
    """Every named query of every ``*.sql`` file in ``folder``; a name must be unique across files."""
    queries: dict[str, NamedQuery] = {}
    for path in sorted(folder.glob("*.sql")):
        for name, query in parse_named(path.read_text(encoding="utf-8")).items():
            if name in queries:
                raise ValueError(f"query name {name!r} is defined in more than one file of {folder}")
            queries[name] = query
    return queries


HERE = Path(__file__).resolve().parent
QUERIES: Mapping[str, NamedQuery] = load_dir(HERE)
LAYERS: Mapping[str, NamedQuery] = load_dir(HERE / "layers")
"""Analysis macros in definition order (by file, then in the file): later layers call earlier ones."""
STAGING: Mapping[str, NamedQuery] = load_dir(HERE / "staging")
FANIN: Mapping[str, NamedQuery] = load_dir(HERE / "fanin")
"""The fan-in proof's four queries plus its checks: the tests and the demo run them, agents get the four
as examples."""
SEED_EXAMPLES = ("per_node_events", "chains", "stragglers", "health_quantiles")


def seed_examples() -> list[NamedQuery]:
    """The fan-in proof's four queries, verbatim, with their docstrings."""
    return [FANIN[name] for name in SEED_EXAMPLES]
WRITER: Mapping[str, NamedQuery] = load_dir(HERE / "writer")
"""The writer's own reads while it commits (:mod:`rankecho.echo.store.resend`); not in :data:`QUERIES`."""
RETENTION: Mapping[str, NamedQuery] = load_dir(HERE / "retention")
"""The writer's retention statements (roll up, delete below a cutoff, measure), run by
:mod:`rankecho.echo.store.retention` and :mod:`rankecho.echo.store.retention_chunk` on the writer thread;
not read queries, so not in :data:`QUERIES`."""
