"""``python -m bench agent``'s statistics and parsing helpers (bench/_agent_stats.py, bench/_agent_job.py):
the p95, ratios and per-arm summaries its report is made of, the agent log and Echo ``/metrics`` lines it
reads (produced here by the real formatting code), and the rank options a scenario gives. No timing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench._agent_job import builtin_shape, scenario_shape
from bench._agent_stats import (
    DETACHED,
    SUMMARY,
    AgentTimes,
    StepStats,
    arm_summary,
    echo_counts,
    percentile,
    phase_medians,
    ratio,
    spread,
    step_stats,
    timing_report,
)
from rankecho.agent.export import Delivery
from rankecho.echo.ops import Stats, render

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "sim" / "scenarios" / "healthy.yaml"


def test_percentile_is_nearest_rank_and_always_a_value_that_occurred() -> None:
    assert percentile(list(range(1, 21)), 0.95) == 19
    assert percentile(list(range(100, 0, -1)), 0.95) == 95  # order of the input does not matter
    assert percentile([1.5, 100.0], 0.95) == 100.0
    assert percentile([7.0], 0.95) == 7.0
    assert percentile([3.0, 1.0, 2.0], 1.0) == 3.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    with pytest.raises(ValueError):
        percentile([], 0.95)
    with pytest.raises(ValueError):
        percentile([1.0], 0.0)


def test_ratio_is_nan_without_a_baseline() -> None:
    assert ratio(103.0, 100.0) == pytest.approx(1.03)
    assert math.isnan(ratio(1.0, 0.0))


def test_step_stats_and_arm_summary_take_medians_over_rounds_and_the_worst_step_of_all() -> None:
    one = [10.0] * 95 + [20.0] * 4 + [40.0]  # 100 steps: p95 still 10, the worst 40
    assert step_stats(one) == StepStats(10.0, 10.0, 40.0)
    rounds = [StepStats(10.0, 12.0, 15.0), StepStats(11.0, 30.0, 90.0), StepStats(12.0, 13.0, 14.0)]
    assert arm_summary(rounds) == StepStats(11.0, 13.0, 90.0)


def test_phases_split_each_step_at_its_first_collective() -> None:
    # simrank's line: step N start enter end (end - sync start) load alloc fwd_sync gpu_done causes
    lines = [f"step {n} {t0} {t0 + pre} {t0 + pre + post} {post // 2} 0 0 0 0 -".split()
             for n, t0, pre, post in ((1, 0, 30_000_000, 10_000_000), (2, 50_000_000, 32_000_000, 14_000_000),
                                      (3, 99_000_000, 31_000_000, 12_000_000))]  # fmt: skip
    assert phase_medians(lines) == {"to_first_collective_ms": 31.0, "collectives_to_end_ms": 12.0,
                                    "final_sync_ms": 6.0}


def test_spread_leaves_out_figures_a_log_did_not_give() -> None:
    assert spread([2.0, 1.0, 4.0]) == {"median": 2.0, "max": 4.0, "each": [2.0, 1.0, 4.0]}
    got = spread([1.0, math.nan, 3.0])
    assert (got["median"], got["max"]) == (2.0, 3.0)
    assert math.isnan(spread([math.nan])["median"])


def test_the_agents_summary_line_and_echos_metrics_are_read_as_written(tmp_path: Path) -> None:
    line = Delivery(120, 1, "bad token", 2, 3, "spool", "root").summary()
    m = SUMMARY.search(f"2026-12-06 02:45:32,123 rankecho-agent INFO {line}")
    assert m is not None and tuple(map(int, m.groups())) == (120, 1, 2, 3)
    detached = DETACHED.search(f"detached {45:d} uprobes in {4.06:.1f} s")  # agent/runner.py's line
    assert detached is not None and detached.groups() == ("45", "4.1")

    stats = Stats()
    stats.received("metrics", 70)
    stats.received("logs", 5)
    stats.committed(rows=75, inserted=72, seconds=0.01)
    assert echo_counts(render(stats.snapshot())) == {"received": 75.0, "committed": 72.0, "duplicates": 3.0}

    times = [AgentTimes("node-a", tmp_path / "a.log", start_to_ready_s=1.5, start_to_first_attach_s=1.2,
                        stop_s=4.0, detach_s=3.8, uprobes=45, delivery={"acknowledged": 10, "unsent": 0}),
             AgentTimes("node-b", tmp_path / "b.log", start_to_ready_s=2.5, stop_s=5.0)]
    report = timing_report(times)
    assert report["agent_start_to_attached_s"]["median"] == 2.0
    assert report["agent_start_to_first_attach_s"]["max"] == 1.2
    assert report["agent_stop_s"]["max"] == 5.0
    assert report["agent_delivery"]["acknowledged"] == 10
    assert report["agents_without_summary"] == ["node-b"]
    assert report["agent_uprobes_detached"] == [45, 0]


def test_a_scenario_gives_each_rank_the_options_rankecho_sim_does_less_program_and_log() -> None:
    shape = scenario_shape(HEALTHY, None)
    assert (shape.nodes, shape.ranks_per_node, shape.steps) == (["node-a", "node-b"], 4, 120)
    assert shape.cluster_id == "sim-healthy" and shape.endbr_nodes == ()
    assert sorted(shape.per_rank) == list(range(8))
    argv = shape.per_rank[5]
    assert "--log" not in argv and not argv[0].endswith("simrank")
    assert argv[argv.index("--steps") + 1] == "120" and argv[argv.index("--compute-us") + 1] == "40000"
    assert any(a.startswith("dp:2:1:") for a in argv)  # the strided split communicator
    assert scenario_shape(HEALTHY, 7).per_rank[0][1] == "7"
    builtin = builtin_shape(None)
    assert builtin.args[:2] == ["--steps", "30"] and builtin.endbr_nodes == ("node-b",)


def test_a_scenario_the_bench_cannot_run_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "uneven.yaml"
    path.write_text("cluster_id: x\nnodes: [{id: a, ranks: 2}, {id: b, ranks: 3}]\nbus_gbps: 10\n")
    with pytest.raises(SystemExit, match=r"same number of ranks.*drop bus_gbps"):
        scenario_shape(path, None)
