"""Native user stacks on the simulator: one real agent (real eBPF), 2 ranks, a real Echo.

Rank 1 runs an allocator stall (a cudaFree/cudaMalloc cycle with slow cudaMallocs) on some steps, rank
0 spins on the CPU before every step's first collective (for the on-CPU sampler). The
collective points must name the stack they were entered from, the long cudaMalloc intervals the stack
that called cudaMalloc (its immediate caller included, though cudaMalloc's prologue may not begin with
``push %rbp``), each distinct stack must go out once, and the per-class stack ids of the pre-call
breakdown must name shipped stacks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, row_dicts
from test_agent_helpers import attrs, requires_ebpf, sim_built

from rankecho.shared import contract as c
from rankecho.shared.stacks import split_frames, stack_id
from rankecho.sim.job import SimJob, stop_all

pytestmark = [requires_ebpf, pytest.mark.ebpf]

STEPS = 10
STALL = 1
SPIN = 0
SPIN_MS = 80
SIM_ARGS = ["--steps", str(STEPS), "--compute-us", "20000", "--kernels", "6", "--buckets", "2",
            "--loader-us", "3000"]
CALLERS = ("run_step", "allocate_cache", "fragment_cycle")
"""Who calls cudaMalloc in a stall: the step, or the sim's allocator-stall function (renamed over time)."""
SETUP = "setup"
"""The rank's start-up allocations, which a loaded machine can make long too."""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("agent-stacks")
    with inproc_echo(tmp / "echo.db") as echo:
        sim = SimJob(tmp, ["node-a"], 2, sim_built())
        flags = ("--raw-interval-ms", "0", "--sample-hz", "49")
        agents = sim.start_agents(echo.grpc_address, TEST_TOKEN, *flags)
        fault = {STALL: ["--fault", "alloc_stall:40:2:1:0"],
                 SPIN: ["--fault", f"host_compute:{SPIN_MS}:1:0:0"]}
        sim.wait(sim.start_ranks(SIM_ARGS, fault))
        codes = stop_all(agents)
        yield {"codes": codes, "events": row_dicts(echo, "SELECT * FROM events"),
               "log": agents[0].log.read_text()}


def rows(job: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    return [r for r in job["events"] if r["metric_name"] == metric]


def shipped(job: dict[str, Any]) -> dict[str, list[str]]:
    return {attrs(r)[c.STACK_ID]: split_frames(attrs(r)[c.STACK_FRAMES]) for r in rows(job, c.M_STACK)}


def test_agent_exits_zero(job: dict[str, Any]) -> None:
    assert job["codes"] == [0], job["log"]


def test_collectives_carry_the_stack_they_were_entered_from(job: dict[str, Any]) -> None:
    stacks = shipped(job)
    colls = rows(job, c.M_COLLECTIVE)
    assert colls
    for r in colls:
        a = attrs(r)
        assert a[c.STACK_ID] in stacks, a
        frames = stacks[a[c.STACK_ID]]
        assert frames[0] == "ncclAllReduce" and "main" in frames, frames
    # The id is the content hash of the shipped frames.
    for sid, frames in stacks.items():
        assert stack_id(frames) == sid


def test_a_long_cudamalloc_carries_its_callers(job: dict[str, Any]) -> None:
    stacks = shipped(job)
    mallocs = [r for r in rows(job, c.M_CUDA_MALLOC) if r["rank"] == STALL and r["value_double"] >= 5.0]
    assert mallocs, "no long cudaMalloc"
    stalls = 0
    for r in mallocs:
        frames = stacks[attrs(r)[c.STACK_ID]]
        assert frames[0] == "cudaMalloc", frames
        # The immediate caller is the second frame, whatever cudaMalloc's prologue.
        assert frames[1] in (*CALLERS, SETUP), frames
        assert "main" in frames
        stalls += frames[1] in CALLERS
    assert stalls, "no long cudaMalloc of the stall carried its stack"


def test_each_stack_ships_once_and_points_are_bounded_by_distinct_stacks(job: dict[str, Any]) -> None:
    points = rows(job, c.M_STACK)
    ids = Counter(attrs(r)[c.STACK_ID] for r in points)
    assert max(ids.values()) == 1, ids
    referencing = [r for r in job["events"] if c.STACK_ID in attrs(r) and r["metric_name"] != c.M_STACK]
    # Far more events carry a stack than there are stacks.
    assert len(referencing) > 3 * len(points), (len(referencing), len(points))
    for r in points:
        a = attrs(r)
        assert r["value_int"] == len(split_frames(a[c.STACK_FRAMES]))
        assert isinstance(a[c.STACK_TRUNCATED], bool)


def test_offcpu_intervals_carry_their_switch_out_stack(job: dict[str, Any]) -> None:
    stacks = shipped(job)
    off = [r for r in rows(job, c.M_OFFCPU) if c.STACK_ID in attrs(r)]
    assert off
    for r in off:
        assert attrs(r)[c.STACK_ID] in stacks


def test_breakdown_stack_ids_point_at_shipped_stacks(job: dict[str, Any]) -> None:
    stacks = shipped(job)
    found: Counter[str] = Counter()
    for r in rows(job, c.M_COLLECTIVE):
        a = attrs(r)
        for cls in c.PRE_CLASSES:
            key = f"{c.PRE_PREFIX}{cls}{c.PRE_STACK_SUFFIX}"
            if key in a:
                assert a[key] in stacks
                assert a.get(f"{c.PRE_PREFIX}{cls}_ms", 0) > 0
                found[cls] += 1
        if c.PRE_ONCPU_STACK in a:
            assert a[c.PRE_ONCPU_STACK] in stacks and a[c.PRE_ONCPU_SAMPLES] >= 1
            found["oncpu"] += 1
    # Every window has the data-loader sleep; the stalled rank's windows hold the allocator time.
    assert found["sleeping"] > 0 and found["allocator"] > 0, found
    allocator = [a for a in map(attrs, rows(job, c.M_COLLECTIVE)) if f"{c.PRE_PREFIX}allocator_stack" in a]
    tops = {stacks[a[f"{c.PRE_PREFIX}allocator_stack"]][0] for a in allocator}
    assert tops <= {"cudaMalloc", "cudaFree"}, tops


def test_the_on_cpu_sampler_names_what_a_spinning_rank_ran(job: dict[str, Any]) -> None:
    stacks = shipped(job)
    first = [attrs(r) for r in rows(job, c.M_COLLECTIVE) if r["rank"] == SPIN and attrs(r)[c.SEQ] % 2 == 0]
    sampled = [a for a in first if c.PRE_ONCPU_STACK in a]
    # 80 ms of spinning per window at 49 Hz: ~4 samples each when the thread has its CPU; on a loaded
    # machine the spin loses the CPU (it waits for a wall-clock time), so only a few windows are asserted.
    assert len(sampled) >= 2, (len(sampled), len(first))
    for a in sampled:
        assert a[c.PRE_ONCPU_SAMPLES] >= 1
        # The spin reads the clock through libc and the vDSO (no frame pointers), so the frames between
        # it and main may be skipped: only main is certain.
        assert "main" in stacks[a[c.PRE_ONCPU_STACK]]
