"""``rankecho stress --shape agent`` against the real thing: the seed scenario run with real eBPF agents
into one Echo, the generator's 8-rank, 90 ms-step job into another, both compared row for row in shape
(metric names, attribute keys per metric, events per rank per step), and find_stragglers run on the
generated store must name exactly the planted ranks with the planted cause and period.

Events per rank per step are compared between runs of the same length (20 steps): the total within 15%,
each metric that occurs at least once per rank-step within 25% (the real run's counts move by a few
percent from run to run with scheduling noise; the off-CPU intervals most).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, row_dicts
from test_agent_helpers import requires_ebpf

from rankecho.agent.settings import Settings
from rankecho.echo.app import Echo
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.shared import contract as c
from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import load_scenario

SEED = Path(__file__).resolve().parents[1] / "sim" / "scenarios" / "diagnosis" / "seed-rank5.yaml"
REAL_STEPS = 20
SEED_STEP_MS = 90
TOTAL_TOLERANCE = 0.15
"""Of ~5 events per rank-step 4 are collectives; the rest is evidence (a loaded machine makes more)."""
EVIDENCE = {c.M_CUDA_SYNC, c.M_CUDA_MEMCPY, c.M_CUDA_MALLOC, c.M_CUDA_FREE, c.M_OFFCPU}
PRE_CLASSES = {f"{c.PRE_PREFIX}{name}_ms" for name in c.PRE_CLASSES} | {
    f"{c.PRE_PREFIX}{name}{c.PRE_STACK_SUFFIX}" for name in c.PRE_CLASSES
} | {c.PRE_ONCPU_STACK, c.PRE_ONCPU_SAMPLES}
"""Keys a window has only when it held that class (or an on-CPU sample): which ones occur is chance."""
METRIC_TOLERANCE = 0.25


def profile(echo: Echo, rank_steps: int) -> dict[str, Any]:
    """Metric names, attribute keys per metric and events per rank per step of one store."""
    rows = row_dicts(echo, "SELECT metric_name, rank, nranks, cluster_id, node_id, attrs_json FROM events")
    keys: dict[str, set[str]] = defaultdict(set)
    per_metric: dict[str, int] = defaultdict(int)
    for r in rows:
        keys[r["metric_name"]] |= set(json.loads(r["attrs_json"]))
        if r["rank"] is not None:
            per_metric[r["metric_name"]] += 1
    return {
        "keys": dict(keys),
        "rate": {m: n / rank_steps for m, n in per_metric.items()},
        "total": sum(per_metric.values()) / rank_steps,
        "rows": rows,
    }


def generate(echo: Echo, *args: str) -> dict[str, Any]:
    """Run ``rankecho stress --shape agent`` as a process; its last stdout line (JSON)."""
    done = subprocess.run(
        [sys.executable, "-m", "rankecho", "stress", "--shape", "agent", "--endpoint", echo.grpc_address,
         "--token", TEST_TOKEN, "--insecure", "--cluster-id", "gen", "--node-id", "gpu", "--quiet", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def generated() -> Iterator[tuple[dict[str, Any], dict[str, Any], Investigation]]:
    """The seed's shape (8 ranks on 2 nodes of 4, 90 ms steps, one planted rank), 4 s of job time."""
    with tempfile.TemporaryDirectory() as tmp, inproc_echo(Path(tmp) / "gen.db") as echo:
        result = generate(echo, "--ranks", "8", "--ranks-per-node", "4", "--step-ms", "90", "--duration", "4",
                          "--stragglers", "1", "--speed", "max")
        prof = profile(echo, result["ranks"] * result["steps"])
        yield result, prof, Investigation(echo.reader, load_rates())


@pytest.fixture(scope="module")
def generated_like_real() -> Iterator[dict[str, Any]]:
    """The same shape for as many steps as the real run: a process's fixed events (communicator init and
    destroy, its last launch count, its first stacks) weigh per rank-step by the run's length, so the two
    mixes compare only at equal lengths (4 s against 20 steps put them 0.2 events per rank-step apart)."""
    with tempfile.TemporaryDirectory() as tmp, inproc_echo(Path(tmp) / "gen.db") as echo:
        seconds = REAL_STEPS * SEED_STEP_MS / 1000
        result = generate(echo, "--ranks", "8", "--ranks-per-node", "4", "--step-ms", str(SEED_STEP_MS),
                          "--duration", f"{seconds:g}", "--stragglers", "1", "--speed", "max")
        assert result["steps"] == REAL_STEPS
        yield profile(echo, result["ranks"] * result["steps"])


@pytest.fixture(scope="module")
def real() -> Iterator[dict[str, Any]]:
    """The seed scenario, shortened to 20 steps, with one real eBPF agent per node."""
    scenario = load_scenario(SEED).with_steps(REAL_STEPS)
    with tempfile.TemporaryDirectory() as tmp, inproc_echo(Path(tmp) / "real.db") as echo:
        opts = LaunchOptions(run_dir=Path(tmp) / "run", agent_endpoint=echo.grpc_address, token=TEST_TOKEN,
                             progress=None, timeout_s=120)
        assert run_scenario(scenario, opts).returncode == 0
        yield profile(echo, scenario.world_size * REAL_STEPS)


def test_the_result_line_counts_every_point_and_names_the_planted_ranks(
    generated: tuple[dict[str, Any], dict[str, Any], Investigation],
) -> None:
    result, prof, _ = generated
    assert result["steps"] == 44 and result["nodes"] == 2
    assert result["acked"] == result["sent"] == len(prof["rows"]) and result["failed"] == 0
    assert result["planted"] == [5] and result["planted_steps"] == {"5": [7, 21, 35]}
    assert result["events_per_rank_step"] == pytest.approx(prof["total"], rel=0.02)
    assert result["lag_s"] >= 0 and result["eps"] > 0


