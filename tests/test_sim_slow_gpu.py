"""A slow_gpu fault's ``ms`` is the lateness it causes: both rank programs (run by the launcher, without
agents) slow the rank's kernels so that its GPU reaches the step's first world all-reduce ``ms`` late,
whatever the number of gradient buckets (before, 4 buckets made it ms / 2), so a scenario's threshold can be
set against ``ms`` directly."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import parse_scenario

MS = 30.0
FIRES = (2, 4, 6, 8, 10)
"""Every other step: the median over five firings stands a busy machine descheduling a rank at one of them."""


def scenario(buckets: int, program: str) -> Any:
    raw = {"cluster_id": "t-slow-gpu", "steps": 12, "seed": 5, "program": program,
           "step": {"compute_ms": 20, "host_ms": 0.5, "dataloader_ms": 0.5, "allreduce_mb": 1,
                    "buckets": buckets},
           "nodes": [{"id": "n", "ranks": 2}],
           "faults": [{"rank": 1, "kind": "slow_gpu", "ms": MS, "every": 2,
                       "start_step": FIRES[0]}]}  # fmt: skip
    return parse_scenario(raw, "slow-gpu")


@pytest.mark.parametrize(("buckets", "program"), [(1, "c"), (4, "c"), (4, "python")])
def test_the_gpu_reaches_the_first_all_reduce_ms_late(tmp_path: Path, buckets: int, program: str) -> None:
    s = scenario(buckets, program)
    run = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=120))
    assert run.returncode == 0 and run.truth is not None
    rows = [next(r for r in run.truth["per_step"][step]["ranks"] if r["rank"] == 1) for step in FIRES]
    assert all([(i["kind"], i["ms"]) for i in row["injected"]] == [("slow_gpu", MS)] for row in rows)
    # the GPU is ms late (give or take the machine's noise); the host, which waits for the slowed forward in
    # the loss sync, by the forward's share only (6 of the 20 or 10 kernels before bucket 0)
    gpu = statistics.median(row["gpu_late_by_ms"] for row in rows)
    host = statistics.median(row["entered_late_by_ms"] for row in rows)
    assert abs(gpu - MS) <= 3.0 + 0.1 * MS, rows
    assert host < 0.8 * MS, rows
