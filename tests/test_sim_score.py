"""Scoring a diagnosis against ground truth: injected stragglers count, unexplained lateness is neutral."""

from __future__ import annotations

from typing import Any

from sim.score import injected_stragglers, score


def truth_with(stragglers: dict[int, list[tuple[int, str | None]]]) -> dict[str, Any]:
    return {
        "per_step": [
            {
                "step": step,
                "stragglers": [{"rank": r, "entered_late_by_ms": 100.0, "cause": c} for r, c in rows],
            }
            for step, rows in sorted(stragglers.items())
        ]
    }


TRUTH = truth_with({3: [(5, "alloc_stall")], 17: [(5, "alloc_stall"), (2, "host_compute")], 20: [(1, None)]})


def test_injected_stragglers_skip_unexplained_lateness() -> None:
    assert injected_stragglers(TRUTH) == {
        (3, 5): "alloc_stall",
        (17, 5): "alloc_stall",
        (17, 2): "host_compute",
    }


def test_perfect_diagnosis() -> None:
    s = score(TRUTH, [(3, 5, "alloc_stall"), (17, 5, "alloc_stall"), (17, 2, "host_compute")])
    assert (s.precision, s.recall, s.cause_accuracy) == (1.0, 1.0, 1.0)


def test_misses_wrong_causes_and_false_alarms() -> None:
    s = score(TRUTH, [(3, 5, "slow_gpu"), (17, 5, None), (9, 0, "host_compute"), (20, 1, "cpu_contention")])
    # (20, 1) was really late with no fault injected: neither a hit nor a false alarm.
    assert (s.true_positives, s.false_positives, s.false_negatives) == (2, 1, 1)
    assert (s.causes_named, s.causes_right) == (1, 0)
    assert s.precision == 2 / 3 and s.recall == 2 / 3 and s.cause_accuracy == 0.0


def test_empty_cases() -> None:
    assert score(truth_with({}), []).precision == 1.0
    assert score(TRUTH, []).recall == 0.0
