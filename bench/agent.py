"""Cost of the node agent: simulated step time with and without it, agent CPU and RSS, probe cost.

Everything is measured side by side in one run. Two copies of the fake libraries exist per node:
one is traced by that node's agent (its inode carries the uprobes), the other is not; job runs
alternate between them, so both see the same machine load. A third copy is traced by agents started with
``--no-stacks``, so the cost of call stacks (capture at collective entry, long CUDA calls and long
off-CPU intervals, the 49 Hz on-CPU sampler, symbolisation) reads side by side with the agent's
other costs. Needs root, bcc and ``make -C sim``; otherwise it prints why and returns
``{"skipped": reason}``.

    python -m bench agent [--rounds 3] [--steps 30] [--omit-frame-pointers]

The fake libraries are built with frame pointers, as distributions build theirs, so the hot
functions begin with ``push %rbp``, which the kernel emulates when it hits a uprobe.
``--omit-frame-pointers`` measures a temporary copy of sim/ built without them instead: those
functions then begin with ``sub $n,%rsp``, which the kernel single-steps (~11-15 us per probe hit
on a VM), and that cost dominates the numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from rankecho.agent.check import ebpf_missing
from rankecho.sim.job import SimJob, stop_all

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "sim"
TOKEN = "bench-token"
LOOP_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef struct { unsigned x, y, z; } dim3;
static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    int (*sync)(void *) = (int (*)(void *))dlsym(h, "cudaStreamSynchronize");
    int (*launch)(const void *, dim3, dim3, void **, size_t, void *) =
        (int (*)(const void *, dim3, dim3, void **, size_t, void *))dlsym(h, "cudaLaunchKernel");
    int n = atoi(argv[2]);
    dim3 one = {1, 1, 1};
    long long t0 = now();
    for (int i = 0; i < n; i++) sync(NULL);
    long long t1 = now();
    for (int i = 0; i < n; i++) launch((void *)main, one, one, NULL, 0, NULL);
    long long t2 = now();
    sync(NULL);
    printf("%f %f\n", (double)(t1 - t0) / n, (double)(t2 - t1) / n);
    return 0;
}
"""


def skip_reason() -> str | None:
    missing = ebpf_missing()
    if missing:
        return missing
    if subprocess.run(["make", "-s", "-C", str(SIM)]).returncode:  # incremental: rebuilds what is stale
        return "cannot build the simulator (make -C sim)"
    return None


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def rss_kib(pid: int) -> tuple[int, int]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])


def median_step_ms(job: SimJob) -> float:
    steps = []
    for r in range(job.world):
        for line in job.rank_log(r).splitlines():
            w = line.split()
            if w and w[0] == "step" and int(w[1]) > 0:
                steps.append((int(w[4]) - int(w[2])) / 1e6)
    return statistics.median(steps)


def probe_cost(tmp: Path, pairs: dict[str, tuple[Path, Path]], calls: int, rounds: int) -> dict[str, float]:
    """ns added per call: the loop against a traced copy minus the same loop against an untraced one."""
    src = tmp / "loop.c"
    src.write_text(LOOP_C)
    exe = tmp / "loop"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src), "-ldl"], check=True)
    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        for build, libs in pairs.items():
            for traced, lib in zip(("traced", "plain"), libs, strict=True):
                cmd = [str(exe), str(lib), str(calls)]
                res = subprocess.run(cmd, check=True, capture_output=True, text=True)
                for fn, value in zip(("sync", "launch"), map(float, res.stdout.split()), strict=True):
                    samples.setdefault(f"{build}_{fn}_{traced}", []).append(value)
    med = {k: statistics.median(v) for k, v in samples.items()}
    out: dict[str, float] = {}
    for build in pairs:
        for fn in ("sync", "launch"):
            out[f"{build}_{fn}_ns_added"] = med[f"{build}_{fn}_traced"] - med[f"{build}_{fn}_plain"]
            out[f"{build}_{fn}_ns_untraced"] = med[f"{build}_{fn}_plain"]
    return out


