"""Simulator pipeline stages and FSDP-like collectives: validated (settings that could never take effect are
refused with the fix), run by the C rank (send/recv between stages on a `pp` communicator), and recorded
in the ground truth with each send/recv pair's true transfer time (the ranks run through the launcher,
without agents)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import ScenarioError, parse_scenario

STEP = {"compute_ms": 6, "host_ms": 0.2, "dataloader_ms": 0.2, "allreduce_mb": 1}


def scenario(
    step: dict[str, Any], nodes: int = 3, faults: list[dict[str, Any]] | None = None, **extra: Any
) -> Any:
    layout = [{"id": f"n{i}", "ranks": 2} for i in range(nodes)] or [{"id": "solo", "ranks": 1}]
    raw = {
        "cluster_id": "t-pp",
        "steps": 8,
        "step": {**STEP, **step},
        "faults": faults or [],
        "nodes": layout,
        **extra,
    }
    return parse_scenario(raw, "pipeline")


@pytest.mark.parametrize(
    ("step", "extra", "message"),
    [
        ({"pipeline_stages": 4}, {}, "4 does not divide the world size 6; pick one of [2, 3, 6]"),
        ({"activation_mb": 8}, {}, "there is no pipeline to carry it; set step.pipeline_stages >= 2"),
        ({"pipeline_stages": 1, "activation_mb": 8}, {}, "set step.pipeline_stages >= 2"),
        ({"pipeline_stages": 0}, {}, "must be >= 1"),
        ({"allgather_mb": 0}, {}, "must be > 0"),
        ({"pipeline_stages": 3}, {"program": "python"}, "only the C rank simulates pipeline stages"),
        ({"reducescatter_mb": 4}, {"program": "python"}, "use program: c"),
        ({"allgather_mb": 4}, {"nodes": 0}, "a one-rank world gathers"),
        ({"pipeline_stages": 3}, {"communicators": [{"name": "pp", "group_size": 2}]}, "pick another name"),
    ],
)
def test_pipeline_settings_that_cannot_take_effect_are_refused_with_the_fix(
    step: dict[str, Any], extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ScenarioError) as e:
        scenario(step, **extra)
    assert message in str(e.value)


def test_stages_pairs_and_options() -> None:
    s = scenario({"pipeline_stages": 3, "activation_mb": 8, "allgather_mb": 4, "reducescatter_mb": 2})
    from rankecho.sim.scenario_pipeline import pipeline_argv, pipeline_truth

    assert pipeline_argv(s) == [
        "--pipeline",
        "3:8388608",
        "--allgather-bytes",
        "4194304",
        "--reducescatter-bytes",
        "2097152",
    ]
    truth = pipeline_truth(s)
    assert truth is not None and truth["stage_ranks"] == [[0, 1], [2, 3], [4, 5]]
    pairs = [(p["src"], p["dst"], p["direction"]) for p in truth["pairs"]]
    assert pairs == [
        (0, 2, "forward"),
        (1, 3, "forward"),
        (2, 4, "forward"),
        (3, 5, "forward"),
        (2, 0, "backward"),
        (3, 1, "backward"),
        (4, 2, "backward"),
        (5, 3, "backward"),
    ]
    # 8 MiB at the fake libnccl's 80 GB/s plus its 20 us latency
    assert truth["pairs"][0]["transfer_ms"] == pytest.approx(0.02 + 8 * 2**20 / 80e6, abs=0.001)
    assert pipeline_truth(scenario({})) is None


def enter_late(truth: dict[str, Any], step: int) -> dict[int, float]:
    """Each rank's lateness (ms) at the step's first world all-reduce."""
    return {
        r["rank"]: r["entered_late_by_ms"] for s in truth["per_step"] if s["step"] == step for r in s["ranks"]
    }


def test_a_slow_rank_link_slows_the_pipeline_pairs_it_is_in(tmp_path: Path) -> None:
    # Rank 3 (stage 1 of 3, node n1) at 1/40 on odd steps: its pairs with 1 and 5 move 32 MiB each way in
    # 0.44 ms, slowed 17 ms; the ground truth lists exactly those four pairs as slowed.
    s = scenario(
        {"pipeline_stages": 3, "activation_mb": 32, "allgather_mb": 2, "reducescatter_mb": 2},
        faults=[{"kind": "slow_link", "rank": 3, "factor": 40, "every": 2, "start_step": 1}],
    )
    result = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=60))
    assert result.returncode == 0 and result.truth is not None
    truth = result.truth
    assert truth["pipeline"]["stages"] == 3
    pp = [c for c in truth["communicators"] if c["name"] == "pp"]
    assert sorted(c["members"] for c in pp) == [[0, 2, 4], [1, 3, 5]]
    [link] = truth["links"]
    assert link["steps"] == [1, 3, 5, 7]
    [slowed] = [c for c in link["communicators"] if c["name"] == "pp"]
    assert sorted((p["src"], p["dst"]) for p in slowed["pairs"]) == [(1, 3), (3, 1), (3, 5), (5, 3)]
    assert all(
        p["slow_transfer_ms"] == pytest.approx(40 * p["transfer_ms"], rel=0.05) for p in slowed["pairs"]
    )
    # The pipeline {1, 3, 5} waits on rank 3's pairs (~2 x 17 ms, forward and backward) before the world
    # all-reduce; the pipeline {0, 2, 4} does not, so there its ranks are the early ones.
    for k in (1, 3, 5, 7):
        late = enter_late(truth, k)
        assert min(late[r] for r in (1, 3, 5)) - max(late[r] for r in (0, 2, 4)) > 25, (k, late)
    for k in (2, 4, 6):
        assert max(abs(v) for v in enter_late(truth, k).values()) < 10
