"""Fleet benchmark: Echo under the agent's event mix (``rankecho stress --shape agent``).

1. **Store cost**: one job of ``--ranks`` ranks at ``--step-ms`` sent with ``--speed max`` into a fresh
   ``rankecho serve``: events per rank per step (stored rows / rank-steps), ingest acknowledged after
   commit (points/s), and after Echo stopped and a CHECKPOINT, bytes on disk per rank-step: the file,
   and per table (each table copied alone into a fresh file: with its key and indexes, and data only);
   side by side, the same events stored in schema v6's layout (:func:`previous_layout_bytes`).
2. **Real-time capacity**: for 1 s and 90 ms steps, jobs of growing N on the job's clock, each
   ``--probe-s`` long into a fresh Echo: the largest N whose last window was acknowledged within
   ``LAG_LIMIT_S`` of the job's clock with nothing lost, and where it stopped holding (lag, Echo's CPU,
   its writer's share of the time). The probes plant no stragglers (a stall lengthens the job's steps,
   and with them the time the store has for the same points). Each probe's requests are encoded before
   its clock starts (``--prebuild``), so the generator's own CPU (as costly as the agents': it runs their
   tracker and encoder) does not compete with Echo during the probe; only the gRPC sending does.

``python -m bench fleet [--ranks 64 --step-ms 1000 --seconds 120] [--probe-s 8] [--skip-capacity]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb

from bench.ingest import cpu_seconds, writer_busy_s
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.staging import backfill
from rankecho.launch.echo import EchoProcess
from rankecho.launch.stress import StressProcess

TOKEN = "bench-fleet-token"
LAG_LIMIT_S = 2.0
"""A window acknowledged more than this after the job's clock reached its end is falling behind."""
EMPTY_FILE_BYTES = 268 * 1024
"""A fresh DuckDB file with one empty table (subtracted from each per-table copy)."""


def generate(
    echo: EchoProcess,
    ranks: int,
    step_ms: float,
    seconds: float,
    speed: str,
    log: Path,
    prebuild: bool = False,
    stragglers: int = 2,
) -> dict[str, Any]:
    """One ``rankecho stress --shape agent`` process against ``echo``; its JSON result plus Echo's CPU."""
    extra = (
        "--shape",
        "agent",
        "--ranks",
        str(ranks),
        "--step-ms",
        str(step_ms),
        "--duration",
        str(seconds),
        "--speed",
        speed,
        "--stragglers",
        str(stragglers),
        "--quiet",
    ) + (("--prebuild",) if prebuild else ())
    assert echo.proc is not None
    cpu0, busy0 = cpu_seconds(echo.proc.pid), writer_busy_s(echo)
    run = StressProcess(echo.otlp_grpc, TOKEN, "fleet", "gpu", extra=extra, stderr_path=log).start()
    try:
        result = run.finish(timeout_s=seconds * 20 + 120)
    finally:
        run.kill()
    # Echo is idle while a prebuilding generator encodes: its CPU counts against the sending time only.
    sending = max(result["elapsed_s"], 1e-9)
    result["echo_cores"] = round((cpu_seconds(echo.proc.pid) - cpu0) / sending, 2)
    busy1 = writer_busy_s(echo)
    result["writer_busy"] = (
        round((busy1 - busy0) / sending, 2) if busy0 is not None and busy1 is not None else None
    )
    result["gen_share"] = round(result["gen_s"] / max(result["elapsed_s"], 1e-9), 2)
    return result


def table_bytes(db: Path, work: Path) -> dict[str, dict[str, int]]:
    """Each table copied alone into a fresh file (same row order, one thread): file bytes with the
    table's key and indexes, and with the data only, after CHECKPOINT, less an empty file's size."""
    out: dict[str, dict[str, int]] = {}
    with duckdb.connect(str(db), config={"threads": 1}) as con:  # read-write: ATTACH creates the copies
        tables = con.execute("SELECT table_name, sql FROM duckdb_tables() WHERE schema_name = 'main'")
        for name, ddl in tables.fetchall():
            indexes = [
                r[0]
                for r in con.execute(
                    "SELECT sql FROM duckdb_indexes() WHERE table_name = ? AND sql IS NOT NULL", [name]
                ).fetchall()
            ]
            stored = ", ".join(  # a generated column (schema v8's keys) is computed when read, not stored
                r[0] for r in con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                    "AND table_catalog = ? AND is_generated = 'NEVER' ORDER BY ordinal_position",
                    [name, db.stem],
                ).fetchall()
            )  # fmt: skip
            sizes = {}
            for variant in ("with_indexes", "data_only"):
                copy = work / f"{name}-{variant}.db"
                con.execute(f"ATTACH '{copy}' AS cp")
                if variant == "with_indexes":
                    con.execute("USE cp")
                    con.execute(ddl)
                    source = f"{db.stem}.main.{name}"
                    con.execute(f"INSERT INTO cp.main.{name} BY NAME SELECT {stored} FROM {source}")
                    for sql in indexes:
                        con.execute(sql)
                    con.execute(f"USE {db.stem}")
                else:
                    con.execute(f"CREATE TABLE cp.main.{name} AS SELECT {stored} FROM {db.stem}.main.{name}")
                con.execute("CHECKPOINT cp")
                con.execute("DETACH cp")
                sizes[variant] = max(0, copy.stat().st_size - EMPTY_FILE_BYTES)
            out[name] = sizes
    return out


