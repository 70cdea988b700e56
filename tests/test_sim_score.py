"""Scoring a diagnosis against ground truth: injected stragglers count; unexplained lateness and lateness
near the threshold are neutral; a diagnosis's episodes are mapped to steps by time, clock offset undone."""

from __future__ import annotations

from typing import Any

from rankecho.sim.score import (
    injected_stragglers,
    periods,
    predictions_from,
    score,
    spilled_nodes,
    spilled_ranks,
    unobserved,
)


def truth_with(
    stragglers: dict[int, list[tuple[int, str | None]]], threshold: float = 50.0
) -> dict[str, Any]:
    return {
        "straggler_threshold_ms": threshold,
        "per_step": [
            {
                "step": step,
                "stragglers": [{"rank": r, "entered_late_by_ms": 100.0, "cause": c} for r, c in rows],
            }
            for step, rows in sorted(stragglers.items())
        ],
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


def step_ranks(
    step: int, late: dict[int, tuple[float, str | None]], enter0: int, step_ms: float = 45.0
) -> dict:
    """A per_step entry: every rank of 4 enters at enter0 + lateness; `late` maps rank -> (ms, cause)."""
    ranks = []
    for rank in range(4):
        ms, cause = late.get(rank, (0.0, None))
        ranks.append({"rank": rank, "enter_ns": enter0 + int(ms * 1e6), "entered_late_by_ms": ms,
                      "gpu_late_by_ms": ms, "step_ms": step_ms, "cause": cause})  # fmt: skip
    return {"step": step, "ranks": ranks, "stragglers": []}


def full_truth(observed: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    t0, step_ns = 1_000_000_000_000, 45_000_000
    late = {
        3: {2: (60.0, "alloc_stall")},
        6: {2: (60.0, "alloc_stall")},
        8: {1: (7.0, None)},
        9: {0: (30.0, None)},
    }
    return {
        "cluster_id": "c", "straggler_threshold_ms": 40.0,
        "nodes": [{"node_id": "a", "clock_offset_ns": 0}, {"node_id": "b", "clock_offset_ns": 30_000_000}],
        "ranks": [{"rank": r, "node_id": "a" if r < 2 else "b"} for r in range(4)],
        "per_step": [step_ranks(s, late.get(s, {}), t0 + s * step_ns) for s in range(12)],
        "faults": [{"rank": 2, "node": None, "every": 3}],
        "observed": observed or [],
    }  # fmt: skip


def diagnosis(reference: str, episodes: list[tuple[int, int, str]], period: int | None = 3) -> dict[str, Any]:
    """A find_stragglers answer naming rank 2; episodes as (rank, enter_ns on the reference clock, cause)."""
    return {
        "clusters": [{"cluster_id": "c", "reference_node": reference}],
        "stragglers": [{"cluster_id": "c", "kind": "rank", "node_id": "b", "rank": 2,
                        "period": {"steps": period, "confidence": 0.9} if period else None,
                        "episodes": [{"timestamp_ns": ts, "cause": cause, "ranks": [rank]}
                                     for rank, ts, cause in episodes]}],
    }  # fmt: skip


def test_episodes_map_to_steps_by_time_on_the_reference_clock() -> None:
    truth = full_truth()
    t0, step_ns, late = 1_000_000_000_000, 45_000_000, 60_000_000
    # on node b's clock (30 ms ahead) the same calls read 30 ms later: undone through the reference node
    for reference, shift in (("a", 0), ("b", 30_000_000)):
        found = diagnosis(reference, [(2, t0 + 3 * step_ns + late + shift, "allocator"),
                                      (2, t0 + 6 * step_ns + late + shift, "allocator")])  # fmt: skip
        predictions = predictions_from(truth, found)
        assert predictions == [(3, 2, "alloc_stall"), (6, 2, "alloc_stall")]
        s = score(truth, predictions)
        assert (s.true_positives, s.false_positives, s.false_negatives, s.cause_accuracy) == (2, 0, 0, 1.0)
    assert periods(truth, diagnosis("a", [])) == [("rank 2", 3, 3)]
    assert periods(truth, diagnosis("a", [], period=None)) == [("rank 2", 3, None)]


def test_lateness_near_the_threshold_or_unexplained_is_neutral_and_small_lateness_is_not() -> None:
    truth = full_truth()
    t0, step_ns = 1_000_000_000_000, 45_000_000
    found = diagnosis("a", [(2, t0 + 3 * step_ns + 60_000_000, "allocator"),
                            (0, t0 + 9 * step_ns + 30_000_000, "sleeping"),  # 30 ms, no cause: neutral
                            (1, t0 + 8 * step_ns + 7_000_000, "sleeping"),  # 7 ms < 20: a false alarm
                            (3, t0 + 20 * step_ns, "sleeping")])  # no step near: a false alarm  # fmt: skip
    s = score(truth, predictions_from(truth, found))
    assert (s.true_positives, s.false_positives, s.false_negatives) == (1, 2, 1)


def test_steps_no_agent_watched_are_not_counted_as_misses() -> None:
    t0, step_ns = 1_000_000_000_000, 45_000_000
    # node b's agent (rank 2's) was ready only from step 5 on: step 3's stall could not be seen
    observed = [{"node_id": "a", "from_ns": 0, "to_ns": 2 * t0}, {"node_id": "b", "from_ns": t0 + 4 * step_ns,
                                                                    "to_ns": 2 * t0}]  # fmt: skip
    truth = full_truth(observed)
    assert (3, 2) in unobserved(truth) and (6, 2) not in unobserved(truth)
    assert injected_stragglers(truth) == {(6, 2): "alloc_stall"}
    s = score(
        truth, predictions_from(truth, diagnosis("a", [(2, t0 + 6 * step_ns + 60_000_000, "allocator")]))
    )
    assert (s.true_positives, s.false_negatives) == (1, 0)


def test_the_truth_measures_lateness_against_the_ranks_no_fault_struck() -> None:
    from rankecho.sim.groundtruth import RankLog, StepRecord, build_ground_truth
    from rankecho.sim.scenario import parse_scenario

    scenario = parse_scenario({"cluster_id": "c", "nodes": [{"id": "a", "ranks": 2}, {"id": "b", "ranks": 2}],
                               "faults": [{"node": "b", "kind": "host_compute", "ms": 80}]})  # fmt: skip
    logs = {}
    for rank in range(4):
        late = 80_000_000 if rank >= 2 else rank * 1_000_000  # the whole of node b is late together
        causes = (("host_compute", 80.0),) if rank >= 2 else ()
        step = StepRecord(0, 0, 1_000_000_000 + late, 2_000_000_000, 0, 0, 0, 0, 1_000_000_000 + late, causes)
        logs[rank] = RankLog(rank=rank, node_id="a" if rank < 2 else "b", steps=[step])
    truth = build_ground_truth(scenario, logs)
    lateness_ms = {r["rank"]: r["entered_late_by_ms"] for r in truth["per_step"][0]["ranks"]}
    # against the median of ranks 0 and 1 (0.5 ms), not of all four (which a late half would pull to 40 ms)
    assert lateness_ms == {0: -0.5, 1: 0.5, 2: 79.5, 3: 79.5}
    assert truth["faults"][0]["ranks"] == [2, 3]


def test_a_fault_that_fired_short_of_the_threshold_is_neutral_and_expects_no_period() -> None:
    truth = truth_with({4: [(2, "dataloader_stall")]}, threshold=50.0)
    truth["per_step"][0]["stragglers"][0]["entered_late_by_ms"] = 10.0  # fired, fell short
    unexplained = {"rank": 2, "entered_late_by_ms": 10.0, "cause": None}
    truth["per_step"].append({"step": 5, "stragglers": [unexplained]})
    s = score(truth, [(4, 2, "sleeping"), (5, 2, "sleeping")])
    # naming the fired fault is no false alarm; the same lateness with no fault is one
    assert (s.true_positives, s.false_positives, s.false_negatives) == (0, 1, 0)
    faults = [{"rank": 2, "kind": "dataloader_stall", "ms": 30.0, "jitter": 10.0, "every": 4},
              {"rank": 3, "kind": "dataloader_stall", "ms": 45.0, "jitter": 5.0, "every": 7}]  # fmt: skip
    truth["faults"] = faults
    diag = {"stragglers": []}
    assert periods(truth, diag) == [("rank 3", 7, None)]  # 30 + 10 < 50: rank 2 can never be an episode


def test_a_node_named_only_where_a_fault_struck_one_of_its_ranks_is_not_named_without_one() -> None:
    """Node b (ranks 2, 3) named at step 3, where rank 2's fault fired (its hog held rank 3 back on the
    shared cores): late by that fault. Named at step 9 too, where no fault struck b: named without one."""
    truth = full_truth()
    t0, step_ns, late = 1_000_000_000_000, 45_000_000, 60_000_000

    def node_b(*steps: int) -> dict[str, Any]:
        answer = diagnosis("a", [])
        answer["stragglers"] = [{"cluster_id": "c", "kind": "node", "node_id": "b", "rank": None,
                                 "episodes": [{"timestamp_ns": t0 + s * step_ns + late, "cause": "allocator",
                                               "ranks": [2, 3]} for s in steps]}]  # fmt: skip
        return answer

    assert spilled_nodes(truth, node_b(3)) == {"node b"}
    assert spilled_nodes(truth, node_b(3, 6)) == {"node b"}
    assert spilled_nodes(truth, node_b(3, 9)) == set()
    assert spilled_nodes(truth, diagnosis("a", [(2, t0 + 3 * step_ns + late, "allocator")])) == set()


def test_a_rank_late_only_at_a_faults_steps_is_load_the_fault_spilled_not_named_without_one() -> None:
    """Rank 3 (no fault) is late by 35 ms at step 3, where rank 2's fault fired: the hog held it back on the
    shared cores. Named only there, that is the fault's load; named also at step 9 (where it was on time),
    or where it was not late, or a rank late at a step no fault struck, it is named without a fault."""
    truth = full_truth()
    t0, step_ns = 1_000_000_000_000, 45_000_000
    mate = truth["per_step"][3]["ranks"][3]
    mate["entered_late_by_ms"], mate["gpu_late_by_ms"] = 35.0, 35.0
    mate["enter_ns"] += 35_000_000

    def rank_named(rank: int, *steps: int, late_ms: float = 35.0) -> dict[str, Any]:
        answer = diagnosis("a", [])
        answer["stragglers"] = [{"cluster_id": "c", "kind": "rank", "node_id": "b", "rank": rank,
                                 "episodes": [{"timestamp_ns": t0 + s * step_ns + int(late_ms * 1e6),
                                               "cause": None, "ranks": [rank]} for s in steps]}]  # fmt: skip
        return answer

    assert spilled_ranks(truth, rank_named(3, 3)) == {"rank 3"}
    assert spilled_ranks(truth, rank_named(3, 3, 9)) == set()  # on time at step 9
    assert spilled_ranks(truth, rank_named(3, 6, late_ms=0.0)) == set()  # a fault's step, rank 3 on time
    assert spilled_ranks(truth, rank_named(0, 9, late_ms=30.0)) == set()  # late, but no fault at step 9
    assert spilled_ranks(truth, rank_named(3)) == set()  # no episode: nothing to excuse
    node = rank_named(3, 3)
    node["stragglers"][0].update(kind="node", rank=None, episodes=[{**node["stragglers"][0]["episodes"][0],
                                                                     "ranks": [3]}])  # fmt: skip
    assert spilled_ranks(truth, node) == set()  # a node is spilled_nodes' to judge
    other = {**rank_named(3, 3), "stragglers": [{**rank_named(3, 3)["stragglers"][0], "cluster_id": "x"}]}
    assert spilled_ranks(truth, other) == set()  # another cluster's rank 3
    late_after = truth["per_step"][7]["ranks"][3]  # after a slow link's step 6, rank 3 starts step 7 late
    late_after["entered_late_by_ms"], late_after["gpu_late_by_ms"] = 35.0, 35.0
    late_after["enter_ns"] += 35_000_000
    assert spilled_ranks(truth, rank_named(3, 7)) == set()  # no fault struck step 7
    truth["links"] = [{"steps": [6], "ranks": [3]}]
    assert spilled_ranks(truth, rank_named(3, 7)) == {"rank 3"}
    assert spilled_ranks(truth, rank_named(3, 8, late_ms=0.0)) == set()  # two steps on, and on time


def test_episodes_map_by_the_reference_nodes_true_offset_at_each_step_when_its_clock_steps() -> None:
    """A reference node whose clock drifts and then steps 40 ms (an NTP step, ``clock_step``) reads the
    calls after the step 40 ms later than the constant offset says: almost a step here. Its per-step true
    offsets (the truth's ``offsets``) map every episode back to its own step; the constant offset would
    put the later ones a step off."""
    truth = full_truth()
    t0, step_ns, late = 1_000_000_000_000, 45_000_000, 60_000_000
    offset = {s: 30_000_000 + s * 100_000 + (40_000_000 if s >= 5 else 0) for s in range(12)}  # drift, step
    truth["nodes"][1]["offsets"] = [{"step": s, "offset_ns": o} for s, o in offset.items()]
    found = diagnosis("b", [(2, t0 + s * step_ns + late + offset[s], "allocator") for s in (3, 6)])
    assert predictions_from(truth, found) == [(3, 2, "alloc_stall"), (6, 2, "alloc_stall")]
    constant = full_truth()  # the same times undone with the constant 30 ms: step 6's lands on step 8's call
    assert predictions_from(constant, found) == [(3, 2, "alloc_stall"), (8, 2, "alloc_stall")]
    on_a = diagnosis("a", [(2, t0 + 6 * step_ns + late, "allocator")])  # node a's clock: no offsets to use
    assert predictions_from(truth, on_a) == [(6, 2, "alloc_stall")]
