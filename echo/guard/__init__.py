"""The SQL guard: one implementation that decides whether a caller's query may run.

Layers: :mod:`rankecho.echo.guard.lexical` (spelling, on DuckDB's tokens: :mod:`echo.guard.tokens`),
:mod:`rankecho.echo.guard.parsed` (DuckDB's AST against allowlists, with :mod:`echo.guard.limits` for
constant sizes and :mod:`echo.guard.pivot` for a PIVOT without IN list), :mod:`echo.guard.bound` (DuckDB's
binder: what each name means, against the catalog of :mod:`echo.guard.catalog`). Every refusal is
:class:`Refused`. The primary control is not here: the analysis workers' catalog holds only what the
policy allows (:func:`echo.guard.catalog.prune`), so the checks are defence in depth. Execution is not
here: callers' SQL runs in the analysis sandbox (:mod:`echo.sandbox`: worker processes with memory and
time limits, sealed, read-only), the tools' own queries in the store's
:class:`rankecho.echo.store.reader.Reader`.
"""

from rankecho.echo.guard.check import check_sql, project_policy
from rankecho.echo.guard.policy import Policy
from rankecho.echo.guard.refusal import Refused, safe_message

__all__ = ["Policy", "Refused", "check_sql", "project_policy", "safe_message"]
