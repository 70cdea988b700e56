"""What the guard lets through: relations, table functions and scalar functions, as allowlists.

Scalar/aggregate/window functions are allowed only when DuckDB itself ships them (looked up once in a
private in-memory instance) and they are not on the deny list below, so a macro or UDF that somebody
registers later is refused until it is reviewed here.

Usage::

    policy = Policy.for_relations(["events"])
    policy.allows_function("quantile_cont")  # True
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb

from rankecho.echo.guard.refusal import ALLOWED

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

DEFAULT_TABLE_FUNCTIONS: frozenset[str] = frozenset(
    {"range", "generate_series", "unnest", "json_each", "json_tree"}
)
"""Table functions that only expand their arguments; none of them reaches a file or the catalog."""

DENIED_FUNCTIONS: frozenset[str] = frozenset(
    {
        "getenv",
        "current_setting",
        "getvariable",
        "current_database",
        "current_catalog",
        "current_schema",
        "current_schemas",
        "current_query",
        "current_user",
        "session_user",
        "user",
        "setseed",
        "user_agent",
        "platform",
        "nextval",
        "currval",
        "setval",
        "lastval",
        "txid_current",
        "in_search_path",
        "sleep_ms",
        "write_log",
        "query",
        "query_table",
        "glob",
        "which_secret",
        "checkpoint",
        "force_checkpoint",
        "truncate_duckdb_logs",
        "sql_auto_complete",
        "json_execute_serialized_sql",
        "json_serialize_sql",
        "json_deserialize_sql",
        "json_serialize_plan",
        "current_role",
        "current_connection_id",
        "current_query_id",
        "current_transaction_id",
        "parse_duckdb_log_message",
        "version",
        "stats",
        "to_aggregate_state",
        "index_key",
        "get_block_size",
        "format_type",
        "format_pg_type",
        "map_type_id_to_pg_oid",
    }
)
DENIED_PREFIXES: tuple[str, ...] = (
    "read_",
    "sniff_",
    "duckdb_",
    "pragma_",
    "parquet_",
    "pg_",
    "has_",
    "enable_",
    "disable_",
    "create_",
    "register_",
    "deregister_",
    "destroy_",
    "python_",
    "arrow_",
    "pandas_",
    "icu_",
    "__internal",
    "json_copy_",
)


_METADATA = re.compile(r"duckdb_|pragma_|information_schema|current_setting|pg_catalog", re.IGNORECASE)
"""In a built-in macro's definition: the macro reads the catalog or settings (get_block_size, format_type)."""


@functools.cache
def builtin_functions() -> frozenset[str]:
    """Names of DuckDB's own scalar, aggregate, window and macro functions (not table functions),
    without the built-in macros that read the catalog or settings."""
    with duckdb.connect(":memory:") as con:
        rows = con.execute(
            "SELECT lower(function_name), coalesce(macro_definition, '') FROM duckdb_functions() "
            "WHERE internal AND function_type IN ('scalar', 'aggregate', 'window', 'macro')"
        ).fetchall()
    names = {name for name, _ in rows}
    return frozenset(names - {name for name, body in rows if _METADATA.search(body)})


def is_denied(name: str) -> bool:
    lowered = name.lower()
    return lowered in DENIED_FUNCTIONS or lowered.startswith(DENIED_PREFIXES)


@dataclass(frozen=True)
class Policy:
    """Allowlists for one database. ``relations`` are lower-case table/view names in schema ``main``."""

    relations: frozenset[str]
    table_functions: frozenset[str] = DEFAULT_TABLE_FUNCTIONS
    project_functions: frozenset[str] = frozenset()
    """Scalar macros the project defines on every read connection (reviewed like built-ins)."""

    @classmethod
    def for_relations(
        cls, names: Iterable[str], table_functions: Iterable[str] = (), functions: Iterable[str] = ()
    ) -> Policy:
        """Allow the relations ``names`` and, beside the default table functions and DuckDB's own
        functions, the project's read-only table macros (``table_functions``) and scalar macros
        (``functions``)."""
        cleaned = {n.lower() for n in names}
        tables = {n.lower() for n in table_functions}
        scalars = {n.lower() for n in functions}
        bad = sorted(n for n in cleaned | tables | scalars if not IDENTIFIER.match(n))
        if bad:
            raise ValueError(f"relation and function names must be plain identifiers, got {bad}")
        return cls(frozenset(cleaned), DEFAULT_TABLE_FUNCTIONS | tables, frozenset(scalars))

    def allows_relation(self, name: str) -> bool:
        return name.lower() in self.relations

    def allows_table_function(self, name: str) -> bool:
        return name.lower() in self.table_functions

    def allows_function(self, name: str) -> bool:
        """DuckDB's own scalar/aggregate/window functions, plus ``unnest``/``range`` used as scalars."""
        lowered = name.lower()
        return not is_denied(lowered) and (
            lowered in builtin_functions()
            or lowered in self.table_functions
            or lowered in self.project_functions
        )

    def allowed_text(self) -> str:
        """The sentence every refusal ends with."""
        return ALLOWED.format(
            relations=", ".join(sorted(self.relations)) or "(none)",
            table_functions=", ".join(sorted(self.table_functions)),
        )
