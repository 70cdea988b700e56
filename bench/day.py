"""Issue 20's day and memory targets: a compressed day of a big job with retention; Echo's RSS by store size.

1. **A real sample**: ``rankecho stress --shape agent`` (``--ranks`` at 1 s steps for ``--sample-s`` of job
   time, ``--speed max``, planted stragglers) into a real ``rankecho serve`` on a fresh store, stopped with
   SIGTERM (it commits): the agent's event mix as Echo really stages it.
2. **The day, compressed**: a fresh migrated store gets the sample again and again, each copy shifted
   by its index times the sample's length (:class:`Replay`: every time column, ``seq`` and the sequence
   number in causal chain ids, stored event ids made unique), table by table in the order Echo wrote the
   rows, until ``--hours`` of job time are written. Every ``--every-min`` simulated minutes a retention
   pass runs the way Echo's writer runs it (:class:`Retention`, one step at a time on the same
   connection, Echo's clock = the simulated one), then CHECKPOINT; recorded: file and used bytes, free
   blocks, rows per table, rollup rows, the longest step. Target: <= 20 GB, flat once retention is reached.
3. **RSS by store size**: stores of ``--rss-events`` events built the same way (no retention), each
   opened by a real ``rankecho serve`` with ``--duckdb-memory-limit 4GB``, then with ``--memory-limit 4GB``
   (Echo's whole budget); the MCP tools called over HTTP
   (find_stragglers, explain_straggler, summary, get_cost) and a few thousand points ingested while
   Echo's RSS (``/proc``, its children included) is sampled (bench/_rss.py). Target: RSS under the limit.

``python -m bench day [--ranks 1024 --sample-s 60 --hours 24 --retention-h 12] [--rss-events 10e6,100e6]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from bench._rss import ARMS, MEMORY_LIMIT, rss_of_store, untimed_find_stragglers
from bench.fleet import TOKEN, generate
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.retention import Retention, RetentionPolicy
from rankecho.launch.echo import EchoProcess

ON_REQUEST = True
"""Not in ``make bench``'s default set: with its defaults it takes 35-60 min and up to ~10 GB of disk here;
``python -m bench day`` runs it."""
NS = 1_000_000_000
TABLES = ("collectives", "host_activity", "events_generic")
"""The raw tables one replayed copy appends to (``attr_sets`` and ``stacks`` are written once: ids repeat)."""
TIME_COLUMNS = {
    "collectives": ("enter_ns", "return_ns", "complete_ns", "received_ns"),
    "host_activity": ("start_ns", "end_ns", "received_ns"),
    "events_generic": ("timestamp_ns", "received_ns"),
}
STORED_IDS = {"collectives": "event_id_sent", "host_activity": "event_id_sent", "events_generic": "event_id"}
ONCE_ONLY = ("rankecho.nccl.comm_init", "rankecho.nccl.comm_destroy")
"""Points a job sends once per communicator: only the first copy replays them."""
TARGET_DAY_BYTES = 20 * 1000**3
ECHO_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "checkpoint_threshold": "256MB",
    "memory_limit": MEMORY_LIMIT,
}
"""As Echo opens its store (echo/app.py ``open_store``)."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def take_sample(tmp: Path, ranks: int, seconds: float, stragglers: int) -> tuple[Path, dict[str, Any]]:
    """The agent's mix as a real Echo stores it (SIGTERM on leaving the block: Echo drains and commits)."""
    db = tmp / "sample.db"
    started = time.monotonic()
    with EchoProcess(db, TOKEN) as echo:
        result = generate(echo, ranks, 1000.0, seconds, "max", tmp / "sample.log", stragglers=stragglers)
    keep = ("ranks", "steps", "acked", "failed", "eps", "events_per_rank_step", "planted", "echo_cores")
    info = {k: result[k] for k in keep} | {"seconds": round(time.monotonic() - started, 1)}
    log(f"sample: {ranks} ranks x {result['steps']} steps, {result['acked']:,} points acked in "
        f"{info['seconds']} s ({result['eps']:,.0f}/s), planted stragglers {result['planted']}")  # fmt: skip
    return db, info


