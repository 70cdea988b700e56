"""Stacks through code built without frame pointers are reported truncated, not wrong (real eBPF).

A copy of the simulator built with ``FRAME_POINTERS=`` (libraries and rank program), 2 ranks, one agent:
the frame-pointer walk cannot get past the first frame there. Every stack must either be marked
truncated or hold only frames that really call each other (no made-up callers from a garbage %rbp)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, row_dicts
from test_agent_helpers import SIM, attrs, requires_ebpf

from rankecho.shared import contract as c
from rankecho.shared.stacks import split_frames
from rankecho.sim.job import SimJob, stop_all

pytestmark = [requires_ebpf, pytest.mark.ebpf]

SIM_ARGS = ["--steps", "6", "--compute-us", "20000", "--kernels", "6", "--buckets", "2",
            "--loader-us", "3000"]
OUTERMOST = ("main", "__libc_start_call_main")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("agent-stacks-nofp")
    sim = tmp / "sim-nofp"
    shutil.copytree(SIM, sim, ignore=shutil.ignore_patterns("build", "build-endbr", "__pycache__"))
    subprocess.run(["make", "-s", "-C", str(sim), "FRAME_POINTERS="], check=True)
    with inproc_echo(tmp / "echo.db") as echo:
        job = SimJob(tmp, ["node-a"], 2, sim)
        agents = job.start_agents(echo.grpc_address, TEST_TOKEN, "--raw-interval-ms", "0")
        job.wait(job.start_ranks(SIM_ARGS))
        codes = stop_all(agents)
        yield {"codes": codes, "events": row_dicts(echo, "SELECT * FROM events")}


CALLERS = {"backward", "run_step"}
"""The rank program's functions that call ncclAllReduce (buckets in backward, split comms in run_step)."""


def test_collective_stacks_are_truncated_or_true(job: dict[str, Any]) -> None:
    assert job["codes"] == [0]
    stacks = {attrs(r)[c.STACK_ID]: attrs(r) for r in job["events"] if r["metric_name"] == c.M_STACK}
    colls = [attrs(r) for r in job["events"] if r["metric_name"] == c.M_COLLECTIVE]
    assert colls
    for a in colls:
        s = stacks[a[c.STACK_ID]]
        frames = split_frames(s[c.STACK_FRAMES])
        assert frames[0] == "ncclAllReduce", frames
        # The entry's return address still names the immediate caller, whatever %rbp holds; past it the
        # walk followed a garbage %rbp: cut there and marked truncated, no made-up outer frames.
        assert len(frames) >= 2 and frames[1] in CALLERS, frames
        assert "[unknown]" not in frames[1:], frames
        assert s[c.STACK_TRUNCATED] or frames[-1] in OUTERMOST, frames


def test_a_one_frame_walk_is_marked_truncated(job: dict[str, Any]) -> None:
    shipped = [attrs(r) for r in job["events"] if r["metric_name"] == c.M_STACK]
    single = [a for a in shipped if len(split_frames(a[c.STACK_FRAMES])) == 1]
    assert all(a[c.STACK_TRUNCATED] for a in single)
    assert any(a[c.STACK_TRUNCATED] for a in shipped), [a[c.STACK_FRAMES] for a in shipped]
