"""rankecho evaluate's failures table and verdict on hand-made results: a failure scenario is in the
failures table only (the straggler table keeps the others and their numbers), a hang named late or a
failure named on a straggler scenario misses a target, and a scenario's failures are described in words."""

from __future__ import annotations

import json

from rankecho.evaluate import ScenarioResult, all_verdicts, markdown, results_json, tables
from rankecho.evaluate_failures import describe_fault
from rankecho.sim.scenario import Fault
from rankecho.sim.score_failures import FailureScore


def result(name: str, failures: FailureScore, failure_scenario: bool) -> ScenarioResult:
    return ScenarioResult(
        name, f"{name} in words", 0, 0, 0, 0, 0, [], [], 20.0, None, 1.0,
        failures=failures, failure_scenario=failure_scenario,
    )  # fmt: skip


HANG_LATE = FailureScore(("hangs",), ("hangs",), (), (), ("hang: named after 31.0 s > 30 s",), 31.0, 30.0)
CRASH_RIGHT = FailureScore(("crashes",), ("crashes",), ("crashes",))


def test_failure_scenarios_leave_the_straggler_table_and_misses_are_verdicts() -> None:
    results = [
        result("hang", HANG_LATE, True),
        result("crash", CRASH_RIGHT, True),
        result("straggler", FailureScore(false_alarms=("hangs: 1 named",)), False),
    ]
    text = tables(results)
    assert markdown([results[2]]) in text  # the straggler table: that scenario alone
    late = "hang: named after 31.0 s > 30 s"
    assert f"| hang | hang in words | hangs | - | none | {late} | 31.0 s (limit 30 s) |" in text
    assert "| crash | crash in words | crashes | crashes | none | - | - |" in text
    assert "| straggler | straggler in words | none | - | hangs: 1 named | - | - |" in text
    assert all_verdicts(results) == [
        "hang: hang: named after 31.0 s > 30 s", "straggler: false alarm hangs: 1 named",
    ]  # fmt: skip


def test_all_right_meets_every_target_and_unnamed_failures_are_misses() -> None:
    assert all_verdicts([result("crash", CRASH_RIGHT, True)]) == []
    assert all_verdicts([result("crash", FailureScore(("crashes",)), True)]) == ["crash: crashes not named"]


def test_failure_faults_in_words() -> None:
    assert describe_fault(Fault("hang", rank=3, start_step=3)) == "hang for good on rank 3 at step 3"
    mid_step = Fault("hang", rank=1, start_step=4, bucket=2)
    assert describe_fault(mid_step) == "hang for good on rank 1 at step 4 before bucket 2"
    on_tp = Fault("desync", rank=1, start_step=4, comm="tp")
    assert describe_fault(on_tp) == "desync (twice the bytes) on rank 1 at step 4 before tp"
    timed = Fault("hang", ms=400, node="node-b", start_step=2)
    assert describe_fault(timed) == "hang 400 ms on node node-b at step 2"
    crash = Fault("crash", rank=2, start_step=3, status=7)
    assert describe_fault(crash) == "crash (exit 7) on rank 2 at step 3"
    assert describe_fault(Fault("slow_gpu", ms=10, rank=1)) == ""


def test_a_named_link_is_scored_by_the_link_table_not_called_a_fault_free_name() -> None:
    """A slow_link scenario's default call names the link: the link table scores it, so it is no
    "named ... with no fault" miss; on a scenario with no slow_link it still is one."""
    base = result("slow-nic", FailureScore(), False)
    with_link = ScenarioResult(**{**base.__dict__, "named": ["link node-b"], "link_faults": 1})
    assert with_link.unexplained == set()
    no_link = ScenarioResult(**{**base.__dict__, "named": ["rank 5", "link node-b"], "link_faults": 0,
                                "periods": [("rank 5", 7, 7)]})  # a straggler scenario: rank 5 is its fault
    assert no_link.unexplained == {"link node-b"}
    assert "slow-nic: named ['link node-b'] with no fault" in all_verdicts([no_link])
    assert not any("with no fault" in v for v in all_verdicts([with_link]))


def test_the_json_file_holds_every_result_with_its_spilled_names_sorted() -> None:
    """``rankecho evaluate --json`` wrote ``asdict`` through ``json.dumps``, which refused the ``spilled``
    set and lost the run's table with it."""
    base = result("skew", FailureScore(), False)
    spilled = ScenarioResult(**{**base.__dict__, "spilled": {"rank 7", "node-b"}})
    back = json.loads(results_json([spilled, result("crash", CRASH_RIGHT, True)]))
    assert [r["scenario"] for r in back] == ["skew", "crash"]
    assert back[0]["spilled"] == ["node-b", "rank 7"] and back[1]["spilled"] == []
    assert back[1]["failures"]["named"] == ["crashes"]
