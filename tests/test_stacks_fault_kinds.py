"""Issue 23's acceptance on the C rank: on the seed scenario and for each fault kind, a short run of the
scenario with real agents into a real Echo; find_stragglers' cause for the planted rank names, in its
leading frames, the function the ground truth says the fault ran in (sim/faultsites.py). The Python
rank's allocator case is in test_sim_pyrank_diagnosis.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, row_dicts
from test_agent_helpers import requires_ebpf, sim_built

from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import load_scenario

pytestmark = [requires_ebpf, pytest.mark.ebpf]

SCENARIOS = Path(__file__).resolve().parent.parent / "sim" / "scenarios"
STEPS = {"seed-rank5": 50, "alloc-stall": 40, "dataloader-stall": 40, "host-compute": 40,
         "cpu-contention": 40, "slow-gpu": 40}
"""The seed scenario and one per fault kind, cut to four firings of the fault (steps 7, 21, 35, 49 of the
seed's; 5, 15, 25, 35 of the others): enough for a straggler, short enough to run."""
KINDS = list(STEPS)


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    sim_built()
    tmp = tmp_path_factory.mktemp("stack-kinds")
    out: dict[str, Any] = {}
    with inproc_echo(tmp / "echo.db") as echo:
        for name in KINDS:
            scenario = dataclasses.replace(load_scenario(SCENARIOS / f"{name}.yaml"), steps=STEPS[name])
            opts = LaunchOptions(run_dir=tmp / name, agent_endpoint=echo.grpc_address, token=TEST_TOKEN,
                                 timeout_s=240, progress=None)  # fmt: skip
            result = run_scenario(scenario, opts)
            assert result.returncode == 0 and result.truth is not None, name
            answer = Investigation(echo.reader, load_rates()).diagnosis.find_stragglers(
                cluster_id=scenario.cluster_id
            )
            out[name] = {"truth": result.truth, "answer": answer}
        out["counts"] = row_dicts(echo, """
            SELECT (SELECT count(*) FROM stacks) AS stacks,
                   (SELECT count(stack_id) FROM collectives)
                       + (SELECT count(stack_id) FROM host_activity) AS cited,
                   (SELECT count(*) FROM events WHERE metric_name = 'rankecho.stack') AS points""")[0]
        yield out


@pytest.mark.parametrize("name", KINDS)
def test_the_cause_names_the_function_the_fault_ran_in(found: dict[str, Any], name: str) -> None:
    truth, answer = found[name]["truth"], found[name]["answer"]
    [fault] = truth["faults"]
    top = answer["stragglers"][0]
    assert top["rank"] == fault["rank"], [s["summary"] for s in answer["stragglers"]]
    lead = top["cause"]["leading_frames"]
    assert lead is not None and fault["function"] in lead.split(" <- "), (fault, top["cause"])


def test_stacks_are_stored_once_per_distinct_stack_not_per_event(found: dict[str, Any]) -> None:
    """Six jobs, thousands of collectives and intervals citing stacks: a stack is shipped once per agent
    (node) and stored once, so the table grows with distinct stacks, not with events."""
    counts = found["counts"]
    assert counts["cited"] > 2000, counts
    assert counts["stacks"] <= counts["points"] and counts["stacks"] * 10 < counts["cited"], counts
