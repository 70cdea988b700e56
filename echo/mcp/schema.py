"""The schema an agent needs to write correct SQL first time: tables, columns, meanings, units, examples.

Served as the MCP resource ``rankecho://schema``. Column names and types come from the live database
(so a migration cannot leave this stale); meanings and units are written here; the analysis layers are
listed with their parameters and docstrings (``echo/queries/layers``), and their tuning parameters
(name, value, why) from the live ``rk_params()`` table; examples are the fan-in proof's four queries and
the named ``example_*`` queries of ``echo/queries``.

Usage::

    document = schema_document(reader)
"""

from __future__ import annotations

import re
from typing import Any

from rankecho.echo.queries import LAYERS, QUERIES, seed_examples
from rankecho.echo.store.reader import Reader
from rankecho.shared import contract

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

TABLES: dict[str, str] = {
    "events": "one row per OTLP data point, span or log record: the system of record",
    "collectives": "typed copy of every rankecho.nccl.collective event (one per collective call per rank)",
    "host_activity": "typed copy of every interval a rank's thread spent in a CUDA call or off the CPU",
    "stacks": "one row per distinct call stack (stack_id, frames innermost first, truncated); collectives "
    "and host_activity cite them by stack_id (the pre-call breakdown by pre_<class>_stack, pre_oncpu_stack)",
}
GUIDE = (
    "One row per event in `events`. Filter on timestamp_ns (nanoseconds) and node_id/metric_name first; "
    "aggregate before returning rows (results are capped). Use quantile_cont for medians/percentiles, "
    "json_extract_string for attributes, window functions for per-rank lag. The straggler analysis is "
    "available as table functions (analysis_layers), e.g. FROM rk_stragglers(NULL, NULL, NULL); every "
    "number it is tuned by is in analysis_parameters (FROM rk_params(), or rk_param('noise_sigmas') in SQL); "
    "its typed "
    "inputs are the collectives and host_activity tables, whose stack ids join the stacks table (LEFT JOIN: "
    "a stack may be cited before it is stored). Only SELECT over the tables and functions listed "
    "here runs; files, URLs and DuckDB's catalog are refused."
)
_MACRO = re.compile(r"MACRO\s+(\w+)\s*\(([^)]*)\)\s+AS\s+TABLE", re.IGNORECASE)


def schema_document(reader: Reader) -> dict[str, Any]:
    """Tables with typed, documented columns, the well-known metric names, and example queries."""
    tables = []
    for table, meaning in TABLES.items():
        described = reader.query(f"SELECT * FROM {table} LIMIT 0")
        columns = [
            {
                "name": name,
                "type": kind,
                "meaning": COLUMNS.get(name, ("", ""))[0] if table == "events" else "",
                "unit": COLUMNS.get(name, ("", ""))[1] if table == "events" else "",
            }
            for name, kind in zip(described.columns, described.types, strict=True)
        ]
        tables.append({"name": table, "meaning": meaning, "columns": columns})
    layers = [
        {"name": m.group(1), "parameters": [p.strip() for p in m.group(2).split(",")], "purpose": layer.doc}
        for layer in LAYERS.values()
        if (m := _MACRO.search(layer.sql))
    ]
    parameters = [
        {"name": name, "value": value, "why": why}
        for name, value, why in reader.query("SELECT name, value, why FROM rk_params()").rows
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
        "tables": tables,
        "analysis_layers": layers,
        "analysis_parameters": parameters,
        "metric_names": metrics,
        "examples": examples,
    }
