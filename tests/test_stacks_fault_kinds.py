"""Issue 23's acceptance: on the seed scenario and for each fault kind, a short run of the scenario with
real agents into a real Echo, on the C rank program and on the Python one (sim/pyrank.py);
find_stragglers' cause for the planted rank names, in its leading frames, the frame the ground truth
says the fault ran in (sim/faultsites.py): the C function, or the Python function and line."""

from __future__ import annotations

import ast
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
PYRANK = SCENARIOS.parent / "pyrank.py"
STEPS = {"seed-rank5": 50, "alloc-stall": 40, "dataloader-stall": 40, "host-compute": 40,
         "cpu-contention": 40, "slow-gpu": 40}
"""The seed scenario and one per fault kind, cut to four firings of the fault (steps 7, 21, 35, 49 of the
seed's; 5, 15, 25, 35 of the others): enough for a straggler, short enough to run."""
KINDS = list(STEPS)


@pytest.fixture(scope="module", params=["c", "python"])
def found(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, Any]]:
    """Every scenario run on one rank program (the C one, then sim/pyrank.py), into one Echo."""
    sim_built()
    program = request.param
    tmp = tmp_path_factory.mktemp(f"stack-kinds-{program}")
    out: dict[str, Any] = {}
    with inproc_echo(tmp / "echo.db") as echo:
        for name in KINDS:
            scenario = dataclasses.replace(load_scenario(SCENARIOS / f"{name}.yaml"), steps=STEPS[name],
                                           program=program)
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
    assert lead is not None, top["cause"]
    frames = lead.split(" <- ")
    if ":" not in fault["frame"]:  # the C rank: the function
        assert fault["frame"] in frames, (fault, top["cause"])
        return
    # The Python rank: pyrank.py:<function>:<line>, the line one of that function's own (the truth names
    # where the fault spends its time; a preempted rank may be caught at the call just before it).
    file, function, _ = fault["frame"].split(":")
    mine = [f for f in frames if f.startswith(f"{file}:{function}:")]
    assert mine, (fault, top["cause"])
    assert int(mine[0].rsplit(":", 1)[1]) in function_lines(function), (mine, fault)


def function_lines(name: str) -> range:
    """The lines of sim/pyrank.py's function ``name``."""
    tree = ast.parse(PYRANK.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    return range(node.lineno, (node.end_lineno or node.lineno) + 1)


def test_stacks_are_stored_once_per_distinct_stack_not_per_event(found: dict[str, Any]) -> None:
    """Six jobs, thousands of collectives and intervals citing stacks: a stack is shipped once per agent
    (node) and stored once, so the table grows with distinct stacks, not with events."""
    counts = found["counts"]
    assert counts["cited"] > 2000, counts
    assert counts["stacks"] <= counts["points"] and counts["stacks"] * 10 < counts["cited"], counts