@dataclass
class Replay:
    """Appends shifted copies of a sample store's raw rows to ``con`` (the sample ATTACHed read-only).

    Copy ``k`` moves every time by ``k * length_ns`` and every sequence number (``seq``, the number after
    the last ``:`` of a causal chain id) by ``k * seq_span``, and hashes the ids stored as sent with
    ``k``, so no copy repeats another's values (a repeat would flatter compression)."""

    con: duckdb.DuckDBPyConnection
    start_ns: int
    length_ns: int
    seq_span: int
    rows_per_copy: int
    copies: int = 0

    @classmethod
    def open(cls, con: duckdb.DuckDBPyConnection, sample: Path) -> Replay:
        con.execute(f"ATTACH '{sample}' AS src (READ_ONLY)")
        start, end = con.execute(
            "SELECT min(t), max(t) FROM (SELECT enter_ns AS t FROM src.collectives "
            "UNION ALL SELECT start_ns FROM src.host_activity)"
        ).fetchone() or (None, None)
        if start is None:
            raise RuntimeError(f"{sample} holds no collectives: the sample run stored nothing")
        length = -(-(int(end) - int(start) + 1) // NS) * NS  # whole seconds (whole steps)
        chains = " UNION ALL ".join(f"SELECT causal_chain_id AS c FROM src.{t}" for t in TABLES)
        (span,) = con.execute(
            f"SELECT greatest((SELECT max(seq) FROM src.collectives), "
            f"max(TRY_CAST(regexp_extract(c, ':([0-9]+)$', 1) AS BIGINT))) + 1 FROM ({chains})"
        ).fetchone() or (1,)
        rows = sum(int((con.execute(f"SELECT count(*) FROM src.{t}").fetchone() or (0,))[0]) for t in TABLES)
        con.execute("INSERT INTO attr_sets SELECT * FROM src.attr_sets")
        con.execute("INSERT INTO stacks SELECT * FROM src.stacks")
        return cls(con, int(start), length, int(span or 1), rows)

    @property
    def now_ns(self) -> int:
        """The simulated clock: the end of the job time written so far."""
        return self.start_ns + self.copies * self.length_ns

    def _select(self, table: str, columns: list[str]) -> str:
        shifted = {c: f"{c} + r.k * {self.length_ns}" for c in TIME_COLUMNS[table]}
        shifted["causal_chain_id"] = (
            "CASE WHEN r.k = 0 OR NOT regexp_matches(causal_chain_id, ':[0-9]+$') THEN causal_chain_id "
            "ELSE regexp_replace(causal_chain_id, ':[0-9]+$', '') || ':' || "
            f"(CAST(regexp_extract(causal_chain_id, ':([0-9]+)$', 1) AS BIGINT) + r.k * {self.seq_span}) END"
        )
        sid = STORED_IDS[table]
        shifted[sid] = f"CASE WHEN r.k = 0 THEN {sid} ELSE left(md5({sid} || ':' || r.k), length({sid})) END"
        if table == "collectives":
            shifted["seq"] = f"seq + r.k * {self.seq_span}"
        if table == "host_activity":
            shifted["start_bucket"] = f"start_bucket + r.k * {self.length_ns // NS}"
        return ", ".join(f"{shifted.get(c, c)} AS {c}" for c in columns)

    def append(self, copies: int) -> int:
        """Copies ``self.copies .. + copies - 1``, each table in the sample's row order; rows written."""
        k0, k1 = self.copies, self.copies + copies
        written = 0
        for table in TABLES:
            found = self.con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_catalog = 'src' "
                "AND table_name = ? AND is_generated = 'NEVER' ORDER BY ordinal_position", [table])
            columns = [r[0] for r in found.fetchall()]
            where = f"WHERE r.k = 0 OR metric_name NOT IN {ONCE_ONLY}" if table == "events_generic" else ""
            order = "" if copies == 1 else "ORDER BY r.k, s.rowid"  # one copy: the scan keeps the order
            (n,) = self.con.execute(
                f"INSERT INTO {table} BY NAME SELECT {self._select(table, columns)} "
                f"FROM src.{table} s, range({k0}, {k1}) r(k) {where} {order}"
            ).fetchone() or (0,)
            written += int(n)
        self.copies = k1
        return written


def new_store(path: Path, sample: Path) -> tuple[duckdb.DuckDBPyConnection, Replay]:
    for f in path.parent.glob(path.name + "*"):
        f.unlink()
    con = duckdb.connect(str(path), config=ECHO_CONFIG)
    migrate(con)
    return con, Replay.open(con, sample)


