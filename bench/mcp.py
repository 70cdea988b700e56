"""MCP investigation latency on a 1M-event store, and what the SQL guard costs per query.

Builds a sealed store of ``--rows`` synthetic events (16 nodes x 8 ranks, health scores with one
straggling rank, causal chains, GPU models in attrs_json), then measures, each query ``--repeat``
times, side by side in one run:

- ``run_analysis`` on text it has not seen (guard at the boundary, the store's re-check from the guard's
  cache, read-only transaction, caps, JSON) against the same SQL executed raw on a cursor: p50/p95 and
  the ratio of medians;
- the tools that run named queries (summary, event_history, find_outlier_nodes, get_cost): p50/p95;
- the guard alone per query, uncached (lexical + DuckDB parse + AST walk): median, and its share of a
  call (the store's second check of the same text is a cache hit).

Usage: ``python -m bench mcp [--rows 1000000] [--repeat 15]``
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from rankecho.echo.guard import project_policy
from rankecho.echo.guard.check import check_sql_uncached, clear_guard_cache
from rankecho.echo.guard.instance import seal
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation, Limits
from rankecho.echo.queries import QUERIES, seed_examples
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.reader import ANALYSIS_PRELUDE, Reader

START_NS = 1_796_221_800_000_000_000
ANALYSES = {
    **{q.name: q.sql for q in seed_examples()},
    **{q.name.removeprefix("example_"): q.sql for q in QUERIES.values() if q.name.startswith("example_")},
    # Not an example agents get: a window function, the guard's costliest shape.
    "per_rank_lag": "WITH w AS (SELECT rank, value_double, lag(value_double) OVER (PARTITION BY rank "
    "ORDER BY timestamp_ns) AS prev FROM events WHERE node_id = 'node-05') "
    "SELECT rank, avg(value_double - prev) AS drift FROM w GROUP BY rank ORDER BY rank",
}
"""Text run_analysis has not seen: the example queries agents get (rankecho://schema), as named in
echo/queries (fanin/ and examples.sql), plus one window-function query."""


def build(path: Path, rows: int) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(path))
    migrate(con)
    con.execute(
        """
        INSERT INTO events_generic
        SELECT printf('ev-%09d', i), $start + i * 1000000, $start + i * 1000000, 'metric', 'bench-cluster',
               printf('node-%02d', i // 8 % 16), 'rankecho.health.score', i % 128, 128,
               CASE WHEN i % 128 = 43 AND i % 1024 = 43 THEN 0.2 ELSE 0.6 + (i % 37) / 100 END, NULL,
               CASE WHEN i // 128 % 10 = 0 THEN printf('comm:%d', i // 128) END,
               json_object('rankecho.gpu.model', 'NVIDIA H100 80GB HBM3', 'rankecho.bytes', i % 4096,
                           'causal_chain_id',
                           CASE WHEN i // 128 % 10 = 0 THEN printf('comm:%d', i // 128) END)
        FROM range($rows) t(i)
        """,
        {"start": START_NS, "rows": rows},
    )
    con.execute("CHECKPOINT")
    seal(con, "4GB")
    return con


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    fn()  # warm
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def p50_p95(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": statistics.median(ordered),
        "p95_ms": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
    }


def raw(con: duckdb.DuckDBPyConnection, sql: str) -> Callable[[], Any]:
    """``sql`` on a plain cursor that has the analysis macros, as the store's reused read cursors do
    (the straggler examples call them)."""
    cur = con.cursor()
    for statement in ANALYSIS_PRELUDE:
        cur.execute(statement)

    def go() -> Any:
        return cur.execute(sql).fetchmany(1001)

    return go


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench mcp")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        con = build(Path(tmp) / "bench.db", args.rows)
        print(f"store: {args.rows} events built in {time.perf_counter() - started:.1f} s")
        inv = Investigation(Reader(con), load_rates(), Limits(timeout_s=60))
        results: dict[str, Any] = {"rows": args.rows, "repeat": args.repeat, "run_analysis": {}, "tools": {}}
        print(
            f"{'run_analysis query':<28}{'p50 ms':>9}{'p95 ms':>9}{'raw p50':>9}{'ratio':>7}"
            f"{'guard ms':>10}{'guard %':>8}"
        )
        for name, sql in ANALYSES.items():
            def fresh(sql: str = sql) -> Any:  # an agent's new query: the boundary check is not cached
                clear_guard_cache()
                return inv.run_analysis(sql)

            tool = p50_p95(timed(fresh, args.repeat))
            bare = p50_p95(timed(raw(con, sql), args.repeat))
            cold = functools.partial(check_sql_uncached, sql, project_policy())
            guard = statistics.median(timed(cold, max(50, args.repeat)))
            row = {
                **tool,
                "raw_p50_ms": bare["p50_ms"],
                "ratio": tool["p50_ms"] / bare["p50_ms"],
                "guard_ms": guard,
            }
            row["guard_share"] = guard / tool["p50_ms"]  # first check; the store's re-check hits the cache
            results["run_analysis"][name] = row
            print(
                f"{name:<28}{row['p50_ms']:>9.2f}{row['p95_ms']:>9.2f}{row['raw_p50_ms']:>9.2f}"
                f"{row['ratio']:>7.2f}{guard:>10.3f}{100 * row['guard_share']:>7.1f}%"
            )
        window = "14:30-14:45"
        tools: dict[str, Callable[[], Any]] = {
            "summary": lambda: inv.summary(),
            "event_history(node,rank)": lambda: inv.event_history(node_id="node-05", rank=43, window=window),
            "find_outlier_nodes(thr)": lambda: inv.find_outlier_nodes("rankecho.health.score", window, 0.4),
            "find_outlier_nodes(mad)": lambda: inv.find_outlier_nodes(
                "rankecho.health.score", window, method="mad"
            ),
            "get_cost": lambda: inv.get_cost(),
        }
        print(f"\n{'tool':<26}{'p50 ms':>9}{'p95 ms':>9}")
        for name, fn in tools.items():
            stats = p50_p95(timed(fn, max(5, args.repeat // 3)))
            results["tools"][name] = stats
            print(f"{name:<26}{stats['p50_ms']:>9.2f}{stats['p95_ms']:>9.2f}")
        guards = [r["guard_ms"] for r in results["run_analysis"].values()]
        results["guard_median_ms"] = statistics.median(guards)
        print(f"\nguard (uncached) median over the queries: {results['guard_median_ms']:.3f} ms per check")
        con.close()
    return results
