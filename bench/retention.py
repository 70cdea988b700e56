"""Retention benchmark: does the store stop growing, what does a pass cost, how long does it hold the writer.

Feeds a fresh store (Echo's migrations, DuckDB file) minute by simulated minute with an agent-shaped mix
(``--ranks`` ranks at 1 s steps; per rank-step 3 collectives and 5 host intervals, each an ``events`` row
with a random 16-hex event id and ~300 B of attributes plus its typed copy), and every ``--every-min``
simulated minutes runs one pass of :class:`rankecho.echo.store.retention.Retention` step by step on the
same connection, as the writer thread does between commits. Two runs, side by side:

- ``age``: ``--retention-min`` of raw data kept; the file size, bytes in use and free blocks after each
  pass show whether freed blocks are reused (the file should settle once retention is reached);
- ``size``: no age limit, ``--max-db-size`` set to ``--size-share`` of the age run's settled used bytes.

It also reports the longest step (the most a commit waits behind retention), the CHECKPOINT times, and
the cost of deleting a row from ``events`` (primary key on a VARCHAR event id) against ``collectives``
(no index). Simulated time, real DuckDB: no Echo process, no network.

Usage: ``python -m bench retention [--ranks 64] [--minutes 40] [--retention-min 10] [--every-min 2]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.retention import MINUTE_NS, Retention, RetentionPolicy

START_NS = 1_796_000_000_000_000_000
MAX_PASSES_IN_A_ROW = 8
FOREVER_S = 1e9
"""The bench requests its passes (every --every-min simulated minutes); none is due by wall time."""
COLLECTIVES_PER_STEP = 3
INTERVALS_PER_STEP = 5
EVENTS_SQL = """
INSERT INTO events_generic (event_id, timestamp_ns, received_ns, signal, cluster_id, node_id, metric_name,
                    rank,                     nranks, value_double, causal_chain_id, attrs_json)