def snapshot(con: duckdb.DuckDBPyConnection, path: Path) -> dict[str, int]:
    """File and used bytes, free blocks and rows per table, after a CHECKPOINT."""
    block, total, used, free = con.execute(
        "SELECT block_size, total_blocks, used_blocks, free_blocks FROM pragma_database_size() "
        "WHERE database_name = current_database()").fetchone() or (0, 0, 0, 0)  # fmt: skip
    out = {"file_bytes": path.stat().st_size, "used_bytes": int(used) * int(block), "free_blocks": int(free),
           "total_blocks": int(total)}  # fmt: skip
    for t in (*TABLES, "collective_rollup", "stacks"):
        out[f"rows_{t}"] = int((con.execute(f"SELECT count(*) FROM {t}").fetchone() or (0,))[0])
    return out


def retention_pass(retention: Retention, checkpoints: list[float]) -> dict[str, Any]:
    """One whole pass, step by step as the writer runs it between commits, each step timed; the step that
    ends with the pass's CHECKPOINT (its seconds appended to ``checkpoints``) apart from the others."""
    future = retention.request()
    longest, steps, seen = 0.0, 0, len(checkpoints)
    while not future.done():
        t0 = time.perf_counter()
        retention.step()
        if len(checkpoints) == seen:  # a step that did not checkpoint
            longest = max(longest, time.perf_counter() - t0)
        steps += 1
    report = future.result()
    ckpt = sum(checkpoints[seen:])
    return {"steps": steps, "longest_step_ms": round(longest * 1000, 1),
            "checkpoint_ms": round(ckpt * 1000, 1), "pass_s": round(report.seconds, 2),
            "rows_deleted": report.rows_deleted,
            "rollup_rows_written": report.rollup_rows_written}  # fmt: skip


def timed_checkpoint(con: duckdb.DuckDBPyConnection, seconds: list[float]) -> bool:
    t0 = time.perf_counter()
    con.execute("CHECKPOINT")
    seconds.append(time.perf_counter() - t0)
    return True