def store_cost(tmp: Path, ranks: int, step_ms: float, seconds: float) -> dict[str, Any]:
    db = tmp / "cost.db"
    with EchoProcess(db, TOKEN) as echo:
        result = generate(echo, ranks, step_ms, seconds, "max", tmp / "cost.stress.log")
    with duckdb.connect(str(db)) as con:
        con.execute("CHECKPOINT")
        (stored,) = con.execute("SELECT count(*) FROM events").fetchone() or (0,)
        size = con.execute(
            "SELECT block_size, total_blocks, used_blocks, free_blocks FROM pragma_database_size()"
        )
        block, total, used, free = size.fetchone() or (0, 0, 0, 0)
    rank_steps = ranks * result["steps"]
    file_bytes = db.stat().st_size
    tables = table_bytes(db, tmp)
    before = previous_layout_bytes(db, tmp / "v6-layout.db")
    return {
        "ranks": ranks,
        "step_ms": step_ms,
        "steps": result["steps"],
        "acked": result["acked"],
        "stored": stored,
        "lost": result["acked"] - stored + result["failed"],
        "events_per_rank_step": round(stored / rank_steps, 2),
        "ingest_points_per_s": result["eps"],
        "echo_cores": result["echo_cores"],
        "gen_share": result["gen_share"],
        "writer_busy": result["writer_busy"],
        "file_bytes": file_bytes,
        "bytes_per_rank_step": round(file_bytes / rank_steps, 1),
        "bytes_per_event": round(file_bytes / max(stored, 1), 1),
        "blocks": {"size": block, "total": total, "used": used, "free": free},
        "tables_bytes_per_rank_step": {
            name: {k: round(v / rank_steps, 1) for k, v in sizes.items()} for name, sizes in tables.items()
        },
        "previous_layout_bytes_per_rank_step": round(before / rank_steps, 1),
    }


def previous_layout_bytes(db: Path, copy: Path) -> int:
    """The same events stored as schema v6 stored them, side by side: every event as a JSON row of the
    seed's shape under a VARCHAR primary key and its two indexes, plus the typed copies of the agent's
    (what an upgraded store keeps for its old events). File bytes after CHECKPOINT."""
    with duckdb.connect(str(copy), config={"threads": 1}) as con:
        migrate(con)
        con.execute(f"ATTACH '{db}' AS src (READ_ONLY)")
        con.execute("CREATE TEMP TABLE sent AS SELECT * FROM src.main.events")
        con.execute("DETACH src")
        con.execute("INSERT INTO events_generic SELECT * FROM sent")
        con.execute("CREATE UNIQUE INDEX events_pk ON events_generic (event_id)")
        con.execute("CREATE INDEX events_cluster_time ON events_generic (cluster_id, timestamp_ns)")
        con.execute("CREATE INDEX events_node_time ON events_generic (node_id, timestamp_ns)")
        backfill(con, "sent")
        con.execute("DROP TABLE sent")
        con.execute("CHECKPOINT")
    return copy.stat().st_size


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%} of the time"


def holds(r: dict[str, Any]) -> bool:
    return r["failed"] == 0 and r["rejected"] == 0 and r["lag_s"] <= LAG_LIMIT_S