SELECT md5(($seed::BIGINT * 100_000_000 + i)::VARCHAR)[:16],
       $t0 + (i // $ranks) * $step_ns + (i % $ranks) * 1000,
       $t0, 'metric', 'c1', 'node-' || (i % $ranks) // 8,
       CASE WHEN i % 8 < 3 THEN 'rankecho.nccl.collective' ELSE 'rankecho.cuda.malloc' END,
       i % $ranks, $ranks, (i % 977) / 10.0, 'c' || (i % 3) || ':' || (i // $ranks),
       '{"process.pid": ' || (1000 + i % $ranks) || ', "thread.id": ' || (2000 + i % $ranks)
         || ', "service.instance.id": "agent-' || (i % $ranks) // 8 || '-1796000000", '
         || '"rankecho.process.start_ns": 1796000000000000000, "k8s.pod.name": "trainer-'
         || (i % $ranks) // 8 || '-x7k2p", "rankecho.event_id": "' || md5(i::VARCHAR)[:16] || '", '
         || '"rankecho.nccl.seq": ' || (i // $ranks) || ', "rankecho.nccl.bytes": 1048576}'
FROM range($n) t(i)"""
COLLECTIVES_SQL = """
INSERT INTO collectives (cluster_id, node_id, rank, nranks, pid, op, comm_id, seq, bytes,
                         enter_ns, return_ns, complete_ns, causal_chain_id)
SELECT 'c1', 'node-' || (i % $ranks) // 8,
       i % $ranks, $ranks,
       1000 + i % $ranks, 'ncclAllReduce', 'comm' || (i // $ranks) % 3, i // $ranks, 1048576,
       $t0 + (i // $ranks) * $step_ns + (i % $ranks) * 1000, $t0 + (i // $ranks) * $step_ns + 20000,
       $t0 + (i // $ranks) * $step_ns + 900000 + (i * 7919) % 500000, 'c:' || (i // $ranks)
FROM range($n) t(i)"""
ACTIVITY_SQL = """
INSERT INTO host_activity (cluster_id, node_id, rank, pid, tid, kind, start_ns, end_ns)
SELECT 'c1', 'node-' || (i % $ranks) // 8, i % $ranks,
       1000 + i % $ranks, 2000 + i % $ranks, 'malloc', $t0 + (i // $ranks) * $step_ns + 5000,
       $t0 + (i // $ranks) * $step_ns + 9000
FROM range($n) t(i)"""


def ingest_minute(con: duckdb.DuckDBPyConnection, minute: int, ranks: int) -> int:
    """One simulated minute of the job; returns the events rows added."""
    t0 = START_NS + minute * MINUTE_NS
    steps = 60
    per_step = {"events": COLLECTIVES_PER_STEP + INTERVALS_PER_STEP, "collectives": COLLECTIVES_PER_STEP,
                "activity": INTERVALS_PER_STEP}  # fmt: skip
    for key, sql in (("events", EVENTS_SQL), ("collectives", COLLECTIVES_SQL), ("activity", ACTIVITY_SQL)):
        n = steps * ranks * per_step[key]
        step_ns = MINUTE_NS // (steps * per_step[key])
        con.execute(sql, {"seed": minute, "t0": t0, "ranks": ranks, "step_ns": step_ns, "n": n})
    return steps * ranks * per_step["events"]


def space(con: duckdb.DuckDBPyConnection, path: Path) -> dict[str, float]:
    """The file, the blocks in use (what --max-db-size is compared with) and the free blocks inside it."""
    row = con.execute("SELECT used_blocks, free_blocks, block_size FROM pragma_database_size()").fetchone()
    assert row is not None
    used_mib = row[0] * row[2] / 2**20
    return {"file_mib": path.stat().st_size / 2**20, "used_mib": used_mib, "free_blocks": row[1]}


def simulate(path: Path, args: argparse.Namespace, policy: RetentionPolicy) -> dict[str, Any]:
    con = duckdb.connect(str(path))
    migrate(con)
    con.execute("SET checkpoint_threshold = '256MB'")  # as Echo does
    clock = [START_NS]
    checkpoints: list[float] = []

    def checkpoint() -> bool:
        started = time.perf_counter()
        con.execute("CHECKPOINT")
        checkpoints.append(time.perf_counter() - started)
        return True

    retention = Retention(con, policy, path, checkpoint, lambda: clock[0])
    passes, steps = [], []
    rows = 0
    for minute in range(args.minutes):
        rows += ingest_minute(con, minute, args.ranks)
        con.execute("CHECKPOINT")  # Echo's writer folds the log into the file when idle (every 60 s)
        clock[0] = START_NS + (minute + 1) * MINUTE_NS
        if (minute + 1) % args.every_min:
            continue
        retention.request()
        started = time.perf_counter()
        deleted = chunks = runs = 0
        while retention.due() and runs < MAX_PASSES_IN_A_ROW:  # as the writer: again at once while over size
            runs += 1
            more = True
            while more:
                step_started = time.perf_counter()
                more = retention.step()
                steps.append(time.perf_counter() - step_started)
            assert retention.last is not None
            deleted, chunks = deleted + retention.last.rows_deleted, chunks + retention.last.chunks
        passes.append({"minute": minute + 1, "passes": runs, "rows_deleted": deleted, "chunks": chunks,
                       "seconds": time.perf_counter() - started, **space(con, path)})  # fmt: skip
    con.close()
    checkpoint_ms = statistics.median(checkpoints) * 1000 if checkpoints else None
    return {"events_ingested": rows, "passes": passes, "max_step_ms": max(steps) * 1000,
            "p50_step_ms": statistics.median(steps) * 1000,
            "checkpoint_ms_median": checkpoint_ms,
            "checkpoint_ms_max": max(checkpoints) * 1000 if checkpoints else None}  # fmt: skip


def delete_cost(path: Path, ranks: int) -> dict[str, float]:
    """us per deleted row: events (VARCHAR primary key + two indexes) vs collectives (no index)."""
    con = duckdb.connect(str(path))
    migrate(con)
    for minute in range(4):
        ingest_minute(con, minute, ranks)
    con.execute("CHECKPOINT")
    out = {}
    for table, column in (("events", "timestamp_ns"), ("collectives", "enter_ns")):
        cutoff = START_NS + 2 * MINUTE_NS
        started = time.perf_counter()
        deleted = con.execute(f"DELETE FROM {table} WHERE {column} < ?", [cutoff]).fetchone()
        assert deleted is not None
        out[f"{table}_us_per_row"] = (time.perf_counter() - started) / max(1, int(deleted[0])) * 1e6
    con.close()
    return out


def show(name: str, result: dict[str, Any]) -> None:
    checkpoint_ms = result["checkpoint_ms_median"] or 0.0
    print(f"{name}: {result['events_ingested']} events ingested; longest step {result['max_step_ms']:.0f} ms "
          f"(median {result['p50_step_ms']:.0f} ms), checkpoint median {checkpoint_ms:.0f} ms, "
          f"longest {result['checkpoint_ms_max'] or 0:.0f} ms")
    print(f"  {'minute':>6}{'passes':>7}{'deleted':>10}{'chunks':>7}{'pass s':>8}{'file MiB':>10}"
          f"{'used MiB':>10}{'free':>6}")  # fmt: skip
    for p in result["passes"]:
        print(f"  {p['minute']:>6}{p['passes']:>7}{p['rows_deleted']:>10}{p['chunks']:>7}{p['seconds']:>8.2f}"
              f"{p['file_mib']:>10.1f}{p['used_mib']:>10.1f}{p['free_blocks']:>6}")  # fmt: skip


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench retention")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--minutes", type=int, default=40)
    parser.add_argument("--retention-min", type=int, default=10)
    parser.add_argument("--every-min", type=int, default=2)
    parser.add_argument("--size-share", type=float, default=0.6)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"ranks": args.ranks, "minutes": args.minutes}
    with tempfile.TemporaryDirectory() as tmp:
        results["delete_cost"] = cost = delete_cost(Path(tmp) / "cost.db", args.ranks)
        print(f"DELETE cost: events {cost['events_us_per_row']:.3f} us/row, "
              f"collectives {cost['collectives_us_per_row']:.3f} us/row")  # fmt: skip
        by_age = RetentionPolicy(retention_s=args.retention_min * 60.0, every_s=FOREVER_S)
        age = simulate(Path(tmp) / "age.db", args, by_age)
        show(f"age (--retention {args.retention_min}m)", age)
        settled = max(p["used_mib"] for p in age["passes"][len(age["passes"]) // 2 :])
        limit = int(settled * args.size_share * 2**20)
        size = simulate(Path(tmp) / "size.db", args, RetentionPolicy(max_db_bytes=limit, every_s=FOREVER_S))
        show(f"size (--max-db-size {limit / 2**20:.0f}MiB)", size)
        results.update(age=age, size=size, max_db_mib=limit / 2**20)
    return results
