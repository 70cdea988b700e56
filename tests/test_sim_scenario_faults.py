"""When and where a simulated fault fires: ``end_step`` ends a periodic fault, ``steps`` lists its steps,
``comm``/``bucket`` choose the collective it strikes before. Settings that could never take effect are
refused with the fix; the rank programs (run by the launcher, without agents) fire each fault at exactly its
steps and collective, and the ground truth lists those steps and the lateness there."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import ScenarioError, load_scenario, parse_scenario
from rankecho.sim.score import predictions_from, score

FORMAT = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "format"


def scenario(faults: list[dict[str, Any]], steps: int = 20) -> Any:
    raw = {"cluster_id": "t-sched", "steps": steps, "faults": faults,
           "nodes": [{"id": "n0", "ranks": 2}, {"id": "n1", "ranks": 2}]}  # fmt: skip
    return parse_scenario(raw, "sched")


DELAY = {"rank": 1, "kind": "host_compute", "ms": 10}


@pytest.mark.parametrize(
    ("fault", "msg"),
    [
        ({**DELAY, "start_step": 5, "end_step": 3}, "end_step: 3 is before start_step 5, so the fault"),
        ({**DELAY, "end_step": 19}, "the fault runs to the end anyway; drop end_step or use one < 19"),
        ({**DELAY, "end_step": 40}, "end_step: 40 is not before the last step (19)"),
        ({**DELAY, "steps": [3, 30, 25]}, "step(s) [30, 25] are past the last step (19) and would"),
        ({**DELAY, "steps": [3], "every": 2}, "replaces start_step/every/end_step; remove ['every']"),
        ({**DELAY, "steps": [3], "start_step": 3, "end_step": 9}, "remove ['start_step', 'end_step']"),
        ({**DELAY, "steps": []}, "steps: need a list of 1..64 steps"),
        ({**DELAY, "steps": 4}, "steps: need a list of 1..64 steps"),
        ({**DELAY, "steps": [2, 7, 2]}, "step(s) [2] listed twice; list each step once"),
        ({**DELAY, "steps": [2, -1]}, "steps[1]: must be >= 0"),
        ({**DELAY, "start_step": 20}, "start_step: 20 is past the last step (19)"),
        ({"rank": 1, "kind": "crash", "start_step": 2, "end_step": 5}, "a crash fires once, at start_step"),
        ({"rank": 1, "kind": "hang", "steps": [2]}, "a hang fires once, at start_step; remove steps"),
    ],
)
def test_schedules_that_cannot_take_effect_are_refused_with_the_fix(fault: dict[str, Any], msg: str) -> None:
    with pytest.raises(ScenarioError) as e:
        scenario([fault])
    assert msg in str(e.value)


def test_end_step_and_listed_steps_fire_where_they_say() -> None:
    s = scenario([{**DELAY, "every": 4, "start_step": 2, "end_step": 10},
                  {**DELAY, "steps": [9, 1, 4]},
                  {"node": "n1", "kind": "slow_link", "factor": 2, "start_step": 3, "end_step": 5},
                  {**DELAY, "every": 5}])  # fmt: skip
    assert [f.fire_steps(20) for f in s.faults] == [[2, 6, 10], [1, 4, 9], [3, 4, 5], [0, 5, 10, 15]]
    assert [f.spec() for f in s.faults] == [
        "host_compute:10.0:4:2:0.0:10",
        "host_compute:10.0:1:1:0.0:-1:1,4,9",
        "slow_nic:2.0:1:3:0:5",
        "host_compute:10.0:5:0:0.0",  # no schedule tail: the rank programs read the old form unchanged
    ]


def test_a_fault_listed_after_a_crash_is_refused_by_its_first_step() -> None:
    with pytest.raises(ScenarioError) as e:
        scenario([{"rank": 1, "kind": "crash", "start_step": 4}, {**DELAY, "steps": [6, 8]}])
    assert "faults[1].start_step: 6 comes after faults[0] (crash) at step 4 ends its rank" in str(e.value)
    scenario([{"rank": 1, "kind": "crash", "start_step": 4}, {**DELAY, "steps": [2, 8]}])  # fires first: fine


@pytest.mark.parametrize("program", ["c", "python"])
def test_the_rank_programs_fire_each_fault_at_exactly_its_steps(tmp_path: Path, program: str) -> None:
    s = load_scenario(FORMAT / "fault-schedules.yaml")
    if program == "python":  # slow_link is the C rank's only: keep the two delays
        s = dataclasses.replace(s, program="python", faults=s.faults[:2])
    run = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=120))
    assert run.returncode == 0 and run.truth is not None
    expected = {"host_compute": [1, 4, 7, 10], "dataloader_stall": [5, 6, 15], "slow_link": [12, 13, 14]}
    for f in run.truth["faults"]:
        assert f["fired_steps"] == expected[f["kind"]], f
    assert run.truth["faults"][1]["steps"] == [5, 6, 15] and run.truth["faults"][0]["end_step"] == 10
    for rank, kind in ((1, "host_compute"), (2, "dataloader_stall")):
        mine = [(k["step"], r) for k in run.truth["per_step"] for r in k["ranks"] if r["rank"] == rank]
        causes = {step: r["cause"] for step, r in mine}
        assert [k for k, c in sorted(causes.items()) if c] == expected[kind]
        assert {causes[k] for k in expected[kind]} == {kind}
        late = {step: r["entered_late_by_ms"] for step, r in mine}
        assert all(late[k] > 40 for k in expected[kind])  # 60 ms injected: really late at those steps
    if program == "c":
        [link] = run.truth["links"]
        assert link["steps"] == expected["slow_link"]


SPLIT = [{"name": "tp", "group_size": 2}]


@pytest.mark.parametrize(
    ("fault", "extra", "msg"),
    [
        ({**DELAY, "comm": "pp"}, {}, "faults[0].comm: 'pp' is not one of the communicators ['world', 'tp']"),
        ({**DELAY, "bucket": 2}, {"step": {"buckets": 2}}, "bucket: 2 is past the step's last bucket (1)"),
        ({**DELAY, "bucket": 0, "comm": "tp"}, {}, "only the world all-reduce is bucketed; remove bucket"),
        ({"rank": 1, "kind": "alloc_stall", "ms": 5, "comm": "tp"}, {}, "does not strike before a"),
        ({"rank": 1, "kind": "desync", "bucket": 0}, {}, "a desync does not strike before a collective"),
        ({**DELAY, "comm": 3}, {}, "comm: need a communicator name"),
        ({**DELAY, "comm": "tp"}, {"program": "python"}, "only the C rank simulates comm/bucket"),
    ],
)
def test_selectors_that_choose_no_collective_are_refused(fault: dict[str, Any], extra: dict[str, Any],
                                                         msg: str) -> None:  # fmt: skip
    raw = {"cluster_id": "t", "steps": 20, "faults": [fault], "communicators": SPLIT,
           "nodes": [{"id": "n0", "ranks": 2}, {"id": "n1", "ranks": 2}], **extra}  # fmt: skip
    with pytest.raises(ScenarioError) as e:
        parse_scenario(raw)
    assert msg in str(e.value)


def test_a_fault_strikes_before_the_collective_it_chose(tmp_path: Path) -> None:
    s = load_scenario(FORMAT / "collective-selectors.yaml")
    assert [f.spec(("tp",)) for f in s.faults] == ["host_compute:60.0:3:1:0.0:-1:-:-1:2",
                                                   "memcpy_stall:60.0:1:2:0.0:-1:2,8:0"]  # fmt: skip
    run = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=120))
    assert run.returncode == 0 and run.truth is not None
    bucket, tp = run.truth["faults"]
    assert (bucket["comm"], bucket["bucket"], bucket["fired_steps"]) == (None, 2, [1, 4, 7, 10])
    assert (tp["comm"], tp["bucket"], tp["fired_steps"]) == ("tp", None, [2, 8])
    for fault, rank, where in ((bucket, 1, ("world", 2)), (tp, 2, ("tp", 0))):
        assert [(e["step"], e["rank"], (e["comm"], e["bucket"])) for e in fault["late_at"]] == [
            (k, rank, where) for k in fault["fired_steps"]]
        assert all(e["late_by_ms"] > 25 for e in fault["late_at"]), fault["late_at"]
        # the step's first all-reduce came before the fault: the rank entered it on time
        first = [r["entered_late_by_ms"] for k in run.truth["per_step"] for r in k["ranks"]
                 if r["rank"] == rank and k["step"] in fault["fired_steps"]]  # fmt: skip
        assert max(first) < 30, first
        # ...yet it is a straggler of those steps, late at the collective its fault chose
        for k in run.truth["per_step"]:
            if k["step"] in fault["fired_steps"]:
                row = next(r for r in k["ranks"] if r["rank"] == rank)
                assert row["chosen_late_by_ms"] > 25 and rank in {x["rank"] for x in k["stragglers"]}
    # a diagnosis naming each episode at the late call scores perfectly (sim/score.py maps it to its step)
    diagnosis = {"clusters": [{"cluster_id": s.cluster_id, "reference_node": "node-a"}], "stragglers": [
        {"cluster_id": s.cluster_id, "kind": "rank", "rank": f["late_at"][0]["rank"], "episodes": [
            {"cause": cause, "timestamp_ns": e["call_ns"]} for e in f["late_at"]]}
        for f, cause in ((bucket, "host_compute"), (tp, "memcpy"))]}  # fmt: skip
    got = score(run.truth, predictions_from(run.truth, diagnosis))
    assert (got.true_positives, got.false_positives, got.false_negatives) == (6, 0, 0)
    assert got.cause_accuracy == 1.0


def test_the_evaluation_table_says_when_and_where_a_fault_fires() -> None:
    from rankecho.evaluate import describe

    text = {p.stem: describe(load_scenario(p)) for p in FORMAT.glob("*.yaml")}
    assert "host_compute 60 ms on rank 1 every 3 until step 10" in text["fault-schedules"]
    assert "dataloader_stall 60 ms on rank 2 at steps 5, 6, 15" in text["fault-schedules"]
    assert "on rank 1 every 3 before bucket 2; memcpy_stall 60 ms on rank 2 at steps 2, 8 before tp" in text[
        "collective-selectors"]
    assert "node-b:2 clock +3 ms drift +500 ppm clock step +40 ms after step 20" in text["clock-drift"]
    assert "step 6 ms + jitter 12/1/20 ms; no fault" in text["healthy-jitter"]


@pytest.mark.parametrize("tail", [":", ":-2", ":-1:x", ":-1:3,-4", ":-1:-:4", ":-1:-:-1:-3", ":-1:-:-1:0:9"])
def test_the_rank_program_refuses_a_malformed_schedule_tail(tail: str) -> None:
    spec = "host_compute:5:1:0:0" + tail
    build = Path(__file__).resolve().parent.parent / "sim" / "build"
    out = subprocess.run([str(build / "simrank"), "--steps", "1", "--fault", spec], capture_output=True,
                         text=True, timeout=30, env={"LD_LIBRARY_PATH": str(build)})  # fmt: skip
    assert out.returncode == 2 and f"bad --fault {spec}" in out.stderr
