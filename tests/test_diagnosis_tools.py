"""The diagnosis surface on synthetic stores whose truth is exact: the find_stragglers and
explain_straggler MCP tools (through the in-memory MCP client), the stall costs in get_cost, the clock
section of summary, and ``rankecho diagnose`` on a store file and against a running Echo over MCP."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from echo_helpers import TEST_TOKEN
from fastmcp import Client
from fastmcp.exceptions import ToolError

from rankecho.echo.mcp.causes import NEXT_STEPS
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.server import build_server
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.report import render_stragglers
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.reader import Reader
from rankecho.launch.echo import EchoProcess
from rankecho.sim.synthetic import SynFault, SynNode, SyntheticJob, write_job

REPO = Path(__file__).resolve().parent.parent
STRAGGLER = SynFault(rank=5, ms=60, every=14, start_step=7)
JOB = SyntheticJob(
    nodes=(SynNode("node-a", 4), SynNode("node-b", 4, offset_ms=25.0)), steps=200, faults=(STRAGGLER,)
)
HEALTHY = SyntheticJob(nodes=(SynNode("node-c", 4), SynNode("node-d", 4, offset_ms=-40.0)), steps=120,
                       cluster_id="healthy")  # fmt: skip


def build_store(path: Path, *jobs: SyntheticJob) -> Path:
    with duckdb.connect(str(path)) as con:
        migrate(con)
        for job in jobs:
            write_job(con, job)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("diagnosis") / "echo.db", JOB, HEALTHY)


@pytest.fixture(scope="module")
def inv(store: Path) -> Iterator[Investigation]:
    with duckdb.connect(str(store), read_only=True) as con:
        yield Investigation(Reader(con), load_rates())


def call(inv: Investigation, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with Client(build_server(inv)) as client:
            result = await client.call_tool(tool, args)
            assert result.structured_content is not None
            return dict(result.structured_content)

    return asyncio.run(go())


def test_find_stragglers_names_the_rank_its_steps_period_cause_and_cost(inv: Investigation) -> None:
    found = call(inv, "fleet.cluster.find_stragglers", {"cluster_id": "synthetic"})
    [cluster] = found["clusters"]
    assert cluster["cluster_id"] == "synthetic" and cluster["ranks"] == 8 and cluster["steps"] == 200
    assert cluster["reference_node"] == "node-a" and cluster["noise"]["threshold_ms"] < 60
    [s] = found["stragglers"]
    assert (s["kind"], s["node_id"], s["rank"], s["side"]) == ("rank", "node-b", 5, "host")
    assert [e["step"] for e in s["episodes"]] == JOB.late_steps(5)
    assert s["episodes_total"] == len(JOB.late_steps(5)) and s["share_of_steps"] == pytest.approx(14 / 200)
    assert s["late_ms"]["median"] == pytest.approx(60, abs=1.5)
    assert s["period"]["steps"] == 14 and s["period"]["confidence"] > 0.8
    assert s["cause"]["class"] == "allocator" and s["cause"]["counts"] == {"allocator": 14}
    assert s["cause"]["evidence_ms"]["rank"]["allocator"] == pytest.approx(60, abs=0.5)
    assert s["cause"]["evidence_ms"]["peers_median"]["allocator"] == 0
    # the 7 other ranks each waited about the stall at each of its 14 steps
    assert s["imposed_gpu_s"] == pytest.approx(14 * 7 * 0.060, rel=0.15)
    assert s["cost"]["cost"] > 0 and s["cost"]["cost_per_day"] > s["cost"]["cost"]
    assert 1.0 < s["what_if"]["slowdown"] < 1.1
    assert s["what_if"]["step_ms_if_on_time"] < s["what_if"]["step_ms_actual"]
    assert (
        "rank 5 on node-b" in s["summary"]
        and "every 14 steps" in s["summary"]
        and "cudaMalloc" in s["summary"]
    )
    # times are on node-a's clock: node-b's episodes carry its 25 ms offset removed
    first = s["episodes"][0]
    raw = inv.reader.query(
        "SELECT enter_ns FROM collectives WHERE causal_chain_id = ? AND rank = 5", [first["causal_chain_id"]]
    ).rows[0][0]
    assert raw - first["timestamp_ns"] == pytest.approx(25_000_000, abs=1_000_000)


def test_a_healthy_job_answers_no_straggler_with_its_noise(inv: Investigation) -> None:
    found = call(inv, "fleet.cluster.find_stragglers", {"cluster_id": "healthy"})
    [cluster] = found["clusters"]
    assert found["stragglers"] == [] and found["isolated_late_episodes"] == []
    assert cluster["verdict"].startswith("no straggler (noise: lateness sigma")
    assert cluster["noise"]["threshold_ms"] >= 1.0


def test_min_late_ms_raises_the_bar_and_bad_input_names_the_fix(inv: Investigation) -> None:
    found = call(inv, "fleet.cluster.find_stragglers", {"cluster_id": "synthetic", "min_late_ms": 80})
    assert found["stragglers"] == [] and found["clusters"][0]["noise"]["threshold_ms"] == 80
    with pytest.raises(ToolError, match="accepted window forms"):
        call(inv, "fleet.cluster.find_stragglers", {"window": "yesterday-ish"})
    with pytest.raises(ToolError):
        call(inv, "fleet.cluster.find_stragglers", {"min_late_ms": -5})


def test_explain_straggler_shows_the_pre_call_timeline_against_the_peers(inv: Investigation) -> None:
    [s] = call(inv, "fleet.cluster.find_stragglers", {"cluster_id": "synthetic"})["stragglers"]
    episode = s["episodes"][2]
    by_chain = call(
        inv,
        "fleet.cluster.explain_straggler",
        {"node_id": "node-b", "rank": 5, "causal_chain_id": episode["causal_chain_id"], "before_ms": 200},
    )
    assert by_chain["causal_chain_id"] == episode["causal_chain_id"] and by_chain["step"] == episode["step"]
    assert by_chain["cause"] == "allocator" and by_chain["late_by_ms"] == pytest.approx(60, abs=1.5)
    assert by_chain["breakdown_ms"]["allocator"] == pytest.approx(60, abs=0.5)
    assert by_chain["peers_median_ms"]["allocator"] == 0 and by_chain["peers_compared"] == 7
    assert by_chain["excess_ms"]["allocator"] == pytest.approx(60, abs=0.5)
    assert "cudaMalloc" in by_chain["explanation"]
    assert any(i["kind"] == "malloc" and i["ms"] == pytest.approx(60, abs=0.5) for i in by_chain["timeline"])
    assert all(-200 <= i["start_ms"] <= 0 for i in by_chain["timeline"])
    assert len(by_chain["arrivals"]) == 8
    by_time = call(
        inv,
        "fleet.cluster.explain_straggler",
        {
            "node_id": "node-b",
            "rank": 5,
            "timestamp_ns": episode["timestamp_ns"] + 25_000_000,
            "before_ms": 200,
        },
    )
    assert by_time["causal_chain_id"] == episode["causal_chain_id"]
    with pytest.raises(ToolError, match=r"fleet\.cluster\.summary lists them"):
        call(inv, "fleet.cluster.explain_straggler", {"node_id": "node-b", "rank": 42, "timestamp_ns": 1})
    with pytest.raises(ToolError, match="causal_chain_id or timestamp_ns"):
        call(inv, "fleet.cluster.explain_straggler", {"node_id": "node-b", "rank": 5})


def test_summary_shows_the_clock_offsets_and_get_cost_the_stalls(inv: Investigation) -> None:
    summary = call(inv, "fleet.cluster.summary", {})
    offsets = {(c["cluster_id"], c["node_id"]): c["offset_ms"] for c in summary["clock"]}
    assert offsets[("synthetic", "node-b")] == pytest.approx(25.0, abs=0.5)
    assert offsets[("healthy", "node-d")] == pytest.approx(-40.0, abs=0.5)
    assert {a["alignment"] for a in summary["alignment"]} == {"aligned"}
    cost = call(inv, "fleet.cluster.get_cost", {})
    [stall] = cost["stalls"]
    assert (stall["cluster_id"], stall["rank"]) == ("synthetic", 5) and stall["cost"] > 0
    assert cost["stall_cost_total"] == pytest.approx(stall["cost"])


def diagnose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rankecho", "diagnose", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_diagnose_prints_paragraphs_and_a_table_or_json(store: Path) -> None:
    text = diagnose("--db", str(store), "--cluster-id", "synthetic")
    assert text.returncode == 0, text.stderr
    assert "rank 5 on node-b: it entered the collective a median" in text.stdout
    assert "straggler" in text.stdout and "| side" in text.stdout and "allocator" in text.stdout
    # one step statistic in the text (the mean, said so), the period's confidence, and what to do next
    assert "ms (mean" in text.stdout and "(median)" not in text.stdout
    assert "the mean step would take" in text.stdout
    assert "every 14 steps, period confidence 0.9" in text.stdout and "14 (conf 0.9" in text.stdout
    assert "Next: pre-allocate buffers" in text.stdout
    assert "rankecho explain --node-id node-b --rank 5 --causal-chain-id" in text.stdout
    as_json = diagnose("--db", str(store), "--json")
    assert as_json.returncode == 0
    answer = json.loads(as_json.stdout)
    assert [(s["cluster_id"], s["rank"]) for s in answer["stragglers"]] == [("synthetic", 5)]


def test_diagnose_errors_name_the_fix(tmp_path: Path, store: Path) -> None:
    missing = diagnose("--db", str(tmp_path / "nope.db"))
    assert missing.returncode == 1 and "nope.db" in missing.stderr
    bad = diagnose("--db", str(store), "--window", "soonish")
    assert bad.returncode == 1 and "accepted window forms" in bad.stderr
    assert diagnose("--window", "last 5m").returncode == 2  # --db or --endpoint is required


def test_diagnose_asks_a_running_echo_over_mcp(tmp_path: Path) -> None:
    db = build_store(tmp_path / "live.db", JOB)
    with EchoProcess(db, token=TEST_TOKEN) as echo:
        url = f"http://{echo.listening['mcp_http']}/mcp"
        held = diagnose("--db", str(db))
        assert held.returncode == 3 and "--mcp-url" in held.stderr
        env = {"PATH": "/usr/bin:/bin", "RANKECHO_TOKEN": TEST_TOKEN}
        live = diagnose("--endpoint", url, "--json", env=env)
        assert live.returncode == 0, live.stderr
        assert [(s["node_id"], s["rank"]) for s in json.loads(live.stdout)["stragglers"]] == [("node-b", 5)]
        refused = diagnose("--endpoint", url, env={"PATH": "/usr/bin:/bin", "RANKECHO_TOKEN": "wrong"})
        assert refused.returncode == 1 and "token" in refused.stderr


def test_isolated_episodes_name_a_node_as_the_node() -> None:
    cluster = {"cluster_id": "c", "ranks": 8, "steps": 100, "step_ms": 50.0, "reference_node": "node-a",
               "noise": {"threshold_ms": 12.0, "sigma_ms": 1.5}, "verdict": "no straggler"}  # fmt: skip
    late = {"episodes_total": 1, "late_ms": {"max": 31.2}, "cluster_id": "c"}
    result = {
        "window": {"start": None, "end": None},
        "clusters": [cluster],
        "stragglers": [],
        "isolated_late_episodes": [
            {**late, "kind": "node", "node_id": "node-b", "rank": None, "ranks": [4, 5, 6, 7]},
            {**late, "kind": "rank", "node_id": "node-a", "rank": 3, "ranks": [3]},
        ],
        "truncated": False,
    }
    text = render_stragglers(result)
    listed = "node node-b (1, max 31 ms), rank 3 (node-a) (1, max 31 ms)"
    assert f"too few or small to tell from noise: {listed}" in text


def test_find_stragglers_and_explain_say_what_to_do_next(inv: Investigation) -> None:
    found = call(inv, "fleet.cluster.find_stragglers", {"cluster_id": "synthetic"})
    [s] = found["stragglers"]
    assert found["no_data"] is None and found["clusters"][0]["step_ms_mean"] == pytest.approx(
        s["what_if"]["step_ms_actual"]
    )
    assert s["next_step"].startswith(NEXT_STEPS["allocator"])
    assert f"--causal-chain-id '{s['episodes'][-1]['causal_chain_id']}'" in s["next_step"]
    assert "fleet.cluster.explain_straggler" in s["next_step"]
    explained = call(
        inv,
        "fleet.cluster.explain_straggler",
        {"node_id": "node-b", "rank": 5, "causal_chain_id": s["episodes"][0]["causal_chain_id"]},
    )
    assert explained["next_step"].startswith(NEXT_STEPS["allocator"])


def test_tools_say_plainly_where_the_agent_data_is(inv: Investigation, tmp_path: Path) -> None:
    for args in ({"cluster_id": "typo"}, {"window": "2020-01-01T00:00:00Z/2020-01-02T00:00:00Z"}):
        found = call(inv, "fleet.cluster.find_stragglers", args)
        assert found["clusters"] == [] and found["stragglers"] == []
        assert "'synthetic' (2 nodes, 8 ranks, agent data from" in found["no_data"]
        assert "'healthy'" in found["no_data"]
    assert "mistyped" in call(inv, "fleet.cluster.find_stragglers", {"cluster_id": "typo"})["no_data"]
    cost = call(inv, "fleet.cluster.get_cost", {"cluster_id": "typo"})
    assert cost["rows"] == [] and "'synthetic'" in cost["no_data"]
    assert call(inv, "fleet.cluster.get_cost", {})["no_data"] is None
    assert call(inv, "fleet.cluster.summary", {})["no_data"] is None
    with pytest.raises(ToolError, match="Agent data exists for 'synthetic'"):
        call(inv, "fleet.cluster.explain_straggler", {"node_id": "node-b", "rank": 5, "timestamp_ns": 1})
    with duckdb.connect(str(build_store(tmp_path / "empty.db")), read_only=True) as con:
        empty = Investigation(Reader(con), load_rates())
        for tool in ("fleet.cluster.find_stragglers", "fleet.cluster.summary", "fleet.cluster.get_cost"):
            assert "no events at all" in call(empty, tool, {})["no_data"], tool
            assert "rankecho agent" in call(empty, tool, {})["no_data"], tool


def test_diagnose_fails_plainly_without_agent_data(tmp_path: Path, store: Path) -> None:
    empty = diagnose("--db", str(build_store(tmp_path / "empty.db")))
    assert empty.returncode == 1 and "no events at all" in empty.stderr and "rankecho agent" in empty.stderr
    unknown = diagnose("--db", str(store), "--cluster-id", "typo")
    assert unknown.returncode == 1 and "mistyped" in unknown.stderr and "'synthetic'" in unknown.stderr
    assert "--cluster-id" in unknown.stderr and unknown.stdout == ""
    other = build_store(tmp_path / "other.db")
    with duckdb.connect(str(other)) as con:  # points from something that is not an agent (rankecho stress)
        con.execute(
            "INSERT INTO events_generic VALUES ('e1', 1796220000000000000, 0, 'metric', 'fanin', 'n1', 'm', "
            "NULL, NULL, 0.5, NULL, NULL, '{}')"
        )
    no_agent = diagnose("--db", str(other), "--json")
    assert no_agent.returncode == 1 and "no agent data" in no_agent.stderr
    error = json.loads(no_agent.stdout)
    assert error["exit_code"] == 1 and "'fanin' (1 events, no agent data)" in error["error"]
