"""Simulated node clocks that drift and step (sim/clocks.py, agent/clock.py): settings that could never take
effect are refused with the fix; the agent's clock model and the ground truth's agree; the launcher steps
a node's clock once every rank has finished the chosen step and writes the true offsets (no agents here;
tests/test_agent_clocks.py runs real ones)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from rankecho.agent.clock import ClockConverter, ClockStepFile
from rankecho.sim.agents import AgentSpec, agent_argv
from rankecho.sim.clocks import offset_ns
from rankecho.sim.groundtruth import read_rank_logs
from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import ScenarioError, load_scenario, parse_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "format" / "clock-drift.yaml"
S = 1_000_000_000


def scenario(**node: Any) -> Any:
    nodes = [{"id": "a", "ranks": 1}, {"id": "b", "ranks": 1, **node}]
    return parse_scenario({"cluster_id": "t", "steps": 10, "nodes": nodes})


@pytest.mark.parametrize(
    ("node", "msg"),
    [
        ({"clock_drift_ppm": 0}, "nodes[1].clock_drift_ppm: 0 ppm is none or out of range"),
        ({"clock_drift_ppm": 5000}, "pick a non-zero value in -1000..1000"),
        ({"clock_step": {"at_step": 3, "ms": 0}}, "clock_step.ms: a 0 ms step changes nothing"),
        ({"clock_step": {"at_step": 3}}, "nodes[1].clock_step: missing required key(s) ['ms']"),
        ({"clock_step": {"at_step": 3, "ms": 5, "when": 1}}, "unknown key(s) ['when']"),
        ({"clock_step": {"at_step": 10, "ms": 5}}, "at_step: 10 leaves no step to run on the stepped clock"),
        ({"clock_step": {"at_step": 0, "ms": 5}}, "is a constant offset; use clock_offset_ms"),
    ],
)
def test_clock_settings_that_do_nothing_are_refused(node: dict[str, Any], msg: str) -> None:
    with pytest.raises(ScenarioError) as e:
        scenario(**node)
    assert msg in str(e.value)


def test_the_agent_applies_the_offset_the_ground_truth_computes(tmp_path: Path) -> None:
    node = scenario(clock_offset_ms=3, clock_drift_ppm=-250, clock_step={"at_step": 4, "ms": 40}).nodes[1]
    epoch, boot = 1_700_000_000 * S, 1_700_000_100 * S
    mono = [0]
    clock = ClockConverter(extra_offset_ns=node.clock_offset_ns, realtime=lambda: boot + mono[0],
                           monotonic=lambda: mono[0], drift_ppm=node.clock_drift_ppm,
                           drift_epoch_ns=epoch)  # fmt: skip
    assert clock.to_unix(0) == boot + 3_000_000 - 25_000_000  # 100 s after the epoch at -250 ppm: -25 ms
    step_file = ClockStepFile(str(tmp_path / "clock-step"))
    assert not step_file.poll(clock)  # nothing asked yet
    mono[0] = 5 * S
    (tmp_path / "clock-step").write_text("40.0\n")
    assert step_file.poll(clock) and not step_file.poll(clock)  # applied once
    applied = int((tmp_path / "clock-step.applied").read_text())
    assert applied == boot + 5 * S
    for t in (0, 4 * S, 5 * S, 9 * S):  # before and after the step
        assert clock.to_unix(t) - (boot + t) == offset_ns(node, epoch, applied, boot + t)
    assert clock.to_unix(9 * S) - clock.to_unix(4 * S) == 5 * S + 40_000_000 - 1_250_000


def test_the_agent_gets_its_clock_options_only_when_the_node_drifts_or_steps(tmp_path: Path) -> None:
    s = load_scenario(SCENARIO)
    spec = AgentSpec("127.0.0.1:4317", s.cluster_id, None, "python", clock_epoch_ns=123)
    a, b = (agent_argv(spec, n, tmp_path / "lib", tmp_path / n.id / "agent.ready") for n in s.nodes)
    assert "--clock-drift-ppm" not in a and "--clock-step-file" not in a
    step_file = str(tmp_path / "node-b" / "clock-step")
    assert b[b.index("--clock-drift-ppm"):][:6] == ["--clock-drift-ppm", "500", "--clock-epoch-ns", "123",
                                                    "--clock-step-file", step_file]


def test_the_launcher_steps_the_clock_after_its_step_and_writes_the_true_offsets(tmp_path: Path) -> None:
    s = load_scenario(SCENARIO).with_steps(40)
    run = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=120))
    assert run.returncode == 0 and run.truth is not None
    a, b = run.truth["nodes"]
    assert "offsets" not in a and a["clock_offset_ns"] == 0  # a constant clock: as before
    step = b["clock_step"]
    assert (b["clock_drift_ppm"], step["at_step"], step["ms"], step["applied_ns"]) == (500.0, 20, 40.0, None)
    logs = read_rank_logs(tmp_path, s)
    completed_20 = max(next(r.end_ns for r in log.steps if r.step == 19) for log in logs.values())
    assert step["requested_ns"] >= completed_20  # only once every rank completed 20 steps (0..19)
    assert (tmp_path / "node-b" / "clock-step").read_text() == "40.0\n"
    offsets = [o["offset_ns"] for o in b["offsets"]]
    assert [o["step"] for o in b["offsets"]] == list(range(40))
    jumps = [y - x for x, y in itertools.pairwise(offsets)]
    assert offsets[0] >= 3_000_000 and min(jumps) >= 0
    assert sum(j > 30_000_000 for j in jumps) == 1  # the one step of 40 ms, the rest 500 ppm of a step
    assert max(j for j in jumps if j < 30_000_000) < 100_000