def capacity(tmp: Path, step_ms: float, start: int, seconds: float, limit: int) -> dict[str, Any]:
    """Double N from ``start`` until a run does not hold, then bisect twice between the last two."""
    probes: list[dict[str, Any]] = []

    def probe(n: int) -> bool:
        with EchoProcess(tmp / f"cap-{step_ms:g}-{n}.db", TOKEN) as echo:
            r = generate(
                echo, n, step_ms, seconds, "real", tmp / "cap.stress.log", prebuild=True, stragglers=0
            )
        for f in tmp.glob(f"cap-{step_ms:g}-{n}.db*"):
            f.unlink()
        keep = (
            "ranks",
            "acked",
            "failed",
            "eps",
            "lag_s",
            "lag_max_s",
            "echo_cores",
            "writer_busy",
            "gen_s",
            "elapsed_s",
        )
        probes.append({k: r[k] for k in keep} | {"holds": holds(r)})
        print(
            f"    {step_ms:g} ms steps, {n:>6,} ranks: {'holds' if holds(r) else 'falls behind'}, "
            f"lag {r['lag_s']:.2f} s (max {r['lag_max_s']:.2f}), {r['eps']:,.0f} points/s acked, "
            f"Echo {r['echo_cores']:.2f} cores, its writer committing {_share(r['writer_busy'])} "
            f"(encoded in {r['gen_s']:.1f} s beforehand)",
            flush=True,
        )
        return holds(r)

    good, bad = 0, None
    n = start
    while n <= limit:
        if not probe(n):
            bad = n
            break
        good, n = n, n * 2
    for _ in range(2 if bad is not None else 0):
        mid = (good + bad) // 2 if good else bad // 2  # type: ignore[operator]
        if mid in (good, bad) or mid < 1:
            break
        if probe(mid):
            good = mid
        else:
            bad = mid
    return {
        "step_ms": step_ms,
        "largest_ranks_holding": good,
        "first_failing_ranks": bad,
        "probe_s": seconds,
        "probes": probes,
    }


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64, help="ranks of the store-cost job")
    parser.add_argument("--step-ms", type=float, default=1000.0, help="step of the store-cost job")
    parser.add_argument("--seconds", type=float, default=120.0, help="job time of the store-cost job")
    parser.add_argument("--probe-s", type=float, default=8.0, help="job time of each capacity probe")
    parser.add_argument("--start-1s", type=int, default=256, help="first N tried at 1 s steps")
    parser.add_argument("--start-90ms", type=int, default=32, help="first N tried at 90 ms steps")
    parser.add_argument("--limit", type=int, default=32768, help="largest N tried")
    parser.add_argument("--skip-capacity", action="store_true")
    args, _ = parser.parse_known_args(argv)
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} before the runs; "
        "generator and Echo share these cores",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp_name:
        tmp = Path(tmp_name)
        cost = store_cost(tmp, args.ranks, args.step_ms, args.seconds)
        print(
            f"  store cost, {cost['ranks']} ranks x {cost['steps']} steps of {cost['step_ms']:g} ms: "
            f"{cost['events_per_rank_step']} events per rank-step, {cost['bytes_per_rank_step']:,.0f} B per "
            f"rank-step ({cost['bytes_per_event']:.0f} B per event), "
            f"ingest {cost['ingest_points_per_s']:,.0f} points/s acked (Echo {cost['echo_cores']} cores, "
            f"writer committing {_share(cost['writer_busy'])}, generator busy {cost['gen_share']:.0%}), "
            f"lost {cost['lost']}",
            flush=True,
        )
        before = cost["previous_layout_bytes_per_rank_step"]
        ratio = cost["bytes_per_rank_step"] / max(before, 1e-9)
        print(
            f"    side by side: the same events in the v6 layout (JSON rows under a key, plus typed copies) "
            f"{before:,.0f} B per rank-step; this layout x{ratio:.2f}",
            flush=True,
        )
        for name, b in cost["tables_bytes_per_rank_step"].items():
            print(
                f"    {name}: {b['with_indexes']:,.1f} B per rank-step with key and indexes, "
                f"{b['data_only']:,.1f} data only",
                flush=True,
            )
        caps = []
        if not args.skip_capacity:
            for step_ms, start in ((1000.0, args.start_1s), (90.0, args.start_90ms)):
                cap = capacity(tmp, step_ms, start, args.probe_s, args.limit)
                caps.append(cap)
                print(
                    f"  real time at {step_ms:g} ms steps: "
                    f"holds up to {cap['largest_ranks_holding']:,} ranks, "
                    f"falls behind at {cap['first_failing_ranks']}",
                    flush=True,
                )
    return {"store_cost": cost, "capacity": caps, "lag_limit_s": LAG_LIMIT_S, "cores": os.cpu_count()}


if __name__ == "__main__":
    run(sys.argv[1:])
