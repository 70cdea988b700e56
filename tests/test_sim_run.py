"""Whole simulated clusters run through the launcher: the barrier, the ground truth, the scale."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rankecho.sim.groundtruth import read_rank_logs
from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import parse_scenario

SHORT_STEP = {
    "compute_ms": 8,
    "host_ms": 0.2,
    "dataloader_ms": 0.2,
    "kernel_launch_rate": 1000,
    "allreduce_mb": 4,
    "buckets": 2,
}


def rank_row(truth: dict[str, Any], step: int, rank: int) -> dict[str, Any]:
    row = truth["per_step"][step]
    assert row["step"] == step
    return next(r for r in row["ranks"] if r["rank"] == rank)


def test_barrier_holds_early_ranks_and_ground_truth_matches(tmp_path: Path) -> None:
    scenario = parse_scenario(
        {
            "cluster_id": "t-barrier",
            "steps": 16,
            "step": SHORT_STEP,
            "communicators": [{"name": "pairs", "group_size": 2}],
            "straggler_threshold_ms": 80,
            "nodes": [{"id": "n0", "ranks": 2}, {"id": "n1", "ranks": 2, "clock_offset_ms": 4}],
            "faults": [
                {"rank": 3, "kind": "host_compute", "ms": 150, "every": 5, "start_step": 2},
                {"rank": 0, "kind": "dataloader_stall", "ms": 100, "every": 7, "start_step": 4, "jitter": 10},
                # two faults on one rank at one step add up
                {"rank": 1, "kind": "host_compute", "ms": 60, "every": 100, "start_step": 14},
                {"rank": 1, "kind": "dataloader_stall", "ms": 60, "every": 100, "start_step": 14},
            ],
        },
        "barrier",
    )
    result = run_scenario(scenario, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=90))
    assert result.returncode == 0
    truth = result.truth
    assert truth is not None
    assert [len(log.steps) for log in read_rank_logs(tmp_path, scenario).values()] == [16] * 4
    expected = {(2, 3, "host_compute"), (7, 3, "host_compute"), (12, 3, "host_compute")}
    expected |= {(4, 0, "dataloader_stall"), (11, 0, "dataloader_stall"), (14, 1, "host_compute")}
    seen = {(s["step"], x["rank"], x["cause"]) for s in truth["per_step"] for x in s["stragglers"]}
    # A busy machine can make a healthy rank late too; that is recorded (cause None), never a fault.
    assert expected <= seen
    assert all(cause is None for _, _, cause in seen - expected) and len(seen - expected) <= 2
    fault_steps = {step for step, _, _ in expected}
    healthy_wait = {
        rank: statistics.median(
            rank_row(truth, s, rank)["sync_wait_ms"] for s in range(16) if s not in fault_steps
        )
        for rank in range(4)
    }
    for step, straggler, _ in sorted(expected):
        late = rank_row(truth, step, straggler)["entered_late_by_ms"]
        injected = sum(i["ms"] for i in rank_row(truth, step, straggler)["injected"])
        assert 0.8 * injected <= late <= injected + 250, (step, late, injected)
        # Every other rank sat in its final cudaStreamSynchronize for about as long as the
        # straggler was late: the collective could not complete before the straggler arrived.
        waits = []
        for rank in set(range(4)) - {straggler}:
            waits.append(rank_row(truth, step, rank)["sync_wait_ms"])
            assert waits[-1] - healthy_wait[rank] >= 0.7 * late, (step, rank, waits[-1], late)
        # ...while the straggler itself found the collective nearly done when it got there.
        assert rank_row(truth, step, straggler)["sync_wait_ms"] < min(waits) - 0.3 * late
    assert [i["kind"] for i in rank_row(truth, 14, 1)["injected"]] == ["host_compute", "dataloader_stall"]
    jittered = [rank_row(truth, s, 0)["injected"][0]["ms"] for s in (4, 11)]
    assert all(90 <= ms <= 110 for ms in jittered) and jittered[0] != jittered[1]
    assert truth["nodes"][1]["clock_offset_ns"] == 4_000_000
    members = sorted(c["members"] for c in truth["communicators"] if c["name"] == "pairs")
    assert members == [[0, 1], [2, 3]]


def test_eight_ranks_two_hundred_steps_finish_quickly(tmp_path: Path) -> None:
    scenario = parse_scenario(
        {
            "cluster_id": "t-scale",
            "steps": 200,
            "step": {**SHORT_STEP, "compute_ms": 2, "kernel_launch_rate": 1500, "allreduce_mb": 1},
            "nodes": [{"id": "a", "ranks": 4}, {"id": "b", "ranks": 4}],
        },
        "scale",
    )
    result = run_scenario(scenario, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=120))
    assert result.returncode == 0
    assert result.truth is not None
    assert len(result.truth["per_step"]) == 200
    assert all(s["complete"] for s in result.truth["per_step"])
    assert result.wall_s < 60, f"8 x 200 short steps took {result.wall_s:.1f} s"
    # Each node's ranks loaded their own copy of the libraries (distinct inodes, as on two hosts).
    inodes = {(d / "libnccl.so.2").stat().st_ino for d in result.lib_dirs.values()}
    assert len(inodes) == 2