def no_frame_pointer_sim(tmp: Path) -> Path:
    """A copy of sim/ built without frame pointers (the tree's own build/ is left alone)."""
    copy = tmp / "sim-nofp"
    shutil.copytree(SIM, copy, ignore=shutil.ignore_patterns("build", "build-endbr", "__pycache__"))
    subprocess.run(["make", "-s", "-C", str(copy), "FRAME_POINTERS="], check=True)
    return copy


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench agent")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--omit-frame-pointers", action="store_true",
                        help="measure the libraries built without frame pointers (single-stepped probes)")
    args = parser.parse_args(argv)
    reason = skip_reason()
    if reason:
        print(f"skipped: {reason}")
        return {"skipped": reason}
    from rankecho.launch.echo import EchoProcess

    sim_args = ["--steps", str(args.steps), "--compute-us", "30000", "--kernels", "60", "--buckets", "2"]
    with tempfile.TemporaryDirectory(prefix="rankecho-bench-agent-") as d:
        tmp = Path(d)
        sim = no_frame_pointer_sim(tmp) if args.omit_frame_pointers else SIM
        with EchoProcess(tmp / "echo.db", token=TOKEN) as echo:
            # node-b runs the endbr64 build of the libraries in both jobs.
            traced = SimJob(tmp / "traced", ["node-a", "node-b"], 4, sim, endbr_nodes=("node-b",))
            plain = SimJob(tmp / "plain", ["node-a", "node-b"], 4, sim, endbr_nodes=("node-b",))
            nostacks = SimJob(tmp / "nostacks", ["node-a", "node-b"], 4, sim, endbr_nodes=("node-b",))
            agents = traced.start_agents(echo.otlp_grpc, TOKEN)
            other_agents = nostacks.start_agents(echo.otlp_grpc, TOKEN, "--no-stacks")
            step_ms: dict[str, list[float]] = {"without": [], "with": [], "no_stacks": []}
            cpu_ticks_used, traced_wall = 0, 0.0
            for _ in range(args.rounds):
                for name, job in (("without", plain), ("no_stacks", nostacks), ("with", traced)):
                    before = sum(cpu_ticks(a.proc.pid) for a in agents)
                    t0 = time.monotonic()
                    job.wait(job.start_ranks(sim_args))
                    if name == "with":
                        traced_wall += time.monotonic() - t0
                        time.sleep(1.0)  # let the agents ship the run's last batch
                        traced_wall += 1.0
                        cpu_ticks_used += sum(cpu_ticks(a.proc.pid) for a in agents) - before
                    step_ms[name].append(median_step_ms(job))
            rss = [rss_kib(a.proc.pid) for a in agents]
            cudart = "libcudart.so.12"
            pairs = {
                "plain": (traced.lib_dir("node-a") / cudart, plain.lib_dir("node-a") / cudart),
                "endbr": (traced.lib_dir("node-b") / cudart, plain.lib_dir("node-b") / cudart),
                "nostacks": (nostacks.lib_dir("node-a") / cudart, plain.lib_dir("node-a") / cudart),
            }
            probes = probe_cost(tmp, pairs, args.calls, args.rounds * 2)
            stop_all(agents + other_agents)
    without, with_ = statistics.median(step_ms["without"]), statistics.median(step_ms["with"])
    no_stacks = statistics.median(step_ms["no_stacks"])
    hz = os.sysconf("SC_CLK_TCK")
    cpu_pct = 100.0 * cpu_ticks_used / hz / traced_wall / len(agents)
    result = {
        "libraries": "without frame pointers" if args.omit_frame_pointers else "with frame pointers",
        "step_ms_without_agent": without,
        "step_ms_with_agent": with_,
        "step_time_ratio": with_ / without,
        "step_ms_with_agent_no_stacks": no_stacks,
        "step_time_ratio_no_stacks": no_stacks / without,
        "stacks_step_time_ratio": with_ / no_stacks,
        "agent_cpu_pct_of_one_core_per_agent": cpu_pct,
        "ranks_per_agent": 4,
        "agent_rss_mib": max(r[0] for r in rss) / 1024,
        "agent_peak_rss_mib": max(r[1] for r in rss) / 1024,
        **probes,
    }
    print(f"libraries: {result['libraries']}")
    print(f"step time (median, 8 ranks, {args.rounds} alternating rounds): without {without:.2f} ms, "
          f"with agents {with_:.2f} ms, ratio {with_ / without:.4f} (target <= 1.01)")
    print(f"call stacks: with agents but --no-stacks {no_stacks:.2f} ms (ratio {no_stacks / without:.4f}); "
          f"stacks on vs off {with_ / no_stacks:.4f}")
    print(f"agent CPU: {cpu_pct:.2f}% of one core per agent (4 ranks each; target <= 5% for 8 ranks); "
          f"RSS {result['agent_rss_mib']:.0f} MiB (peak {result['agent_peak_rss_mib']:.0f} MiB)")
    for build, what in (("plain", "plain prologue"), ("endbr", "endbr64 prologue")):
        print(f"probe cost, {what}: cudaStreamSynchronize +{probes[f'{build}_sync_ns_added']:.0f} ns/call "
              f"(entry+return, one record), cudaLaunchKernel +{probes[f'{build}_launch_ns_added']:.0f} "
              "ns/call (in-kernel count)")
    print(f"probe cost, plain prologue, agent with --no-stacks: cudaStreamSynchronize "
          f"+{probes['nostacks_sync_ns_added']:.0f} ns/call (the difference is the entry stack a sync takes)")
    return result
