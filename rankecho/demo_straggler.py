"""The straggler demo: a simulated 8-rank job on 2 nodes, one real eBPF agent per node, one Echo, and
an MCP client that finds the rank holding everyone back, how often, and what it was doing.

Steps: start ``rankecho serve`` (OTLP + MCP over HTTP, bearer token); run ``rankecho sim`` on
``sim/scenarios/seed-rank5.yaml`` with ``--agent-endpoint`` (each node's agent attaches uprobes to that
node's copy of the fake libnccl/libcudart before its ranks start); then, as an AI agent would, call
``fleet.cluster.find_outlier_nodes`` and ``fleet.cluster.run_analysis`` with the straggler example
queries from the schema resource; compare the answer with the simulator's ground truth.

Needs root, bcc and tracefs (``rankecho agent check`` says what is missing); skipped with the reason
otherwise. Usage::

    python -m rankecho.demo --part straggler
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shared.contract import M_HEALTH as HEALTH

SCENARIO = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "seed-rank5.yaml"
SIM_LIB = Path(__file__).resolve().parent.parent / "sim" / "build" / "libnccl.so.2"
STEPS = 100
QUERIES = ("example_late_ranks", "example_late_steps", "example_before_late_entry")


def missing_prerequisite() -> str | None:
    """Why this machine cannot run the eBPF part, or None when it can."""
    if os.geteuid() != 0:
        return "the agent's eBPF probes need root (run `sudo make demo`)"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "bcc is not importable (make install links Debian's python3-bpfcc into .venv)"
    if not SIM_LIB.exists():
        return f"{SIM_LIB} is missing (make sim-libs builds it)"
    if not any(Path("/sys/kernel/tracing").iterdir()):
        return "tracefs is not mounted (scripts/setup-host.sh mounts it)"
    return None


async def investigate(mcp_url: str, token: str) -> dict[str, Any]:
    """What an AI agent would call, through a real MCP client over streamable HTTP."""
    from fastmcp import Client

    from echo.queries import QUERIES as NAMED

    async with Client(mcp_url, auth=token) as client:
        outliers = await client.call_tool(
            "fleet.cluster.find_outlier_nodes", {"metric": HEALTH, "threshold": 0.4}
        )
        answers = {"outliers": outliers.structured_content}
        for name in QUERIES:
            result = await client.call_tool("fleet.cluster.run_analysis", {"sql": NAMED[name].sql})
            answers[name] = (result.structured_content or {}).get("rows", [])
        return answers


def show(title: str, rows: list[dict[str, Any]]) -> None:
    from rankecho.demo import table

    print(f"\n-- {title}")
    print(table(rows))


def run_straggler_demo(workdir: Path) -> int:
    from echo.stress.server import EchoProcess
    from rankecho.demo import check

    why_not = missing_prerequisite()
    if why_not:
        print(f"STRAGGLER DEMO SKIPPED: {why_not}")
        return 0
    started, token = time.monotonic(), secrets.token_hex(16)
    truth_path = workdir / "truth.json"
    print(f"1. Starting Echo (OTLP + MCP over HTTP) on {workdir / 'straggler.db'}")
    with EchoProcess(workdir / "straggler.db", token=token, log=workdir / "echo.log") as echo:
        print(f"2. Simulating {SCENARIO.name}: 8 ranks on 2 nodes, {STEPS} steps, one eBPF agent per node")
        sim = subprocess.run(
            [sys.executable, "-m", "rankecho", "sim", str(SCENARIO), "--steps", str(STEPS),
             "--agent-endpoint", echo.otlp_grpc, "--token", token,
             "--ground-truth", str(truth_path), "--run-dir", str(workdir / "run")],
            check=False,
        )
        if sim.returncode != 0:
            print(f"\nVERDICT: FAIL: rankecho sim exited {sim.returncode} (logs under {workdir / 'run'})")
            return 1
        mcp_url = f"http://{echo.listening['mcp_http']}/mcp"
        print(f"3. Investigating through MCP at {mcp_url}")
        answers = asyncio.run(investigate(mcp_url, token))
    outlier_nodes = (answers["outliers"] or {}).get("outliers", [])
    print(f"\n-- fleet.cluster.find_outlier_nodes(metric={HEALTH}, threshold=0.4): {outlier_nodes}")
    for name in QUERIES:
        show(f"fleet.cluster.run_analysis({name})", answers[name])

    truth = json.loads(truth_path.read_text())["stragglers_by_rank"]
    late = answers["example_late_steps"]
    print("\n4. Checks against the simulator's ground truth")
    failures: list[str] = []
    found = {str(r["rank"]): list(r["steps"]) for r in late}
    expected = {rank: entry["steps"] for rank, entry in truth.items()}
    check(failures, found == expected, f"late ranks and steps {found} == ground truth {expected}")
    top = answers["example_before_late_entry"][:1]
    cause = top[0]["activity"] if top else "nothing"
    truth_causes = sorted({c for entry in truth.values() for c in entry["causes"]})
    check(failures, bool(top) and "alloc_stall" in truth_causes and cause == "cudaMalloc",
          f"largest activity before the late entries ({cause}) matches the injected cause {truth_causes}")
    elapsed = time.monotonic() - started
    if failures or not late:
        print(f"\nVERDICT: FAIL ({'; '.join(failures) or 'no late rank found'}) in {elapsed:.1f} s")
        return 1
    worst, ranks = late[0], answers["example_late_ranks"][0]
    print(
        f"\nVERDICT: PASS: rank {worst['rank']} on {worst['node_id']} entered {ranks['late_collectives']} "
        f"collectives a median {ranks['median_late_ms']} ms late, every {worst['every_n_steps']:g} steps; "
        f"before each it spent {top[0]['total_ms'] / top[0]['windows']:.0f} ms in {cause} ({elapsed:.1f} s)"
    )
    return 0
