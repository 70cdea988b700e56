"""Simulator failure faults: hang, crash and desync are validated, really happen, and the ground truth
records them (the processes run through the launcher, without agents)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import ScenarioError, load_scenario, parse_scenario

STEP = {"compute_ms": 6, "host_ms": 0.2, "dataloader_ms": 0.2, "allreduce_mb": 1}


def scenario(faults: list[dict[str, Any]], steps: int = 5, **extra: Any) -> Any:
    raw = {"cluster_id": "t-fail", "steps": steps, "step": STEP, "faults": faults,
           "nodes": [{"id": "n0", "ranks": 2}, {"id": "n1", "ranks": 2}], **extra}  # fmt: skip
    return parse_scenario(raw, "failures")


@pytest.mark.parametrize(
    ("faults", "extra", "message"),
    [
        ([{"kind": "crash", "rank": 1, "ms": 5}], {}, "faults[0].ms: a crash takes no duration; set status"),
        ([{"kind": "desync", "rank": 1, "every": 2}], {}, "faults[0].every: a desync fires once"),
        ([{"kind": "hang", "rank": 1, "jitter": 2}], {}, "faults[0].jitter: a hang fires once"),
        ([{"kind": "crash", "rank": 1, "status": 0}], {}, "faults[0].status: must be >= 1"),
        ([{"kind": "crash", "rank": 1, "status": 300}], {}, "pick 1..255"),
        ([{"kind": "host_compute", "rank": 1, "ms": 5, "status": 2}], {}, "only a crash has an exit status"),
        ([{"kind": "host_compute", "rank": 1}], {}, "missing required key(s) ['ms']"),
        (
            [{"kind": "crash", "rank": 1, "start_step": 2},
             {"kind": "host_compute", "rank": 1, "ms": 9, "start_step": 3}],
            {},
            "faults[1].start_step: 3 comes after faults[0] (crash) at step 2 ends its rank",
        ),
        (
            [{"kind": "hang", "node": "n1", "ms": "forever", "start_step": 2}],
            {"agent_start_after_step": 3},
            "agent_start_after_step: 3 for n0 waits for every rank to finish step 3",
        ),
    ],
)
def test_settings_that_cannot_take_effect_are_refused_with_the_fix(
    faults: list[dict[str, Any]], extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ScenarioError) as e:
        scenario(faults, **extra)
    assert message in str(e.value)


def test_failure_faults_parse_to_simrank_specs() -> None:
    s = scenario([{"kind": "hang", "rank": 1, "start_step": 2}, {"kind": "hang", "rank": 2, "ms": 300},
                  {"kind": "crash", "rank": 3, "status": 7, "start_step": 1},
                  {"kind": "desync", "rank": 0, "start_step": 1}])  # fmt: skip
    assert [f.spec() for f in s.faults] == ["hang:0.0:1:2:0.0", "hang:300.0:1:0:0.0", "crash:7:1:1:0.0",
                                            "desync:0.0:1:1:0.0"]  # fmt: skip
    assert [f.ends_rank for f in s.faults] == [True, False, True, False]
    assert [f.fires_at(3) for f in s.faults] == [False, False, False, False]
    # A fault on the rank before its crash is fine; a fault on another rank after it too.
    scenario([{"kind": "host_compute", "rank": 3, "ms": 5}, {"kind": "crash", "rank": 3, "start_step": 3},
              {"kind": "host_compute", "rank": 2, "ms": 5, "start_step": 4}])  # fmt: skip


def test_crash_exits_with_its_status_and_the_truth_names_it(tmp_path: Path) -> None:
    s = scenario([{"kind": "crash", "rank": 2, "status": 7, "start_step": 2}])
    result = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=60))
    assert result.returncode == 1
    truth = result.truth
    assert truth is not None
    assert truth["failures"] == [{"kind": "crash", "rank": 2, "step": 2, "status": 7}]
    assert truth["faults"][0]["status"] == 7
    assert [s["step"] for s in truth["per_step"]] == [0, 1]  # nobody finished the crash's step
    assert not any(r["finished"] for r in truth["ranks"])


def test_desync_aborts_the_job_and_the_truth_names_the_rank(tmp_path: Path) -> None:
    s = scenario([{"kind": "desync", "rank": 1, "start_step": 3}])
    result = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=60))
    assert result.returncode == 1
    assert result.truth is not None
    assert result.truth["failures"] == [{"kind": "desync", "rank": 1, "step": 3}]
    hub_errors = "".join(p.read_text() for p in tmp_path.glob("n*/rank*.stderr"))
    assert "33554432 bytes" not in hub_errors  # 1 MiB buckets: the desync doubles it to 2 MiB
    assert "(2097152 bytes)" in hub_errors and "(1048576 bytes)" in hub_errors


def test_timed_hang_delays_its_rank_and_the_job_finishes(tmp_path: Path) -> None:
    s = scenario([{"kind": "hang", "rank": 3, "ms": 400, "start_step": 2}], straggler_threshold_ms=200)
    result = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=60))
    assert result.returncode == 0
    truth = result.truth
    assert truth is not None
    assert truth["failures"] == [{"kind": "hang", "rank": 3, "step": 2, "ms": 400.0}]
    assert [(x["rank"], x["cause"]) for x in truth["per_step"][2]["stragglers"]] == [(3, "hang")]


def test_hang_for_good_stops_the_rank_until_killed(tmp_path: Path) -> None:
    s = scenario([{"kind": "hang", "rank": 0, "start_step": 1}])
    result = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=4))
    assert result.returncode == 1  # the run's timeout ended it
    assert result.truth is not None
    assert result.truth["failures"] == [{"kind": "hang", "rank": 0, "step": 1, "ms": None}]
    assert [s["step"] for s in result.truth["per_step"]] == [0]


def test_the_failure_set_has_each_kind_on_several_seeds_and_layouts_and_controls_without_one() -> None:
    """sim/scenarios/failures, scored by rankecho evaluate: each file plants the one failure its name says
    (a control none), and each kind is planted on at least two seeds and node layouts."""
    found: dict[str, set[tuple[int, tuple[int, ...]]]] = {}
    failures = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "failures"
    for path in sorted(failures.glob("*.yaml")):
        s = load_scenario(path)
        kinds = [f.kind for f in s.faults]
        if path.stem.startswith("healthy"):
            assert kinds == [], path.name
            continue
        assert kinds == [path.stem.split("-")[0]], path.name
        found.setdefault(kinds[0], set()).add((s.seed, tuple(n.ranks for n in s.nodes)))
    assert found.keys() == {"hang", "crash", "desync"}
    for kind, runs in found.items():
        assert len({seed for seed, _ in runs}) >= 2 and len({layout for _, layout in runs}) >= 2, kind
