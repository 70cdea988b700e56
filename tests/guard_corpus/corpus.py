"""Shared by the guard and MCP tests: the corpora (data files here) and a small deterministic store.

``load(name)`` reads ``<name>.sql``: entries separated by lines of ``====`` after a ``#`` header.
``build_store(path)`` creates a migrated, sealed DuckDB file holding ``ROWS`` synthetic events: 2 nodes
x 4 ranks, a health metric with planted stragglers on node-b rank 5, causal chains across ranks, GPU
models in attrs_json. ``fingerprint(con)`` is what "unchanged" means: catalog objects, row count and a
checksum over every column.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from rankecho.echo.guard.instance import seal
from rankecho.echo.store.migrate import migrate

HERE = Path(__file__).resolve().parent
ROWS = 4000
START_NS = 1_796_220_000_000_000_000  # 2026-12-02T14:00:00Z
STEP_NS = 250_000_000


def load(name: str) -> list[str]:
    text = (HERE / f"{name}.sql").read_text(encoding="utf-8")
    entries = text.split("\n====\n")[1:]
    entries[-1] = entries[-1].removesuffix("\n")
    return entries


def build_store(path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(path))
    migrate(con)
    con.execute(
        """
        INSERT INTO events_generic
        SELECT printf('ev-%06d', i),
               $start + i * $step,
               $start + i * $step + 1000,
               'metric',
               'demo-cluster',
               CASE WHEN i % 8 < 4 THEN 'node-a' ELSE 'node-b' END,
               'rankecho.health.score',
               i % 8,
               8,
               CASE WHEN i % 8 = 5 AND i % 40 = 5 THEN 0.2 + (i % 7) / 100 ELSE 0.8 + (i % 13) / 100 END,
               NULL,
               CASE WHEN i // 8 % 5 = 0 THEN printf('comm1:%d', i // 8) END,
               json_object(
                   'rankecho.gpu.model', CASE WHEN i % 8 < 4 THEN 'NVIDIA A100-SXM4-80GB'
                                              ELSE 'NVIDIA H100 80GB HBM3' END,
                   'rankecho.bytes', (i % 5) * 1048576,
                   'causal_chain_id', CASE WHEN i // 8 % 5 = 0 THEN printf('comm1:%d', i // 8) END)
        FROM range($rows) t(i)
        """,
        {"start": START_NS, "step": STEP_NS, "rows": ROWS},
    )
    con.execute("CHECKPOINT")
    seal(con)
    return con


def fingerprint(con: duckdb.DuckDBPyConnection) -> tuple[object, ...]:
    cur = con.cursor()
    catalog = sorted(
        cur.execute("SELECT database_name, schema_name, table_name FROM duckdb_tables()").fetchall()
    )
    views = sorted(cur.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall())
    databases = sorted(cur.execute("SELECT database_name FROM duckdb_databases()").fetchall())
    content = cur.execute(
        "SELECT count(*), sum(hash(event_id, timestamp_ns, received_ns, signal, cluster_id, node_id, "
        "metric_name, rank, nranks, value_double, value_int, causal_chain_id, attrs_json)) FROM events"
    ).fetchone()
    cur.close()
    return (catalog, views, databases, content)
