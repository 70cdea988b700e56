"""The SQL guard: one implementation that decides whether a caller's query may run.

Layers: :mod:`echo.guard.lexical` (spelling), :mod:`echo.guard.parsed` (DuckDB's AST against
allowlists); execution (read-only transaction, interrupt timer, caps) is the store's
:class:`echo.store.reader.Reader`.
"""

from echo.guard.check import check_sql, project_policy
from echo.guard.policy import Policy
from echo.guard.refusal import Refused, safe_message

__all__ = ["Policy", "Refused", "check_sql", "project_policy", "safe_message"]
