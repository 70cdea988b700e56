"""The fake cudaMalloc reuses freed space, so long jobs with an allocation-stall fault run to the end.

Found (issue 9): the fake allocator only ever moved forward, so the seed scenario (rank 5 frees and
re-maps ~2.9 GB every 14 steps) died at step 413 with ``cudaMalloc failed with code 2`` once the
80 GiB were used up.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rankecho.sim.groundtruth import read_rank_logs
from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import load_scenario, parse_scenario

SEED = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "seed-rank5.yaml"


def test_a_free_malloc_cycle_runs_past_the_device_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 cycles of ~3 GB each (3 TB mapped in all) on one 80 GiB fake device: without reuse the
    rank dies within 30 cycles."""
    monkeypatch.setenv("RANKECHO_SIM_MALLOC_GBPS", "300")
    scenario = parse_scenario(
        {
            "cluster_id": "t-mem",
            "steps": 2000,
            "step": {"compute_ms": 0.2, "host_ms": 0.05, "dataloader_ms": 0.05, "allreduce_mb": 1},
            "nodes": [{"id": "n0", "ranks": 1}],
            "faults": [{"rank": 0, "kind": "alloc_stall", "ms": 10, "every": 2, "start_step": 1}],
        },
        "memory",
    )
    result = run_scenario(scenario, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=120))
    logs = read_rank_logs(tmp_path, scenario)
    assert result.returncode == 0, [p.read_text()[-500:] for p in tmp_path.rglob("*.log")]
    assert len(logs[0].steps) == 2000


@pytest.mark.slow
def test_the_seed_scenario_runs_2000_steps(tmp_path: Path) -> None:
    """The seed scenario itself (8 ranks, rank 5's 290 ms allocation stall every 14 steps: ~140
    cycles of ~2.9 GB), steps cut to 5 ms of compute so 2,000 of them take about a minute."""
    seed = load_scenario(SEED)
    scenario = replace(seed, steps=2000, step=replace(seed.step, compute_ms=5))
    result = run_scenario(scenario, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=900))
    assert result.returncode == 0
    logs = read_rank_logs(tmp_path, scenario)
    assert {rank: len(log.steps) for rank, log in logs.items()} == {r: 2000 for r in range(8)}
