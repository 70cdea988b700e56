"""The straggler demo: a simulated 8-rank job on 2 nodes whose clocks disagree, one real eBPF agent per
node, one Echo, and an MCP client that asks which rank held the others back, how often, why, and what
it cost.

Steps: start ``rankecho serve`` (OTLP + MCP over HTTP, bearer token); run ``rankecho sim`` on
``sim/scenarios/seed-rank5.yaml`` with ``--endpoint`` (each node's agent attaches uprobes to that
node's copy of the fake libnccl/libcudart before its ranks start), with node-h100's clock set 40 ms
ahead; then, as an AI agent would, call ``fleet.cluster.find_stragglers`` and
``fleet.cluster.explain_straggler`` on its first episode, and score the answer against the simulator's
ground truth (``sim/score.py``).

Needs root, bcc and tracefs (``rankecho agent check`` says what is missing); skipped with the reason
otherwise. Usage::

    python -m rankecho.demo --part straggler
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from rankecho.echo.report import render_stragglers

SCENARIO = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "seed-rank5.yaml"
SIM_LIB = Path(__file__).resolve().parent.parent / "sim" / "build" / "libnccl.so.2"
STEPS = 100
REPORT_DIR = Path("build") / "demo-report"
"""Where the demo leaves its report (``rankecho report``'s files), relative to the working directory."""
SKEW_MS = 40.0
"""node-h100's clock runs this far ahead of node-a100's: the answer must not notice."""


def missing_prerequisite() -> str | None:
    """Why this machine cannot run the eBPF part, or None when it can."""
    from rankecho.agent.check import ebpf_missing

    missing = ebpf_missing()
    if missing:
        return f"the agent's eBPF probes cannot load here ({missing}); as root: `sudo make demo`"
    if not SIM_LIB.exists():
        return f"{SIM_LIB} is missing (make sim-libs builds it)"
    return None


def skewed_scenario(workdir: Path) -> Path:
    """The seed scenario with node-h100's clock SKEW_MS ahead."""
    raw = yaml.safe_load(SCENARIO.read_text())
    for node in raw["nodes"]:
        if node["id"] == "node-h100":
            node["clock_offset_ms"] = SKEW_MS
    path = workdir / "seed-rank5-skewed.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


async def investigate(mcp_url: str, token: str) -> dict[str, Any]:
    """What an AI agent would call, through a real MCP client over streamable HTTP."""
    from fastmcp import Client

    async with Client(mcp_url, auth=token) as client:
        found = (await client.call_tool("fleet.cluster.find_stragglers", {})).structured_content or {}
        answers: dict[str, Any] = {"find_stragglers": found, "explain_straggler": None}
        if found.get("stragglers"):
            top = found["stragglers"][0]
            episode = top["episodes"][0]
            explained = await client.call_tool(
                "fleet.cluster.explain_straggler",
                {
                    "node_id": top["node_id"],
                    "rank": top["rank"],
                    "causal_chain_id": episode["causal_chain_id"],
                },
            )
            answers["explain_straggler"] = explained.structured_content
        cost = (await client.call_tool("fleet.cluster.get_cost", {})).structured_content or {}
        answers["get_cost"] = {k: cost.get(k) for k in ("stalls", "stall_cost_total", "stall_cost_per_day")}
        return answers


def write_demo_report(mcp_url: str, token: str, out: Path) -> Path:
    """``rankecho report`` over MCP, as a person would run it against this Echo."""
    from rankecho.echo.visual.bundle import write_report
    from rankecho.echo.visual.source import picture_from_mcp

    return write_report(picture_from_mcp(mcp_url, token, None, None, timeout_s=60.0), out)


def run_straggler_demo(workdir: Path) -> int:
    from rankecho.demo import check
    from rankecho.launch.echo import EchoProcess
    from rankecho.sim.score import CAUSE_TO_FAULT, periods, predictions_from, score

    why_not = missing_prerequisite()
    if why_not:
        print(f"STRAGGLER DEMO SKIPPED: {why_not}")
        return 0
    started, token = time.monotonic(), secrets.token_hex(16)
    truth_path = workdir / "truth.json"
    scenario = skewed_scenario(workdir)
    print(f"1. Starting Echo (OTLP + MCP over HTTP) on {workdir / 'straggler.db'}")
    with EchoProcess(workdir / "straggler.db", token=token, log=workdir / "echo.log") as echo:
        print(f"2. Simulating {SCENARIO.name}: 8 ranks on 2 nodes, {STEPS} steps, one eBPF agent per node, "
              f"node-h100's clock {SKEW_MS:g} ms ahead")  # fmt: skip
        sim = subprocess.run(
            [sys.executable, "-m", "rankecho", "sim", str(scenario), "--steps", str(STEPS),
             "--endpoint", echo.otlp_grpc, "--token", token,
             "--ground-truth", str(truth_path), "--run-dir", str(workdir / "run")],
            check=False,
        )  # fmt: skip
        if sim.returncode != 0:
            print(f"\nVERDICT: FAIL: rankecho sim exited {sim.returncode} (logs under {workdir / 'run'})")
            return 1
        mcp_url = f"http://{echo.listening['mcp_http']}/mcp"
        print(f"3. Investigating through MCP at {mcp_url}")
        answers = asyncio.run(investigate(mcp_url, token))
        report = write_demo_report(mcp_url, token, REPORT_DIR.resolve())
    found = answers["find_stragglers"]
    print("\n-- fleet.cluster.find_stragglers()")
    print(render_stragglers(found))
    explained = answers["explain_straggler"]
    if explained:
        print("\n-- fleet.cluster.explain_straggler(first episode)")
        print(f"  {explained['explanation']}")
    print(f"\n-- fleet.cluster.get_cost(): stalls {json.dumps(answers['get_cost'])}")
    print(f"\n-- the report (timeline around the latest late episode, lateness heat map): {report}")

    truth = json.loads(truth_path.read_text())
    print("\n4. Checks against the simulator's ground truth")
    failures: list[str] = []
    s = score(truth, predictions_from(truth, found))
    check(failures, s.precision >= 0.95 and s.recall >= 0.95,
          f"late episodes: precision {s.precision:.3f}, recall {s.recall:.3f} "
          f"({s.true_positives} found, {s.false_positives} wrong, {s.false_negatives} missed)")  # fmt: skip
    expected_periods = periods(truth, found)
    check(
        failures,
        all(e == g for _, e, g in expected_periods),
        f"period (who, expected, found): {expected_periods}",
    )
    named = [(x["node_id"], x["rank"]) for x in found.get("stragglers", [])]
    check(failures, named == [("node-h100", 5)], f"the one straggler named is rank 5 on node-h100: {named}")
    cause = found["stragglers"][0]["cause"]["class"] if named else None
    check(
        failures,
        CAUSE_TO_FAULT.get(cause or "") == "alloc_stall",
        f"its cause ({cause}) is the injected alloc_stall",
    )
    lead = (found["stragglers"][0]["cause"].get("leading_frames") or "") if named else ""
    function = truth["faults"][0].get("function")
    check(failures, function in lead.split(" <- "),
          f"its cause's call stack ({lead or 'none'}) names {function}, where the fault ran")  # fmt: skip
    elapsed = time.monotonic() - started
    if failures or not named:
        print(f"\nVERDICT: FAIL ({'; '.join(failures) or 'no straggler found'}) in {elapsed:.1f} s")
        return 1
    top = found["stragglers"][0]
    print(
        f"\nVERDICT: PASS: rank {top['rank']} on {top['node_id']} entered {top['episodes_total']} of "
        f"{found['clusters'][0]['steps']} steps a median {top['late_ms']['median']:.0f} ms late, every "
        f"{top['period']['steps']} steps, at {lead} ({top['cause']['class']}); the others waited "
        f"{top['imposed_gpu_s']:.1f} GPU-s; clocks {SKEW_MS:g} ms apart changed nothing ({elapsed:.1f} s)"
    )
    return 0
