"""Ingest benchmark: data points/s that Echo acknowledges after commit with 8 producers over >= 20 s,
and the wall time of the 8 x 250 fan-in; medians of several runs, each into a fresh store.

Producers are threads sending prebuilt raw OTLP requests (encoded once, before any run, and reused:
every run writes a fresh DB, so nothing is deduplicated away), over OTLP/gRPC (``--transport grpc``,
the default) or OTLP/HTTP protobuf (``--transport http``: one kept-alive connection per producer, 429/503
answered by waiting ``Retry-After``). After each run Echo is stopped and the rows counted: ``lost`` =
acknowledged - stored must be 0. Client and Echo share this machine's cores.

``--against DIR`` runs the same runs on another checkout's Echo too (e.g. a ``git worktree`` of an older
revision), alternating run by run so both see the same load, and prints the ratio of the medians.

``python -m bench ingest --seconds 20 --runs 3 [--transport http] [--against DIR]``
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from rankecho.launch.echo import EchoProcess
from rankecho.launch.stress import StressProcess
from rankecho.stress import runner
from rankecho.stress.planting import StressPlan
from rankecho.stress.runner import Batch, StressConfig
from rankecho.stress.senders import Target

TOKEN = "bench-ingest-token"
TARGET_POINTS_PER_S = 150_000
TARGET_FANIN_S = 2.0
COMMIT_SECONDS_SUM = "rankecho_echo_commit_seconds_sum"


def stored_rows(db: Path) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("SELECT COUNT(*) FROM events").fetchone()
    return int(row[0]) if row else 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc, all threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def writer_busy_s(echo: EchoProcess) -> float | None:
    """Seconds Echo's writer has spent committing so far, from its Prometheus ``/metrics``."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{echo.listening['otlp_http']}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(COMMIT_SECONDS_SUM):
            return float(line.split()[-1])
    return None


@dataclass
class HttpResult:
    """What :func:`http_run` counted, named as :class:`rankecho.stress.runner.StressResult` names it."""

    sent: int = 0
    acked: int = 0
    failed: int = 0
    retries: int = 0
    elapsed_s: float = 0.0


