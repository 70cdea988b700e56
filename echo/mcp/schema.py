"""The schema an agent needs to write correct SQL first time: tables, columns, meanings, units, examples.

Served as the MCP resource ``rankecho://schema``. Column names and types come from the live database
(so a migration cannot leave this stale); meanings and units are written here; examples are the fan-in
proof's four queries and the named ``example_*`` queries in ``echo/queries/examples.sql``.

Usage::

    document = schema_document(reader)
"""

from __future__ import annotations

from typing import Any

from echo.queries import QUERIES, seed_examples
from echo.store.reader import Reader
from shared import contract

COLUMNS: dict[str, tuple[str, str]] = {
    "event_id": ("unique id of the event (the producer's rankecho.event_id, else a content hash)", ""),
    "timestamp_ns": ("when the event happened on its node", "ns since Unix epoch, UTC"),
    "received_ns": ("when Echo decoded it", "ns since Unix epoch, UTC"),
    "signal": ("'metric', 'span' or 'log'", ""),
    "cluster_id": ("cluster the node belongs to", ""),
    "node_id": ("host / Kubernetes node that sent the event", ""),
    "metric_name": ("metric name (e.g. rankecho.health.score), span name, or log event name", ""),
    "rank": ("global rank of the process (one GPU per rank)", ""),
    "nranks": ("number of ranks in the job", ""),
    "value_double": (
        "the value of a floating-point metric (health scores are 0..1, higher is healthier)",
        "metric's own unit",
    ),
    "value_int": ("the value of an integer metric", "metric's own unit"),
    "causal_chain_id": ("same string on every rank for one collective instance: join ranks on it", ""),
    "attrs_json": (
        "every other attribute as a JSON object; keys contain dots, so quote them: "
        "json_extract_string(attrs_json, '$.\"rankecho.gpu.model\"')",
        "",
    ),
}

GUIDE = (
    "One row per event. Filter on timestamp_ns (nanoseconds) and node_id/metric_name first; aggregate "
    "before returning rows (results are capped). Use quantile_cont for medians/percentiles, "
    "json_extract_string for attributes, window functions for per-rank lag. Only SELECT over the tables "
    "listed here runs; files, URLs and DuckDB's catalog are refused."
)


def schema_document(reader: Reader) -> dict[str, Any]:
    """Tables with typed, documented columns, the well-known metric names, and example queries."""
    described = reader.query("SELECT * FROM events LIMIT 0")
    columns = [
        {
            "name": name,
            "type": kind,
            "meaning": COLUMNS.get(name, ("", ""))[0],
            "unit": COLUMNS.get(name, ("", ""))[1],
        }
        for name, kind in zip(described.columns, described.types, strict=True)
    ]
    metrics = sorted(
        value for key, value in vars(contract).items() if key.startswith("M_") and isinstance(value, str)
    )
    examples = [
        {"name": q.name.removeprefix("example_"), "purpose": q.doc, "sql": q.sql}
        for q in [*seed_examples(), *(q for q in QUERIES.values() if q.name.startswith("example_"))]
    ]
    return {
        "guide": GUIDE,
        "tables": [{"name": "events", "columns": columns}],
        "metric_names": metrics,
        "examples": examples,
    }