def test_every_collective_instance_has_one_chain_id_on_every_rank(
    generated: tuple[dict[str, Any], dict[str, Any], Investigation],
) -> None:
    _, prof, _ = generated
    ranks_of: dict[str, set[int]] = defaultdict(set)
    for r in prof["rows"]:
        if r["metric_name"] == c.M_COLLECTIVE:
            a = json.loads(r["attrs_json"])
            assert a[c.CAUSAL_CHAIN_ID] == c.causal_chain_id(a[c.COMM_ID], a[c.SEQ])
            ranks_of[a[c.CAUSAL_CHAIN_ID]].add(r["rank"])
    assert len(ranks_of) == 44 * 4
    assert all(members == set(range(8)) for members in ranks_of.values())


def test_find_stragglers_names_the_planted_rank_its_cause_and_period(
    generated: tuple[dict[str, Any], dict[str, Any], Investigation],
) -> None:
    result, _, inv = generated
    found = inv.diagnosis.find_stragglers()
    named = [(s["rank"], s["cause"]["class"], s["period"]["steps"]) for s in found["stragglers"]]
    assert named == [(5, "allocator", 14)], found
    episodes = found["stragglers"][0]["episodes"]
    assert [e["step"] for e in episodes] == result["planted_steps"]["5"]


@requires_ebpf
@pytest.mark.ebpf
def test_same_metrics_attribute_keys_and_event_mix_as_a_real_agent_run(
    generated_like_real: dict[str, Any], real: dict[str, Any]
) -> None:
    gen = generated_like_real
    # Raw intervals go out only as evidence (agent/window.py): whether a 20-step run holds one of a kind
    # is chance, so those metrics are compared where both runs have them; every other metric always.
    assert set(gen["keys"]) - EVIDENCE == set(real["keys"]) - EVIDENCE
    for metric, keys in real["keys"].items():
        if metric in gen["keys"]:  # a window's class with no time is left out: which ones occur is chance
            ours = gen["keys"][metric]
            assert ours - PRE_CLASSES == keys - PRE_CLASSES, (metric, keys ^ ours)
    print(f"events per rank-step: generated {gen['total']:.2f}, real {real['total']:.2f}")
    for metric in sorted(real["rate"]):
        print(f"  {metric}: generated {gen['rate'].get(metric, 0):.3f}, real {real['rate'][metric]:.3f}")
    assert gen["total"] == pytest.approx(real["total"], rel=TOTAL_TOLERANCE), (gen["rate"], real["rate"])
    for metric, rate in real["rate"].items():
        if rate >= 1:
            assert gen["rate"].get(metric, 0) == pytest.approx(rate, rel=METRIC_TOLERANCE), metric


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--ranks", "0"), "--ranks >= 1"),
        (("--step-ms", "5"), "--step-ms must be >= 10"),
        (("--step-ms", "1000", "--duration", "0.5"), "--duration >= --step-ms"),
        (("--speed", "warp"), "invalid choice: 'warp'"),
    ],
)
def test_bad_shape_arguments_exit_2_naming_the_fix(args: tuple[str, ...], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rankecho", "stress", "--shape", "agent", "--endpoint", "127.0.0.1:9",
         "--cluster-id", "c", "--node-id", "n", "--quiet", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_real_time_keeps_the_jobs_clock_and_reports_its_lag(tmp_path: Path) -> None:
    """Default speed: 2 s of 100 ms steps take 2 s of wall time, stamped with the wall clock."""
    with inproc_echo(tmp_path / "rt.db") as echo:
        before = time.time_ns()
        result = generate(echo, "--ranks", "16", "--step-ms", "100", "--duration", "2", "--stragglers", "0")
        after = time.time_ns()
        (first, last), = echo.reader.query("SELECT min(timestamp_ns), max(timestamp_ns) FROM events").rows
    assert result["steps"] == 20 and result["acked"] == result["sent"] > 0 and result["planted"] == []
    assert 1.9 <= result["elapsed_s"] < 10 and 0 <= result["lag_s"] < 2.0
    assert before - 10**9 <= first and last <= after


def test_gpus_add_six_gauges_per_rank_per_gpu_interval_and_the_gpu_resource(tmp_path: Path) -> None:
    gauges = {c.M_GPU_UTIL, c.M_GPU_MEM_USED, c.M_GPU_SM_CLOCK, c.M_GPU_TEMP, c.M_GPU_POWER, c.M_GPU_THROTTLE}
    with inproc_echo(tmp_path / "gpu.db") as echo:
        seconds = int(2 * Settings.gpu_interval_s) + 1  # gauges at the job's start, then every interval
        result = generate(echo, "--ranks", "8", "--step-ms", "100", "--duration", str(seconds),
                          "--speed", "max", "--stragglers", "0", "--gpus")
        rows = row_dicts(echo, "SELECT metric_name, rank, attrs_json FROM events")
    assert result["acked"] == len(rows)
    gpu = [r for r in rows if r["metric_name"] in gauges]
    assert {r["metric_name"] for r in gpu} == gauges
    assert len(gpu) == 6 * 8 * 3  # at 0 s, one interval later and two intervals later
    for r in rows:
        if r["rank"] is not None:  # every rank's resource names its GPU, the gauges say which too
            a = json.loads(r["attrs_json"])
            assert a[c.GPU_INDEX] == r["rank"] % 8 and a[c.GPU_UUID].endswith(f"-{r['rank'] % 8}"), a

