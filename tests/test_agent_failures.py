"""Hangs, crashes and desyncs end to end: the scenarios of sim/scenarios/failures run with one real agent
per node into a real Echo, and fleet.cluster.find_hangs names each failure with the right rank (the hang
while the job is stuck), and nothing on the healthy control."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN
from test_agent_helpers import requires_ebpf, sim_built

from rankecho.agent.tracker import PENDING_TIMEOUT_NS
from rankecho.echo.app import Echo
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.sim.hang_watch import HangWatch
from rankecho.sim.launcher import LaunchOptions, RunResult, run_scenario
from rankecho.sim.scenario import Scenario, load_scenario
from rankecho.sim.score_failures import score_failures

pytestmark = [requires_ebpf, pytest.mark.ebpf]

SCENARIOS = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "failures"
HANG_OPEN_S = 3.0
SETTLED_S = PENDING_TIMEOUT_NS / 1e9 + 2
"""An answer that has not changed for one agent pending timeout (plus a poll) has every node's calls."""
"""The hang threshold the test asks for (the job's own is max(20 s, 8 steps)): the ranks that entered
show up ~10 s after the hang (the agent's pending timeout), so this keeps the test short."""


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Echo]:
    sim_built()
    with inproc_echo(tmp_path_factory.mktemp("failures") / "echo.db") as e:
        yield e


def run(echo: Echo, name: str, tmp: Path, timeout_s: float = 60) -> tuple[Scenario, RunResult]:
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    opts = LaunchOptions(run_dir=tmp, agent_endpoint=echo.grpc_address, token=TEST_TOKEN, timeout_s=timeout_s,
                         progress=None)  # fmt: skip
    return scenario, run_scenario(scenario, opts)


def failures(echo: Echo, cluster_id: str, **kw: Any) -> dict[str, Any]:
    return Investigation(echo.reader, load_rates()).failures.find_hangs(cluster_id=cluster_id, **kw)


def test_healthy_control_names_nothing(echo: Echo, tmp_path: Path) -> None:
    scenario, result = run(echo, "healthy", tmp_path)
    assert result.returncode == 0
    found = failures(echo, scenario.cluster_id, min_open_s=HANG_OPEN_S)
    assert (found["hangs"], found["crashes"], found["desyncs"]) == ([], [], []), found
    assert result.truth is not None and score_failures(result.truth, found).ok


def test_crash_names_the_first_rank_to_exit_with_its_status(echo: Echo, tmp_path: Path) -> None:
    scenario, result = run(echo, "crash", tmp_path)
    assert result.returncode == 1 and result.truth is not None
    assert result.truth["failures"] == [{"kind": "crash", "rank": 2, "step": 3, "status": 7}]
    found = failures(echo, scenario.cluster_id)
    first = [c for c in found["crashes"] if c["first"]]
    assert [(c["rank"], c["status"]) for c in first] == [(2, 7)], found
    assert {c["status"] for c in found["crashes"] if not c["first"]} <= {70}  # its peers' aborts, later
    assert found["hangs"] == [] and found["desyncs"] == []
    assert score_failures(result.truth, found).right == ("crashes",)


def test_desync_names_the_rank_with_the_other_byte_count(echo: Echo, tmp_path: Path) -> None:
    scenario, result = run(echo, "desync", tmp_path)
    assert result.returncode == 1 and result.truth is not None
    assert result.truth["failures"] == [{"kind": "desync", "rank": 1, "step": 3}]
    found = failures(echo, scenario.cluster_id)
    [desync] = found["desyncs"]
    assert desync["first_rank"] == 1, found
    assert [c["bytes"] for c in desync["odd_calls"]] == [2 * desync["usual"]["bytes"]]
    assert found["crashes"] == [] and found["hangs"] == []  # the aborts are the desync's consequence
    assert score_failures(result.truth, found).right == ("desyncs",)


def test_hang_is_named_live_with_the_missing_rank(echo: Echo, tmp_path: Path) -> None:
    """While the job is stuck a watcher asks until the hang is named and its answer has settled, then
    kills the hung rank to end the run (rankecho.sim.hang_watch, shared with rankecho evaluate)."""
    scenario = load_scenario(SCENARIOS / "hang.yaml")
    started = time.monotonic()
    ask = functools.partial(failures, echo, scenario.cluster_id, min_open_s=HANG_OPEN_S)
    with HangWatch(ask, tmp_path, scenario, settle_s=SETTLED_S) as watch:
        _, result = run(echo, "hang", tmp_path, timeout_s=90)
    seen = watch.answer
    assert result.truth is not None
    assert result.truth["failures"] == [{"kind": "hang", "rank": 3, "step": 3, "ms": None}]
    assert seen, f"no hang named within {time.monotonic() - started:.0f} s"
    score = score_failures(result.truth, seen, watch.first_named_ns)
    assert (score.right, score.false_alarms) == (("hangs",), ()), score
    assert {tuple(h["missing"]) for h in seen["hangs"]} == {(3,)}, seen
    world = [h for h in seen["hangs"] if h["entered"] == [0, 1, 2]]
    assert world, seen  # the world all-reduce: ranks 0-2 entered, rank 3 never did
    # What rank 3 is stuck in, from its agent's heartbeat: asleep in ppoll() inside the sim's hang_rank,
    # off the CPU since before the instance the others wait in opened, in no traced call.
    [doing] = world[0]["doing"]
    assert (doing["rank"], doing["node_id"], doing["sleeping"], doing["call"]) == (3, "node-b", True, None), (
        doing
    )
    # A state goes out once the rank is quiet for a heartbeat (5 s); the sim's endless hang sleeps in a
    # loop of 1 s ppoll() calls, so the current off-CPU interval is at most ~1 s old.
    assert doing["quiet_s"] >= 5.0 and 0 <= doing["off_cpu_s"] <= 5.0, doing
    # ... but its last heartbeat (5 s) went mostly asleep: the loop's wake-ups are short.
    assert doing["recent_by_class_s"]["sleeping"] >= 0.6 * doing["recent_s"], doing
    assert "hang_rank" in (doing["leading_frames"] or ""), doing
    assert doing["summary"] in world[0]["summary"]
    assert seen["crashes"] == [] and seen["desyncs"] == []
