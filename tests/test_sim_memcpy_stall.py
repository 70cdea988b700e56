"""The memcpy_stall fault: the rank spends ``ms`` in a blocking cudaMemcpy right before its step's first
collective, in both rank programs (run by the launcher, without agents); the ground truth names the cause
``memcpy_stall`` in ``stall_memcpy``, and a diagnosis naming find_stragglers' ``memcpy`` cause there is
scored right (sim/score.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rankecho.sim.faultsites import python_frames
from rankecho.sim.groundtruth import read_rank_logs
from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import ScenarioError, load_scenario, parse_scenario
from rankecho.sim.score import predictions_from, score

SCENARIO = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "format" / "memcpy-stall.yaml"
FIRES = list(range(2, 40, 5))


def test_memcpy_stall_takes_a_duration() -> None:
    base = {"cluster_id": "t", "nodes": [{"id": "n", "ranks": 2}]}
    with pytest.raises(ScenarioError, match=r"faults\[0\]: missing required key\(s\) \['ms'\]"):
        parse_scenario({**base, "faults": [{"rank": 1, "kind": "memcpy_stall"}]})
    with pytest.raises(ScenarioError, match="only a slow_link takes a factor"):
        parse_scenario({**base, "faults": [{"rank": 1, "kind": "memcpy_stall", "ms": 5, "factor": 2}]})


@pytest.mark.parametrize("program", ["c", "python"])
def test_memcpy_stall_delays_the_rank_in_cudamemcpy_at_its_steps(tmp_path: Path, program: str) -> None:
    s = dataclasses.replace(load_scenario(SCENARIO), program=program)
    run = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=120))
    assert run.returncode == 0 and run.truth is not None
    frame = "stall_memcpy" if program == "c" else python_frames()["memcpy_stall"]
    [fault] = run.truth["faults"]
    assert (fault["kind"], fault["function"], fault["frame"], fault["fired_steps"]) == (
        "memcpy_stall", "stall_memcpy", frame, FIRES)
    for step in run.truth["per_step"]:
        row = next(r for r in step["ranks"] if r["rank"] == 3)
        if step["step"] in FIRES:
            assert row["cause"] == "memcpy_stall" and row["entered_late_by_ms"] > 60, row
            assert [(i["kind"], i["ms"]) for i in row["injected"]] == [("memcpy_stall", 80.0)]
            # the copy is not the loader's or the allocator's time: the rank is late in the copy itself
            assert row["loader_ms"] < 40 and row["alloc_ms"] < 40
        else:
            assert row["cause"] is None
    # a diagnosis that names find_stragglers' memcpy cause at those episodes scores perfectly
    enters = {k["step"]: r["enter_ns"] for k in run.truth["per_step"] for r in k["ranks"] if r["rank"] == 3}
    diagnosis = {"clusters": [{"cluster_id": s.cluster_id, "reference_node": "node-a"}],
                 "stragglers": [{"cluster_id": s.cluster_id, "kind": "rank", "rank": 3, "episodes": [
                     {"cause": "memcpy", "timestamp_ns": enters[k]} for k in FIRES]}]}  # fmt: skip
    got = score(run.truth, predictions_from(run.truth, diagnosis))
    assert (got.precision, got.recall, got.cause_accuracy) == (1.0, 1.0, 1.0)
    assert len(read_rank_logs(tmp_path, s)[3].steps) == s.steps
