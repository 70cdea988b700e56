"""How fast the straggler diagnosis answers: on big stores, and live from a straggler's first late call.

Stores: for each ``--sizes`` entry, a synthetic store of that many events in the agent's shape
(:mod:`rankecho.sim.synthetic`: 2 nodes x 8 ranks, node clocks 40 ms apart, world and tensor-parallel
communicators, one rank 60 ms late every 14 steps and another 30 ms late at every step). Measured
``--repeat`` times each, medians and p95 beside the targets, as MCP calls them (guard, read-only
transaction, JSON):

- ``find_stragglers()`` over all stored data (target <= 1 s);
- ``explain_straggler`` of the top straggler's latest episode (target <= 200 ms).

Onset to answer (``--live``, needs root, bcc and tracefs): each scenario in ``bench/onset/`` runs for
real (rank processes, one eBPF agent per node, Echo in this process) while this process calls
``find_stragglers()`` in a loop; the time from the faulted rank's first late collective (the
simulator's ground truth, real time) to the first answer naming it (target <= 5 s).

Usage: ``python -m bench analysis [--sizes 1000000,10000000] [--repeat 5] [--no-live]``
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from rankecho.echo.app import Echo
from rankecho.echo.guard.instance import seal
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation, Limits
from rankecho.echo.settings import HostPort, Settings
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.reader import Reader
from rankecho.sim.launcher import LaunchOptions, RunResult, run_scenario
from rankecho.sim.scenario import load_scenario
from rankecho.sim.synthetic import EVENTS_PER_RANK_STEP, SynFault, SynNode, SyntheticJob, write_job

TARGETS_MS = {"find_stragglers": 1000.0, "explain_straggler": 200.0}
ONSET_TARGET_S = 5.0
ONSET_SCENARIOS = Path(__file__).resolve().parent / "onset"
NODES = (SynNode("node-a", 8), SynNode("node-b", 8, offset_ms=40.0))
FAULTS = (SynFault(5, 60.0, every=14), SynFault(12, 30.0, every=1, start_step=100))


def build(path: Path, events: int) -> duckdb.DuckDBPyConnection:
    """A migrated store holding about ``events`` synthetic events (whole steps of the job above)."""
    world = sum(n.ranks for n in NODES)
    steps = max(200, events // (world * EVENTS_PER_RANK_STEP))
    con = duckdb.connect(str(path))
    migrate(con)
    write_job(con, SyntheticJob(nodes=NODES, steps=steps, step_ms=90.0, faults=FAULTS))
    con.execute("CHECKPOINT")
    seal(con, "8GB")  # as Echo runs it: no file or network access, a memory cap
    return con


def timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    """Milliseconds of ``repeat`` calls after one warm-up call, and the warm-up's answer."""
    answer = fn()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples, answer


def stats(samples: list[float], target_ms: float) -> dict[str, float]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    return {
        "p50_ms": p50,
        "p95_ms": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "target_ms": target_ms,
        "p50_over_target": p50 / target_ms,
    }


def measure_store(events: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        con = build(Path(tmp) / "analysis.db", events)
        stored = con.execute(
            "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM collectives)"
        ).fetchall()[0]
        print(f"store: {stored[0]:,} events ({stored[1]:,} collective calls) built in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        inv = Investigation(Reader(con), load_rates(), Limits(timeout_s=120))
        find_ms, found = timed(lambda: inv.diagnosis.find_stragglers(), repeat)
        top = found["stragglers"][0]
        latest = top["episodes"][-1]
        explain_ms, _ = timed(
            lambda: inv.explainer.explain_straggler(top["node_id"], top["rank"], latest["causal_chain_id"]),
            repeat,
        )
        con.close()
    return {
        "events": stored[0],
        "collectives": stored[1],
        "named": [
            f"rank {s['rank']}" if s["kind"] == "rank" else f"node {s['node_id']}"
            for s in found["stragglers"]
        ],
        "find_stragglers": stats(find_ms, TARGETS_MS["find_stragglers"]),
        "explain_straggler": stats(explain_ms, TARGETS_MS["explain_straggler"]),
    }


def onset(path: Path) -> dict[str, Any]:
    """Run one scenario live and time find_stragglers from the first late call to naming the rank."""
    scenario = load_scenario(path)
    (fault,) = scenario.faults
    token = secrets.token_hex(16)
    any_port = HostPort("127.0.0.1", 0)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Echo(
            Settings(
                db_path=Path(tmp) / "echo.db",
                token=token,
                otlp_grpc=any_port,
                otlp_http=any_port,
                mcp_http=None,
            )
        ) as echo,
    ):
        done: list[RunResult] = []
        opts = LaunchOptions(
            run_dir=Path(tmp) / "run", agent_endpoint=echo.grpc_address, token=token, progress=None
        )
        job = threading.Thread(target=lambda: done.append(run_scenario(scenario, opts)), daemon=True)
        job.start()
        diagnosis = Investigation(echo.reader, load_rates()).diagnosis
        named_at_ns: int | None = None
        calls: list[float] = []
        while job.is_alive() and named_at_ns is None:
            started = time.perf_counter()
            found = diagnosis.find_stragglers()
            calls.append((time.perf_counter() - started) * 1000)
            if any(s["rank"] == fault.rank for s in found["stragglers"]):
                named_at_ns = time.time_ns()
            time.sleep(0.1)
        job.join()
    truth = done[0].truth if done else None
    if truth is None:
        raise RuntimeError(f"scenario {scenario.name} did not finish; see {opts.run_dir}")
    first_late_ns = min(
        r["enter_ns"]
        for s in truth["per_step"]
        for r in s["ranks"]
        if r["rank"] == fault.rank and r["cause"] and s["step"] >= fault.start_step
    )
    seconds = (named_at_ns - first_late_ns) / 1e9 if named_at_ns else None
    return {
        "scenario": scenario.name,
        "fault": f"rank {fault.rank} {fault.kind} {fault.ms:g} ms every {fault.every} "
        f"from step {fault.start_step}",
        "onset_to_answer_s": seconds,
        "target_s": ONSET_TARGET_S,
        "calls": len(calls),
        "call_p50_ms": statistics.median(calls) if calls else None,
    }


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench analysis")
    parser.add_argument("--sizes", default="1000000,10000000", help="store sizes in events, comma separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-live", action="store_true", help="skip the live onset-to-answer runs")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"stores": [], "onset": []}
    for size in (int(s) for s in args.sizes.split(",")):
        r = measure_store(size, args.repeat)
        results["stores"].append(r)
        for tool in TARGETS_MS:
            s = r[tool]
            print(f"  {tool:<18} p50 {s['p50_ms']:8.1f} ms  p95 {s['p95_ms']:8.1f} ms  "
                  f"target {s['target_ms']:.0f} ms  p50/target {s['p50_over_target']:.2f}")  # fmt: skip
        print(f"  named: {', '.join(r['named'])}")
    if not args.no_live:
        from rankecho.demo_straggler import missing_prerequisite

        why_not = missing_prerequisite()
        if why_not:
            print(f"onset to answer skipped: {why_not}")
        for path in [] if why_not else sorted(ONSET_SCENARIOS.glob("*.yaml")):
            o = onset(path)
            results["onset"].append(o)
            got = f"{o['onset_to_answer_s']:.2f} s" if o["onset_to_answer_s"] is not None else "never named"
            print(f"onset to answer, {o['scenario']} ({o['fault']}): {got} (target {ONSET_TARGET_S:g} s; "
                  f"{o['calls']} find_stragglers calls, p50 {o['call_p50_ms']:.0f} ms)")  # fmt: skip
    return results
