"""The demo (``make demo``). Part 1, the fan-in proof: two nodes push 1,000 events each into one Echo,
then the four fan-in queries show that every event landed, every causal chain survived and the
stragglers surface. Part 2 (``rankecho.demo_straggler``, needs root for eBPF): a simulated job, real
agents, and an MCP investigation that names the straggling rank, its period and its cause.

Steps: start ``rankecho serve`` on a temporary DB with a bearer token; run two ``rankecho stress``
invocations at once (``node-a100`` and ``node-h100`` in ``demo-cluster``, a chain marker every 25th
event, a straggler every 100th); stop Echo (SIGTERM drains and commits); run the queries through
``rankecho query`` and print them; end with one verdict line. Exit 0 only if every check holds.

Usage::

    rankecho demo [--part fanin|straggler|all] [--keep PATH]   # or: python -m rankecho.demo ...
"""

from __future__ import annotations

import argparse
import importlib.util
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rankecho import exitcodes
from rankecho.echo.report import text_table
from rankecho.helpfmt import Parser
from rankecho.showcase_cli import DEMO_DESCRIPTION, DEMO_EXAMPLES, add_demo_arguments

CLUSTER = "demo-cluster"
NODES = ("node-a100", "node-h100")
EVENTS_PER_NODE = 1000


def check(failures: list[str], ok: bool, what: str) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    if not ok:
        failures.append(what)


def run_demo(workdir: Path, keep: Path | None) -> int:
    from rankecho.echo.queries import FANIN
    from rankecho.launch.echo import EchoProcess
    from rankecho.launch.stress import StressProcess, query_cli

    db, token = workdir / "echo-fanin-demo.db", secrets.token_hex(16)
    started = time.monotonic()
    print(f"1. Starting Echo on {db} (bearer token required)")
    with EchoProcess(db, token=token, log=workdir / "echo.log") as echo:
        print(f"   Echo OTLP/gRPC listening on {echo.otlp_grpc}")
        print(f"2. Two stress runs push {EVENTS_PER_NODE:,} events each into {CLUSTER}: {', '.join(NODES)}")
        runs = [
            StressProcess(echo.otlp_grpc, token, CLUSTER, node, producers=1, events=EVENTS_PER_NODE)
            for node in NODES
        ]
        for run in runs:
            run.start()
        summaries = [run.finish() for run in runs]
        for node, s in zip(NODES, summaries, strict=True):
            print(
                f"   {node}: sent {s['sent']}, acked {s['acked']}, failed {s['failed']}, "
                f"{s['eps']:,.0f} events/s"
            )
    print("3. Echo stopped (SIGTERM: queue drained, committed, lock released)")
    print("4. The fan-in queries, through `rankecho query`:")
    results: dict[str, list[dict[str, Any]]] = {}
    for name in ("per_node_events", "chains", "stragglers", "health_quantiles"):
        print(f"\n-- {name}\n{FANIN[name].sql};\n")
        rows = query_cli(db, FANIN[name].sql)
        results[name] = sorted(rows, key=lambda r: str(r.get("node_id", "")))  # display order only
        print(text_table(results[name]))
    plans = {node: run.plan() for node, run in zip(NODES, runs, strict=True)}
    per_node = {r["node_id"]: r["events"] for r in results["per_node_events"]}
    stragglers = {r["node_id"]: r["straggler_events"] for r in results["stragglers"]}
    chains = next(iter(results["chains"][0].values()))
    expected_chains = sum(p.chain_count() for p in plans.values())
    expected_stragglers = {n: p.straggler_count() for n, p in plans.items()}
    print("\n5. Checks")
    failures: list[str] = []
    check(
        failures,
        all(s["acked"] == s["sent"] == EVENTS_PER_NODE and s["failed"] == 0 for s in summaries),
        "every event acknowledged by Echo",
    )
    check(
        failures,
        per_node == dict.fromkeys(NODES, EVENTS_PER_NODE),
        f"per-node counts {per_node} == {EVENTS_PER_NODE} each",
    )
    check(
        failures, chains == expected_chains, f"{chains} distinct causal chains == {expected_chains} planted"
    )
    check(
        failures,
        stragglers == expected_stragglers,
        f"stragglers {stragglers} == planted {expected_stragglers}",
    )
    healthy = all(r["median_health"] >= 0.55 for r in results["health_quantiles"])
    check(failures, healthy, "median health stays healthy on every node (stragglers are rare)")
    if keep is not None:
        shutil.copyfile(db, keep)
        print(f'\nDB kept at {keep}: rankecho query --db {keep} "SELECT ..."')
    total = sum(per_node.values())
    elapsed = time.monotonic() - started
    if failures:
        print(f"\nVERDICT: FAIL ({len(failures)} check(s) failed: {'; '.join(failures)}) in {elapsed:.1f} s")
        return exitcodes.FAILED
    print(
        f"\nVERDICT: PASS: {total:,}/{len(NODES) * EVENTS_PER_NODE:,} events landed from {len(NODES)} nodes, "
        f"{chains} causal chains intact, {sum(stragglers.values())} stragglers found exactly where planted "
        f"({elapsed:.1f} s)"
    )
    return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    """Run the parts ``args.part`` names (flags: :func:`rankecho.showcase_cli.add_demo_arguments`)."""
    from rankecho.demo_straggler import run_straggler_demo

    if importlib.util.find_spec("bench") is None:
        print(
            "rankecho demo: the demo drives the repository's bench/ launchers: run it from a rankecho "
            "source checkout (cd rankecho && make demo)",
            file=sys.stderr,
        )
        return exitcodes.USAGE
    parts = {"fanin": ["fanin"], "straggler": ["straggler"], "all": ["fanin", "straggler"]}[args.part]
    codes = []
    for part in parts:
        print(f"\n===== {'Fan-in proof' if part == 'fanin' else 'Straggler investigation'} =====\n")
        with tempfile.TemporaryDirectory(prefix=f"rankecho-demo-{part}-") as tmp:
            try:
                code = run_demo(Path(tmp), args.keep) if part == "fanin" else run_straggler_demo(Path(tmp))
            except Exception as err:  # the demo's last line must say what went wrong
                print(f"\nVERDICT: FAIL: {type(err).__name__}: {err}", file=sys.stdout)
                code = exitcodes.FAILED
        codes.append(code)
    return max(codes)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rankecho.demo``: the same flags as ``rankecho demo``."""
    parser = Parser(prog="python -m rankecho.demo", description=DEMO_DESCRIPTION, epilog=DEMO_EXAMPLES)
    add_demo_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