def http_run(address: str, work: list[list[Batch]], duration_s: float) -> HttpResult:
    """Each producer thread POSTs its prebuilt requests to ``/v1/metrics`` on its own kept-alive
    connection until ``duration_s`` passes; a 429/503 is resent after its ``Retry-After``."""
    host, port = address.rsplit(":", 1)
    headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
    result, lock, start = HttpResult(), threading.Lock(), threading.Event()
    t0 = [0.0]

    def produce(batches: list[Batch]) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        start.wait()
        for batch in batches:
            if time.monotonic() - t0[0] >= duration_s:
                break
            body = batch.payload
            assert isinstance(body, bytes), "http_run needs prebuilt requests (raise --pool's limit)"
            with lock:
                result.sent += batch.count
            while True:
                conn.request("POST", "/v1/metrics", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.status not in (429, 503):
                    break
                with lock:
                    result.retries += 1
                time.sleep(float(response.getheader("Retry-After") or 1))
            with lock:
                if response.status == 200:
                    result.acked += batch.count
                else:
                    result.failed += batch.count
        conn.close()

    threads = [threading.Thread(target=produce, args=(b,), daemon=True) for b in work]
    for t in threads:
        t.start()
    t0[0] = time.monotonic()
    start.set()
    for t in threads:
        t.join()
    result.elapsed_s = time.monotonic() - t0[0]
    return result


def ingest_once(
    workdir: Path, cfg: StressConfig, work: list[list[Batch]], n: int, transport: str = "grpc",
    source: Path | None = None,
) -> dict[str, Any]:
    db = workdir / f"ingest-{n}.db"
    with EchoProcess(db, token=TOKEN, source=source) as echo:
        live = StressConfig(
            cfg.plan, Target(echo.otlp_grpc, TOKEN), "raw", cfg.batch, duration_s=cfg.duration_s
        )
        assert echo.proc is not None
        echo_cpu, client_cpu, busy = cpu_seconds(echo.proc.pid), time.process_time(), writer_busy_s(echo)
        if transport == "http":
            result: Any = http_run(str(echo.listening["otlp_http"]), work, cfg.duration_s or 20.0)
        else:
            result = runner.run(live, work)
        echo_cpu, client_cpu = cpu_seconds(echo.proc.pid) - echo_cpu, time.process_time() - client_cpu
        busy_after = writer_busy_s(echo)
        writer_busy = (
            (busy_after - busy) / result.elapsed_s if busy is not None and busy_after is not None else None
        )
        stop_started = time.monotonic()
    drain_s = time.monotonic() - stop_started
    rows = stored_rows(db)
    db.unlink(missing_ok=True)
    return {
        "points_per_s": result.acked / result.elapsed_s,
        "acked": result.acked,
        "failed": result.failed,
        "retries": result.retries,
        "elapsed_s": result.elapsed_s,
        "stored": rows,
        "lost": result.acked - rows,
        "exhausted": result.sent >= cfg.plan.total,
        "stop_s": round(drain_s, 2),
        "echo_cores": echo_cpu / result.elapsed_s,
        "client_cores": client_cpu / result.elapsed_s,
        "writer_busy": writer_busy,
    }


def fanin_once(workdir: Path, n: int) -> dict[str, Any]:
    """The proof's shape: two stress processes (4 producers x 250 each, two clusters) at once."""
    db = workdir / f"fanin-{n}.db"
    with EchoProcess(db, token=TOKEN) as echo:
        started = time.monotonic()
        runs = [
            StressProcess(echo.otlp_grpc, TOKEN, c, node, producers=4, events=250).start()
            for c, node in (("cluster-a", "node-a"), ("cluster-b", "node-b"))
        ]
        summaries = [r.finish() for r in runs]
        wall = time.monotonic() - started
    rows = stored_rows(db)
    db.unlink(missing_ok=True)
    return {"wall_s": wall, "send_s": max(s["elapsed_s"] for s in summaries), "stored": rows}


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench ingest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each ingest run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fanin-runs", type=int, default=5)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=5000, help="points per Export RPC")
    parser.add_argument("--pool", type=int, default=4_000_000, help="points encoded up front (caps one run)")
    parser.add_argument(
        "--transport", choices=("grpc", "http"), default="grpc", help="OTLP/gRPC or OTLP/HTTP protobuf"
    )
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="another checkout's Echo, run alternately with this one (ratio printed)")
    args, _ = parser.parse_known_args(argv)
    if args.against is not None and not (args.against / "rankecho" / "__main__.py").is_file():
        parser.error(f"--against {args.against}: not a rankecho checkout (no rankecho/__main__.py)")

    plan = StressPlan("bench", "producer", args.producers, args.pool // args.producers)
    cfg = StressConfig(plan, Target("unused:0"), "raw", args.batch, duration_s=args.seconds)
    t = time.monotonic()
    work = runner.prepare(cfg, workers=os.cpu_count() or 1, prebuild_limit=None)
    print(
        f"machine: {_cores()} cores, load average {os.getloadavg()[0]:.1f} before the runs "
        "(other work on these cores lowers every number below)"
    )
    print(
        f"encoded {plan.total:,} points in {time.monotonic() - t:.1f} s "
        f"({args.producers} producers, {args.batch} points per request, over {args.transport})",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        ingest, other = [], []
        for n in range(args.runs):
            if args.against is not None:
                o = ingest_once(Path(tmp), cfg, work, n, args.transport, source=args.against)
                other.append(o)
                print(f"  ingest run {n + 1}, {args.against}: {o['points_per_s']:>9,.0f} points/s  "
                      f"Echo {o['echo_cores']:.2f} cores  lost {o['lost']}  failed {o['failed']}", flush=True)
            r = ingest_once(Path(tmp), cfg, work, n, args.transport)
            ingest.append(r)
            print(
                f"  ingest run {n + 1}: {r['points_per_s']:>9,.0f} points/s  acked {r['acked']:,} in "
                f"{r['elapsed_s']:.1f} s  stored {r['stored']:,}  lost {r['lost']}  failed {r['failed']}  "
                f"retries {r['retries']}  cores used: Echo {r['echo_cores']:.2f}, "
                f"client {r['client_cores']:.2f}; Echo's writer committing {_pct(r['writer_busy'])}"
                + ("  (pool ran out: raise --pool)" if r["exhausted"] else ""),
                flush=True,
            )
        fanin = []
        for n in range(args.fanin_runs):
            f = fanin_once(Path(tmp), n)
            fanin.append(f)
            print(
                f"  fan-in run {n + 1}: {f['wall_s']:.2f} s wall (two stress processes), "
                f"{f['send_s']:.3f} s sending, stored {f['stored']}",
                flush=True,
            )
    pps = statistics.median(r["points_per_s"] for r in ingest) if ingest else 0.0
    fan = statistics.median(f["wall_s"] for f in fanin) if fanin else float("nan")
    send = statistics.median(f["send_s"] for f in fanin) if fanin else float("nan")
    lost = sum(r["lost"] + r["failed"] for r in ingest + other) + sum(2000 - f["stored"] for f in fanin)
    print(
        f"median ingest  {pps:>9,.0f} points/s  target >= {TARGET_POINTS_PER_S:,}  "
        f"ratio {pps / TARGET_POINTS_PER_S:.2f}x  lost {lost}"
    )
    against: dict[str, Any] | None = None
    if other:
        base = statistics.median(o["points_per_s"] for o in other)
        per_core = statistics.median(r["points_per_s"] / r["echo_cores"] for r in ingest if r["echo_cores"])
        base_core = statistics.median(o["points_per_s"] / o["echo_cores"] for o in other if o["echo_cores"])
        against = {"dir": str(args.against), "points_per_s_median": base, "ratio": pps / base,
                   "per_core_ratio": per_core / base_core, "runs": other}  # fmt: skip
        print(f"median ingest  {base:>9,.0f} points/s  on {args.against}; this tree x{pps / base:.2f} "
              f"(per Echo core x{per_core / base_core:.2f})")
    print(
        f"median fan-in  {fan:>9.2f} s wall      target <= {TARGET_FANIN_S:.1f} s  "
        f"ratio {TARGET_FANIN_S / fan:.2f}x  (sending alone {send:.3f} s)"
    )
    return {
        "transport": args.transport,
        "points_per_s_median": pps,
        "fanin_wall_s_median": fan,
        "fanin_send_s_median": send,
        "lost": lost,
        "ingest_runs": ingest,
        "fanin_runs": fanin,
        "against": against,
        "cores": _cores(),
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%} of the time"


def _cores() -> int:
    return os.cpu_count() or 0


if __name__ == "__main__":
    run(sys.argv[1:])
