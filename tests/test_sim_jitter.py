"""Healthy jitter (a scenario's ``jitter:``): validated like every other setting, and both rank programs
(run by the launcher, without agents) add exactly the seeded noise pyrank_lib.healthy_noise_us predicts
to each rank's data-loader wait and GPU compute at each step: reproducible noise with an idle CPU."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

import pytest

from rankecho.sim.groundtruth import read_rank_logs
from rankecho.sim.launcher import LaunchOptions, rank_argv, run_scenario
from rankecho.sim.pyrank_lib import healthy_noise_us
from rankecho.sim.scenario import ScenarioError, load_scenario, parse_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "format" / "healthy-jitter.yaml"


def scenario(jitter: Any) -> Any:
    return parse_scenario({"cluster_id": "t", "nodes": [{"id": "n", "ranks": 2}], "jitter": jitter})


@pytest.mark.parametrize(
    ("jitter", "msg"),
    [
        ({"compute_ms": -1}, "jitter.compute_ms: must be >= 0"),
        ({"loader_ms": 3}, "jitter: unknown key(s) ['loader_ms']; allowed: ['compute_ms', 'dataloader_ms'"),
        ({"host_ms": "lots"}, "jitter.host_ms: expected a number"),
        ({"compute_ms": 0}, "jitter: every bound is 0, so it adds no noise"),
        ({}, "jitter: every bound is 0"),
        (5, "jitter: expected a mapping"),
    ],
)
def test_jitter_that_adds_nothing_or_is_malformed_is_refused(jitter: Any, msg: str) -> None:
    with pytest.raises(ScenarioError) as e:
        scenario(jitter)
    assert msg in str(e.value)


def test_jitter_reaches_the_rank_programs_only_when_set(tmp_path: Path) -> None:
    s = scenario({"compute_ms": 8, "dataloader_ms": 2.5})
    node = s.nodes[0]
    assert rank_argv(s, 0, node, tmp_path / "log", tmp_path)[-2:] == ["--noise-us", "8000:0:2500"]
    plain = dataclasses.replace(s, jitter=type(s.jitter)())
    assert "--noise-us" not in rank_argv(plain, 0, node, tmp_path / "log", tmp_path)


@pytest.mark.parametrize("program", ["c", "python"])
def test_each_rank_gets_the_seeded_noise_at_each_step(tmp_path: Path, program: str) -> None:
    s = dataclasses.replace(load_scenario(SCENARIO), program=program)
    run = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=120))
    assert run.returncode == 0 and run.truth is not None
    assert run.truth["jitter"] == {"compute_ms": 12.0, "host_ms": 1.0, "dataloader_ms": 20.0}
    loader_err, compute_err, loader_want = [], [], []
    for rank, log in read_rank_logs(tmp_path, s).items():
        assert len(log.steps) == s.steps
        for rec in log.steps:
            want = s.step.dataloader_ms + healthy_noise_us(s.seed, rank, rec.step, 2, 20_000) / 1000
            got = rec.loader_ns / 1e6
            assert got >= want - 0.05, (rank, rec.step, got, want)  # a wait never ends early
            loader_err.append(got - want)
            loader_want.append(want)
            # the GPU reaches the all-reduce after the loader wait and every kernel (one bucket): compute
            gpu = (rec.gpu_arrive_ns - rec.start_ns - rec.loader_ns) / 1e6
            noise = healthy_noise_us(s.seed, rank, rec.step, 0, 12_000) / 1000
            compute_err.append(gpu - s.step.compute_ms - noise)
    assert max(loader_want) - min(loader_want) > 10  # real spread, not a constant
    assert statistics.median(loader_err) < 1.5 and statistics.median([abs(e) for e in compute_err]) < 1.5
