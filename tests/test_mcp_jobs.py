"""Jobs through the MCP tools and the CLI: fleet.cluster.jobs lists two jobs that ran on the same ranks
one after the other; every analysing tool takes job_id, defaults to the most recent job and names it;
``rankecho jobs --db`` and ``rankecho diagnose --job-id`` print the same."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_analysis_jobs import FIRST, SECOND, STEPS
from test_diagnosis_tools import REPO, build_store, call

from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.store.reader import Reader


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("jobs") / "echo.db", FIRST, SECOND)


@pytest.fixture(scope="module")
def inv(store: Path) -> Iterator[Investigation]:
    with duckdb.connect(str(store), read_only=True) as con:
        yield Investigation(Reader(con), load_rates())


def named(found: dict[str, Any]) -> list[int]:
    return [s["rank"] for s in found["stragglers"]]


def test_jobs_lists_both_newest_first_with_ranks_nodes_steps_and_stragglers(inv: Investigation) -> None:
    out = call(inv, "fleet.cluster.jobs", {})
    assert [j["job_id"] for j in out["jobs"]] == [SECOND.job_id, FIRST.job_id] and out["count"] == 2
    for job, straggler in zip(out["jobs"], (2, 5), strict=True):
        assert (job["ranks"], job["world_size"], job["nodes"], job["steps"]) == (8, 8, ["a", "b"], STEPS)
        assert job["first_ns"] < job["last_ns"] and job["first"].endswith("Z")
        assert job["stragglers"].startswith("1 straggler: ") and f"rank {straggler} on" in job["stragglers"]
    assert out["jobs"][1]["last_ns"] < out["jobs"][0]["first_ns"]  # one after the other


def test_every_tool_defaults_to_the_most_recent_job_and_takes_job_id(inv: Investigation) -> None:
    latest = call(inv, "fleet.cluster.find_stragglers", {})
    assert latest["job_id"] == SECOND.job_id and named(latest) == [2]
    first = call(inv, "fleet.cluster.find_stragglers", {"job_id": FIRST.job_id})
    assert first["job_id"] == FIRST.job_id and named(first) == [5]
    assert [e["step"] for e in first["stragglers"][0]["episodes"]] == FIRST.late_steps(5)
    episode = first["stragglers"][0]["episodes"][-1]
    # The synthetic jobs share comm ids, so a chain id names an instance of each: job_id picks one (an
    # agent's comm ids come from a fresh ncclUniqueId per job, so there the call alone decides).
    explained = call(inv, "fleet.cluster.explain_straggler", {
        "node_id": "b", "rank": 5, "causal_chain_id": episode["causal_chain_id"], "job_id": FIRST.job_id})
    assert explained["job_id"] == FIRST.job_id and explained["step"] == episode["step"]
    assert explained["late_by_ms"] >= 20 and explained["cause"] == "allocator"
    by_time = call(inv, "fleet.cluster.explain_straggler",
                   {"node_id": "b", "rank": 5, "timestamp_ns": episode["timestamp_ns"]})  # fmt: skip
    assert by_time["job_id"] == FIRST.job_id and by_time["step"] == episode["step"]
    assert call(inv, "fleet.cluster.get_cost", {})["job_id"] == SECOND.job_id
    cost = call(inv, "fleet.cluster.get_cost", {"job_id": FIRST.job_id})
    assert [s["rank"] for s in cost["stalls"]] == [5] and sum(r["gpus"] for r in cost["rows"]) == 8
    assert call(inv, "fleet.cluster.summary", {})["job_id"] == SECOND.job_id
    view = call(inv, "fleet.cluster.timeline", {"job_id": FIRST.job_id, "heatmap": True})
    assert view["job_id"] == FIRST.job_id and view["focus"]["straggler"]["rank"] == 5
    late = {c["rank"] for c in view["heatmap"] if c["late"]}
    assert late == {5}
    none = call(inv, "fleet.cluster.find_stragglers", {"job_id": "no-such-job"})
    assert none["job_id"] == "no-such-job" and none["stragglers"] == [] and none["no_data"]


def rankecho(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rankecho", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_rankecho_jobs_and_diagnose_job_id_from_a_store(store: Path) -> None:
    text = rankecho("jobs", "--db", str(store))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "2 jobs" and "torchelastic:second" in lines[3] and "torchelastic:first" in lines[4]
    as_json = json.loads(rankecho("jobs", "--db", str(store), "--json").stdout)
    assert [j["job_id"] for j in as_json["jobs"]] == [SECOND.job_id, FIRST.job_id]
    diagnosed = rankecho("diagnose", "--db", str(store), "--job-id", FIRST.job_id)
    assert diagnosed.returncode == 0, diagnosed.stderr
    assert "job 'torchelastic:first'" in diagnosed.stdout and "rank 5 on b" in diagnosed.stdout