def day(
    path: Path, sample: Path, hours: float, retention_h: float, every_min: float, batch: int,
    progress: Callable[[str], None] = log, points_file: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Replay ``hours`` of job time into a fresh store with a retention pass every ``every_min``; each
    point is also appended to ``points_file`` as a JSON line (a run stopped early keeps its curve)."""
    con, replay = new_store(path, sample)
    clock = [replay.now_ns]
    policy = RetentionPolicy(retention_s=retention_h * 3600)
    checkpoints: list[float] = []
    retention = Retention(con, policy, path, lambda: timed_checkpoint(con, checkpoints),
                          clock_ns=lambda: clock[0])  # fmt: skip
    retention.record_settings()
    total = int(hours * 3600 * NS // replay.length_ns)
    per_pass = max(1, int(every_min * 60 * NS // replay.length_ns))
    points: list[dict[str, Any]] = []
    started = time.monotonic()
    while replay.copies < total:
        t0, rows = time.monotonic(), 0
        goal = min(total, replay.copies + per_pass)
        while replay.copies < goal:
            rows += replay.append(min(batch, goal - replay.copies))
        insert_s = time.monotonic() - t0
        clock[0] = replay.now_ns
        con.execute("CHECKPOINT")  # Echo's idle writer checkpoints every minute: the pass finds no backlog
        passed = retention_pass(retention, checkpoints)
        con.execute("CHECKPOINT")
        hour = (replay.now_ns - replay.start_ns) / 3600 / NS
        point = {"hour": round(hour, 2), "rows_written": rows, "insert_rows_per_s": round(rows / insert_s),
                 **passed, **snapshot(con, path), "wall_s": round(time.monotonic() - started)}  # fmt: skip
        points.append(point)
        if points_file is not None:
            with points_file.open("a") as f:
                f.write(json.dumps(point | {"retention_h": retention_h}) + "\n")
        progress(f"day h{hour:5.2f}: file {point['file_bytes'] / 2**30:6.2f} GiB, used "
                 f"{point['used_bytes'] / 2**30:6.2f} GiB, free blocks {point['free_blocks']:,}, collectives "
                 f"{point['rows_collectives']:,}, rollups {point['rows_collective_rollup']:,}, "
                 f"{point['insert_rows_per_s']:,} rows/s in, retention {passed['rows_deleted']:,} rows in "
                 f"{passed['steps']} steps (longest {passed['longest_step_ms']} ms, checkpoint "
                 f"{passed['checkpoint_ms']} ms)")  # fmt: skip
    con.close()
    return summarise_day(points, replay, retention_h)


def summarise_day(points: list[dict[str, Any]], replay: Replay, retention_h: float) -> dict[str, Any]:
    last = points[-1] if points else {}
    steady = [p for p in points if p["hour"] >= retention_h + 1]  # a whole pass after the cutoff first bit
    tail = [p for p in steady if p["hour"] >= last.get("hour", 0) - 6]
    ratio = (max(p["file_bytes"] for p in tail) / min(p["file_bytes"] for p in tail)) if tail else None
    used = (max(p["used_bytes"] for p in tail) / min(p["used_bytes"] for p in tail)) if tail else None
    return {
        "hours": last.get("hour"), "retention_h": retention_h, "copies": replay.copies,
        "sample_length_s": replay.length_ns / NS, "rows_per_copy": replay.rows_per_copy,
        "final_file_bytes": last.get("file_bytes"), "final_used_bytes": last.get("used_bytes"),
        "max_file_bytes": max((p["file_bytes"] for p in points), default=None),
        "target_bytes": TARGET_DAY_BYTES,
        "meets_target": bool(points) and max(p["file_bytes"] for p in points) <= TARGET_DAY_BYTES,
        "last_6h_file_max_over_min": round(ratio, 3) if ratio else None,
        "last_6h_used_max_over_min": round(used, 3) if used else None,
        "longest_retention_step_ms": max((p["longest_step_ms"] for p in points), default=None),
        "longest_pass_checkpoint_ms": max((p["checkpoint_ms"] for p in points), default=None),
        "points": points,
    }  # fmt: skip


def build_store(path: Path, sample: Path, events: int, batch: int) -> dict[str, Any]:
    """A store of about ``events`` raw rows (whole copies), no retention, checkpointed; closed after."""
    t0 = time.monotonic()
    con, replay = new_store(path, sample)
    copies = max(1, -(-events // replay.rows_per_copy))
    while replay.copies < copies:
        replay.append(min(batch, copies - replay.copies))
        if replay.copies % 60 == 0:
            log(f"  build {path.name}: {replay.copies}/{copies} copies")
    con.execute("CHECKPOINT")
    out = snapshot(con, path) | {"events": copies * replay.rows_per_copy, "copies": copies,
                                 "job_hours": round(copies * replay.length_ns / NS / 3600, 2),
                                 "build_s": round(time.monotonic() - t0)}  # fmt: skip
    con.close()
    return out


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench day", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--sample-s", type=float, default=60.0, help="job seconds of the real sample")
    parser.add_argument("--stragglers", type=int, default=2)
    parser.add_argument("--sample", type=Path, help="reuse this sample store (a copy of one this bench took)")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated job hours (0: skip the day)")
    parser.add_argument("--retention-h", default="12", help="--retention of each day run, comma separated")
    parser.add_argument("--every-min", type=float, default=60.0, help="simulated minutes between passes")
    parser.add_argument("--batch", type=int, default=1, help="copies per INSERT (1: no sort)")
    parser.add_argument("--rss-events", default="10e6,100e6", help="store sizes for the RSS curve ('': skip)")
    parser.add_argument("--tool-timeout-s", type=float, default=600.0)
    parser.add_argument("--points", type=Path, help="append each day point here as a JSON line")
    work = os.environ.get("BENCH_DAY_DIR", tempfile.gettempdir())
    parser.add_argument("--work", type=Path, default=Path(work),
                        help="where the stores go (up to ~10 GB with the defaults; removed afterwards); "
                        "default $BENCH_DAY_DIR, else the system's temp directory")  # fmt: skip
    args, _ = parser.parse_known_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    tmp = args.work / f"bench-day-{os.getpid()}"
    tmp.mkdir()
    log(f"machine: {os.cpu_count()} cores, load {os.getloadavg()}, free disk at {args.work}: "
        f"{shutil.disk_usage(args.work).free / 1e9:.0f} GB")  # fmt: skip
    out: dict[str, Any] = {"load_before": [round(x, 2) for x in os.getloadavg()]}
    try:
        if args.sample:
            sample, out["sample"] = shutil.copy(args.sample, tmp / "sample.db"), {"reused": str(args.sample)}
        else:
            sample, out["sample"] = take_sample(tmp, args.ranks, args.sample_s, args.stragglers)
        out["days"] = []
        for hours_kept in ([] if args.hours <= 0 else [float(h) for h in args.retention_h.split(",")]):
            log(f"day: {args.hours:g} h of job time, retention {hours_kept:g} h")
            kept = day(tmp / "day.db", sample, args.hours, hours_kept, args.every_min, args.batch,
                       points_file=args.points)  # fmt: skip
            out["days"].append(kept)
            for f in tmp.glob("day.db*"):
                f.unlink()
            d = out["days"][-1]
            log(f"day done: file {d['final_file_bytes'] / 1e9:.2f} GB (max {d['max_file_bytes'] / 1e9:.2f}, "
                f"target 20), last 6 h max/min {d['last_6h_file_max_over_min']}")  # fmt: skip
        out["rss"] = []
        for events in (int(float(e)) for e in args.rss_events.split(",") if e):
            db = tmp / f"rss-{events}.db"
            built = build_store(db, sample, events, args.batch)
            log(f"rss store: {built['events']:,} events, {built['file_bytes'] / 1e9:.2f} GB, "
                f"{built['build_s']} s")
            for flag in ARMS:  # the same store, each limit flag in turn (the ingest adds ~4k points)
                out["rss"].append(r := built | rss_of_store(db, tmp, args.tool_timeout_s, flag))
                log(f"rss {events:,}, {flag} {MEMORY_LIMIT}: start {r['rss_start_mib']} MiB, peak "
                    f"{r['rss_peak_mib']} MiB (tools {r['rss_peak_tools_mib']}, ingest "
                    f"{r['rss_peak_ingest_mib']}), after {r['rss_after_mib']} MiB "
                    f"(limit {r['limit_mib']} MiB)")
            if not r["tools"]["find_stragglers"]["ok"]:
                r["find_stragglers_untimed"] = untimed_find_stragglers(db, args.tool_timeout_s)
            for f in tmp.glob(f"{db.name}*"):
                f.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(report(out), flush=True)
    return out


def report(out: dict[str, Any]) -> str:
    """The result as markdown tables (stdout): the day's curve per pass, then RSS by store size."""
    gb = lambda b: f"{b / 1e9:.2f}"  # noqa: E731
    lines = []
    for d in out.get("days", []):
        lines += [
            f"Day, retention {d['retention_h']:g} h: {d['hours']} h of job time ({d['copies']} copies of "
            f"{d['sample_length_s']:g} s, {d['rows_per_copy']:,} rows each); file "
            f"{gb(d['final_file_bytes'])} GB at the end, {gb(d['max_file_bytes'])} GB at most (<= 20 GB: "
            f"{d['meets_target']}); last 6 h max/min file {d['last_6h_file_max_over_min']}, used "
            f"{d['last_6h_used_max_over_min']}",
            "",
            "| hour | file GB | used GB | free blocks | collectives | host_activity | events_generic "
            "| rollups | rows/s in | deleted | steps | longest step ms | checkpoint ms |",
            "|" + "---|" * 13,
        ]
        for p in d["points"]:
            cells = [p["hour"], gb(p["file_bytes"]), gb(p["used_bytes"]), p["free_blocks"],
                     p["rows_collectives"], p["rows_host_activity"], p["rows_events_generic"],
                     p["rows_collective_rollup"], p["insert_rows_per_s"], p["rows_deleted"], p["steps"],
                     p["longest_step_ms"], p["checkpoint_ms"]]  # fmt: skip
            lines.append("| " + " | ".join(f"{c:,}" if isinstance(c, int) else str(c) for c in cells) + " |")
        lines.append("")
    if out.get("rss"):
        tools = ("find_stragglers", "find_stragglers_last_5m", "explain_straggler", "summary", "get_cost")
        lines += ["| events | file GB | limit | RSS start / peak / after MiB | limit MiB | " + " | ".join(
            f"{t} ms" for t in tools) + " | points ingested |", "|" + "---|" * 11]  # fmt: skip
        for r in out["rss"]:
            ms = [f"{c.get('ms', '-')}{'' if c.get('ok', True) else ' (error)'}"
                  for c in (r["tools"].get(t, {}) for t in tools)]  # fmt: skip
            lines.append(f"| {r['events']:,} | {gb(r['file_bytes'])} | `{r['flag']} {MEMORY_LIMIT}` | "
                         f"{r['rss_start_mib']} / "
                         f"{r['rss_peak_mib']} / {r['rss_after_mib']} | {r['limit_mib']} | "
                         f"{' | '.join(ms)} | {r['ingested']:,} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    run(sys.argv[1:])
