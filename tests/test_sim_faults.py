"""Each fault kind leaves the signature it claims, observed from outside the rank process.

A sampler reads the rank thread's /proc schedstat (time on CPU, time runnable but waiting) and the
syscall it is blocked in, every few ms, while a 4-rank cluster runs one fault of each kind.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path

import pytest

from rankecho.sim.groundtruth import RankLog, read_rank_logs
from rankecho.sim.launcher import LaunchOptions, RunResult, run_scenario
from rankecho.sim.observe import Sampler, Window, read_thread
from rankecho.sim.scenario import parse_scenario

PPOLL, FUTEX, CLOCK_NANOSLEEP = 271, 202, 230
MS = 150.0
FAULTS = [  # (rank, kind, step)
    (1, "host_compute", 12),
    (2, "dataloader_stall", 15),
    (3, "cpu_contention", 18),
    (0, "slow_gpu", 21),
    (1, "alloc_stall", 24),
]


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunResult, dict[int, RankLog], Sampler]:
    if not Path(f"/proc/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("this kernel has no schedstat (CONFIG_SCHED_INFO)")
    if read_thread(os.getpid(), threading.get_native_id()) is None:
        pytest.skip("this kernel does not show a thread's syscall (/proc/PID/task/TID/syscall)")
    run_dir = tmp_path_factory.mktemp("faults")
    scenario = parse_scenario(
        {
            "cluster_id": "t-faults",
            "steps": 28,
            "step": {"compute_ms": 10, "host_ms": 0.2, "dataloader_ms": 0.2, "allreduce_mb": 2},
            "nodes": [{"id": "n0", "ranks": 2}, {"id": "n1", "ranks": 2}],
            "faults": [{"rank": r, "kind": k, "ms": MS, "every": 100, "start_step": s} for r, k, s in FAULTS],
        },
        "faults",
    )
    done: list[RunResult] = []
    runner = threading.Thread(
        target=lambda: done.append(
            run_scenario(scenario, LaunchOptions(run_dir=run_dir, progress=None, timeout_s=90))
        )
    )
    runner.start()
    deadline = time.monotonic() + 30
    while True:
        logs = read_rank_logs(run_dir, scenario)
        if all(log.tid for log in logs.values()):
            break
        assert time.monotonic() < deadline, "ranks did not start"
        time.sleep(0.005)
    sampler = Sampler([(log.pid, log.tid) for log in logs.values()], interval_s=0.004)
    sampler.start()
    runner.join()
    sampler.stop()
    assert done and done[0].returncode == 0
    logs = read_rank_logs(run_dir, scenario)
    assert all(min(log.steps[12].start_ns, 10**30) > 0 for log in logs.values())
    return done[0], logs, sampler


def window(
    observed: tuple[RunResult, dict[int, RankLog], Sampler], rank: int, start: int, end: int
) -> Window:
    _, logs, sampler = observed
    return sampler.window(logs[rank].tid, start, end)


MIN_EVIDENCE = 5
"""Samples that named a blocking syscall, at the least, before a window says where the rank sleeps."""


def mostly(w: Window, *syscalls: int) -> bool:
    """Most samples that caught the thread in a syscall caught it in one of ``syscalls``.

    Fewer than :data:`MIN_EVIDENCE` such samples is no evidence either way, and that is a failure: a
    check that passes when nothing could be read proves nothing (the fixture skips the module when this
    kernel does not show a thread's syscall at all)."""
    known = sum(n for nr, n in w.syscalls.items() if nr != -1)
    assert known >= MIN_EVIDENCE, f"only {known} samples saw the thread in a syscall: {w}"
    return sum(w.syscalls[nr] for nr in syscalls) >= 0.6 * known


def test_ground_truth_names_each_injected_cause(
    observed: tuple[RunResult, dict[int, RankLog], Sampler],
) -> None:
    truth = observed[0].truth
    assert truth is not None
    for rank, kind, step in FAULTS:
        row = next(r for r in truth["per_step"][step]["ranks"] if r["rank"] == rank)
        assert row["cause"] == kind
        others = [r["cause"] for r in truth["per_step"][step]["ranks"] if r["rank"] != rank]
        assert others == [None] * 3
        assert (rank, kind) in {(x["rank"], x["cause"]) for x in truth["per_step"][step]["stragglers"]}
    # A slow GPU shows in when the GPU reached the collective more than in when the host called it.
    slow = next(r for r in truth["per_step"][21]["ranks"] if r["rank"] == 0)
    assert slow["gpu_late_by_ms"] >= 0.8 * MS
    assert slow["entered_late_by_ms"] <= slow["gpu_late_by_ms"] - 0.3 * MS


def test_host_compute_is_on_cpu(observed: tuple[RunResult, dict[int, RankLog], Sampler]) -> None:
    rec = observed[1][1].steps[12]
    w = window(observed, 1, rec.enter_ns - int(0.9 * MS * 1e6), rec.enter_ns - 2_000_000)
    assert rec.enter_ns - rec.start_ns >= MS * 1e6
    # Never blocked: running, or runnable when the (shared, two-core) machine is busy.
    assert w.sleep_ms <= 0.1 * w.wall_ms, w
    assert w.cpu_ms >= 0.15 * w.wall_ms, w


def test_dataloader_stall_sleeps_off_cpu_in_poll(
    observed: tuple[RunResult, dict[int, RankLog], Sampler],
) -> None:
    rec = observed[1][2].steps[15]
    assert rec.loader_ns >= MS * 1e6
    w = window(observed, 2, rec.start_ns + 5_000_000, rec.start_ns + rec.loader_ns - 5_000_000)
    assert w.cpu_ms <= 0.2 * w.wall_ms and w.run_delay_ms <= 0.2 * w.wall_ms, w
    assert mostly(w, PPOLL), w.syscalls


@pytest.mark.skipif(
    os.geteuid() != 0, reason="the noisy neighbour needs CAP_SYS_NICE for SCHED_FIFO (run as root)"
)
def test_cpu_contention_preempts_a_runnable_thread(
    observed: tuple[RunResult, dict[int, RankLog], Sampler],
) -> None:
    rec = observed[1][3].steps[18]
    # schedstat adds a wait to run_delay when the thread gets a CPU again, so end just after enter.
    w = window(observed, 3, rec.enter_ns - int(0.9 * MS * 1e6), rec.enter_ns + 3_000_000)
    assert w.run_delay_ms >= 0.5 * w.wall_ms, w
    assert w.cpu_ms <= 0.08 * w.wall_ms, w


def test_slow_gpu_lengthens_syncs_not_host_work(
    observed: tuple[RunResult, dict[int, RankLog], Sampler],
) -> None:
    steps = observed[1][0].steps
    healthy = statistics.median(s.fwd_sync_ns for s in steps if s.step not in (12, 15, 18, 21, 24))
    rec = steps[21]
    assert rec.fwd_sync_ns - healthy >= 0.25 * MS * 1e6  # a third of the extra GPU time is in the forward
    assert rec.loader_ns < 20e6 and rec.alloc_ns < 20e6
    w = window(observed, 0, rec.start_ns + rec.loader_ns + rec.alloc_ns, rec.enter_ns)
    assert w.cpu_ms <= 0.35 * w.wall_ms, w
    assert mostly(w, FUTEX, CLOCK_NANOSLEEP), w.syscalls


def test_alloc_stall_sleeps_in_cuda_malloc(observed: tuple[RunResult, dict[int, RankLog], Sampler]) -> None:
    rec = observed[1][1].steps[24]
    assert rec.alloc_ns >= 0.9 * MS * 1e6
    begin = rec.start_ns + rec.loader_ns
    w = window(observed, 1, begin + 3_000_000, begin + rec.alloc_ns - 3_000_000)
    assert w.cpu_ms <= 0.2 * w.wall_ms, w
    assert mostly(w, CLOCK_NANOSLEEP, FUTEX), w.syscalls
