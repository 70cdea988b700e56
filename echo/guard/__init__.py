"""The SQL guard: one implementation that decides whether a caller's query may run.

Layers: :mod:`echo.guard.lexical` (spelling), :mod:`echo.guard.parsed` (DuckDB's AST against
allowlists, with :mod:`echo.guard.limits` for constant sizes and :mod:`echo.guard.pivot` for a PIVOT
without IN list). Every refusal is :class:`Refused`. Execution is not here: callers' SQL runs in the
analysis sandbox (:mod:`echo.sandbox`: worker processes with memory and time limits, sealed, read-only),
the tools' own queries in the store's :class:`echo.store.reader.Reader`.
"""

from echo.guard.check import check_sql, project_policy
from echo.guard.policy import Policy
from echo.guard.refusal import Refused, safe_message

__all__ = ["Policy", "Refused", "check_sql", "project_policy", "safe_message"]
