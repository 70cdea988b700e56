"""The guard's single entry point: lexical pre-check, DuckDB's parser and the AST allowlist, then DuckDB's
binder and the plan's allowlist.

Both the MCP boundary and the store's read path call :func:`check_sql`, so the two cannot drift.

Usage::

    text = check_sql("SELECT node_id, count(*) FROM events GROUP BY node_id")
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from rankecho.echo.guard.bound import check_bound
from rankecho.echo.guard.lexical import check_lexical
from rankecho.echo.guard.parsed import check_parsed
from rankecho.echo.guard.policy import Policy
from rankecho.echo.guard.refusal import Refused
from rankecho.echo.queries import LAYERS

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
_TABLE_MACRO = re.compile(r"\bAS\s+TABLE\b", re.IGNORECASE)
_DDL_NAME = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:TABLE|VIEW)\s+(?:IF\s+NOT\s+EXISTS\s+)?(?:main\.)?\"?(\w+)\"?",
    re.IGNORECASE,
)


@functools.cache
def project_policy() -> Policy:
    """Tables and views created by the project's own migrations (``echo/migrations/*.sql``), and the
    straggler analysis's table and scalar macros (``echo/queries/layers``), which read only those tables."""
    names: set[str] = set()
    for path in sorted(MIGRATIONS.glob("*.sql")):
        names.update(_DDL_NAME.findall(path.read_text(encoding="utf-8")))
    tables = [name for name, layer in LAYERS.items() if _TABLE_MACRO.search(layer.sql)]
    functions = [name for name, layer in LAYERS.items() if layer.is_macro and name not in tables]
    return Policy.for_relations(names, tables, functions)


def check_sql(sql: str, policy: Policy | None = None) -> str:
    """Return the normalised statement if it may run, else raise :class:`Refused` with what is allowed.

    Allowed statements are remembered by exact text (the decision depends only on the text and the
    policy), so the second check of the same query, in the store after the MCP boundary, and the tools'
    named queries cost a dictionary lookup. Refusals are never cached: each one is decided afresh.
    """
    if not isinstance(sql, str):
        raise Refused("the query must be a string", (policy or project_policy()).allowed_text())
    return _allowed(sql, policy or project_policy())


def check_sql_uncached(sql: str, policy: Policy) -> str:
    """:func:`check_sql` without the memory of allowed statements (benchmarks measure this)."""
    try:
        text = check_lexical(sql)
        checked, tree = check_parsed(text, policy)
        check_bound(checked, tree, policy, twin=checked != text)
    except Refused as refused:
        raise Refused(refused.reason, policy.allowed_text()) from None
    return text


_allowed = functools.lru_cache(maxsize=1024)(check_sql_uncached)


def clear_guard_cache() -> None:
    """Forget every remembered allowed statement (after a policy change; benchmarks use it)."""
    _allowed.cache_clear()
