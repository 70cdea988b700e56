"""Cost of the node agent: simulated step time with and without it, agent CPU and RSS, probe cost.

Everything is measured side by side in one run. Two copies of the fake libraries exist per node:
one is traced by that node's agent (its inode carries the uprobes), the other is not; job runs
alternate between them, so both see the same machine load. A third copy is traced by agents started with
``--no-stacks``, so the cost of call stacks (capture at collective entry, long CUDA calls and long
off-CPU intervals, the 49 Hz on-CPU sampler, symbolisation) reads side by side with the agent's
other costs. Needs root, bcc and ``make -C sim``; otherwise it prints why and returns
``{"skipped": reason}``.

    python -m bench agent [--rounds 3] [--steps 30] [--omit-frame-pointers] [--scenario PATH]

``--scenario sim/scenarios/healthy.yaml`` runs that scenario's job shape (its nodes, ranks, steps and step
options, as ``rankecho sim`` gives each rank) instead of the built-in 2 x 4-rank, 30-step job. Each arm
(without agents, with agents, with agents ``--no-stacks``) reports its median, p95 and worst step; each
agent its launch-to-attached time (agents start one at a time, as on real nodes) and its SIGTERM-to-exit
time, and whether every point it acknowledged reached Echo (bench/_agent_stats.py).

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
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench._agent_job import builtin_shape, scenario_shape
from bench._agent_stats import (
    AgentTimes,
    StepStats,
    arm_summary,
    compile_breakdown,
    cpu_ticks,
    echo_counts,
    phase_medians_ms,
    ratio,
    start_timed,
    step_stats,
    step_times_ms,
    stop_timed,
    timing_report,
)
from rankecho.agent.check import ebpf_missing
from rankecho.sim.agents import Agent
from rankecho.sim.job import SimJob

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


def rss_kib(pid: int) -> tuple[int, int]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])


def median_step_ms(job: SimJob) -> float:
    return statistics.median(step_times_ms(job))


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


def start_agents(job: SimJob, endpoint: str, *extra: str) -> tuple[list[Agent], list[AgentTimes]]:
    """One agent per node, each started alone and timed to attached (bench/_agent_stats.py)."""
    started = [start_timed(job, node, endpoint, TOKEN, *extra) for node in job.nodes]
    return [a for a, _ in started], [t for _, t in started]


def loadavg() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench agent")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per job run (default: 30, or the scenario's)")
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--omit-frame-pointers", action="store_true",
                        help="measure the libraries built without frame pointers (single-stepped probes)")
    parser.add_argument("--scenario", type=Path, default=None,
                        help="run this scenario file's job shape (e.g. sim/scenarios/healthy.yaml)")
    args = parser.parse_args(argv)
    shape = scenario_shape(args.scenario, args.steps) if args.scenario else builtin_shape(args.steps)
    reason = skip_reason()
    if reason:
        print(f"skipped: {reason}")
        return {"skipped": reason}
    from rankecho.launch.echo import EchoProcess

    load_before = loadavg()
    compile_times = compile_breakdown(sys.executable, args.rounds)
    with tempfile.TemporaryDirectory(prefix="rankecho-bench-agent-") as d:
        tmp = Path(d)
        sim = no_frame_pointer_sim(tmp) if args.omit_frame_pointers else SIM
        with EchoProcess(tmp / "echo.db", token=TOKEN) as echo:
            def job(name: str) -> SimJob:
                return SimJob(tmp / name, shape.nodes, shape.ranks_per_node, sim,
                              endbr_nodes=shape.endbr_nodes, cluster_id=shape.cluster_id)

            traced, plain, nostacks = job("traced"), job("plain"), job("nostacks")
            agents, times = start_agents(traced, echo.otlp_grpc)
            other_agents, other_times = start_agents(nostacks, echo.otlp_grpc, "--no-stacks")
            step_ms: dict[str, list[float]] = {"without": [], "with": [], "no_stacks": []}
            stats: dict[str, list[StepStats]] = {"without": [], "with": [], "no_stacks": []}
            phases: dict[str, list[dict[str, float]]] = {"without": [], "with": [], "no_stacks": []}
            cpu_ticks_used, traced_wall = 0, 0.0
            for _ in range(args.rounds):
                for name, j in (("without", plain), ("no_stacks", nostacks), ("with", traced)):
                    before = sum(cpu_ticks(a.proc.pid) for a in agents)
                    t0 = time.monotonic()
                    j.wait(j.start_ranks(shape.args, shape.per_rank), timeout_s=60.0 + shape.steps)
                    if name == "with":
                        traced_wall += time.monotonic() - t0
                        time.sleep(1.0)  # let the agents ship the run's last batch
                        traced_wall += 1.0
                        cpu_ticks_used += sum(cpu_ticks(a.proc.pid) for a in agents) - before
                    steps = step_times_ms(j)
                    step_ms[name].append(statistics.median(steps))
                    stats[name].append(step_stats(steps))
                    phases[name].append(phase_medians_ms(j))
            rss = [rss_kib(a.proc.pid) for a in agents]
            cudart = "libcudart.so.12"
            node_plain = next((n for n in shape.nodes if n not in shape.endbr_nodes), None)
            candidates = {"plain": node_plain, "endbr": shape.endbr_nodes[0] if shape.endbr_nodes else None,
                          "nostacks": node_plain}
            pairs = {
                build: ((nostacks if build == "nostacks" else traced).lib_dir(node) / cudart,
                        plain.lib_dir(node) / cudart)
                for build, node in candidates.items() if node is not None
            }
            probes = probe_cost(tmp, pairs, args.calls, args.rounds * 2)
            everyone = zip(agents + other_agents, times + other_times, strict=True)
            codes = [stop_timed(a, t) for a, t in everyone]  # one at a time, as each node's own
            metrics = urllib.request.urlopen(f"http://{echo.listening['otlp_http']}/metrics", timeout=10)
            echo_seen = echo_counts(metrics.read().decode())
    load_after = loadavg()
    without, with_ = statistics.median(step_ms["without"]), statistics.median(step_ms["with"])
    no_stacks = statistics.median(step_ms["no_stacks"])
    arms = {name: arm_summary(rounds) for name, rounds in stats.items()}
    hz = os.sysconf("SC_CLK_TCK")
    cpu_pct = 100.0 * cpu_ticks_used / hz / traced_wall / len(agents)
    timing = timing_report(times + other_times)
    acked = timing["agent_delivery"]["acknowledged"]
    result = {
        "libraries": "without frame pointers" if args.omit_frame_pointers else "with frame pointers",
        "job": shape.label,
        "step_ms_without_agent": without,
        "step_ms_with_agent": with_,
        "step_time_ratio": with_ / without,
        "step_ms_with_agent_no_stacks": no_stacks,
        "step_time_ratio_no_stacks": no_stacks / without,
        "stacks_step_time_ratio": with_ / no_stacks,
        "step_stats_ms": {name: vars(s) for name, s in arms.items()},
        "step_phases_ms": {name: {k: statistics.median(p[k] for p in rounds) for k in rounds[0]}
                           for name, rounds in phases.items()},
        "step_median_ratio": ratio(arms["with"].median_ms, arms["without"].median_ms),
        "step_p95_ratio": ratio(arms["with"].p95_ms, arms["without"].p95_ms),
        "step_max_ratio": ratio(arms["with"].max_ms, arms["without"].max_ms),
        "step_median_ratio_no_stacks": ratio(arms["no_stacks"].median_ms, arms["without"].median_ms),
        "step_p95_ratio_no_stacks": ratio(arms["no_stacks"].p95_ms, arms["without"].p95_ms),
        "agent_cpu_pct_of_one_core_per_agent": cpu_pct,
        "ranks_per_agent": shape.ranks_per_node,
        "agent_rss_mib": max(r[0] for r in rss) / 1024,
        "agent_peak_rss_mib": max(r[1] for r in rss) / 1024,
        **probes,
        **timing,
        "agent_start_breakdown": compile_times,
        "agent_exit_codes": codes,
        "echo_counts": echo_seen,
        "points_lost": acked - echo_seen["committed"],
        "load_before": load_before,
        "load_after": load_after,
    }
    report(result, args.rounds)
    return result


def report(r: dict[str, Any], rounds: int) -> None:
    """The human-readable lines of a result (the same numbers ``run`` returns)."""
    print(f"job: {r['job']}; libraries: {r['libraries']}; load {r['load_before']} -> {r['load_after']}")
    print(f"step time (median, {rounds} alternating rounds): without {r['step_ms_without_agent']:.2f} ms, "
          f"with agents {r['step_ms_with_agent']:.2f} ms, ratio {r['step_time_ratio']:.4f} (target <= 1.01)")
    for name, s in r["step_stats_ms"].items():
        print(f"  {name:>9}: median {s['median_ms']:.2f} ms, p95 {s['p95_ms']:.2f} ms, "
              f"worst {s['max_ms']:.2f} ms")
    for name, ph in r["step_phases_ms"].items():
        print(f"  {name:>9}: to the first collective {ph['to_first_collective_ms']:.2f} ms, from there to "
              f"the end {ph['collectives_to_end_ms']:.2f} ms, of which the last sync "
              f"{ph['final_sync_ms']:.2f} ms (medians)")
    print(f"  with/without: median x{r['step_median_ratio']:.4f} (target <= 1.01), p95 "
          f"x{r['step_p95_ratio']:.4f} (target <= 1.03), worst x{r['step_max_ratio']:.3f}")
    print(f"call stacks: with agents but --no-stacks {r['step_ms_with_agent_no_stacks']:.2f} ms (ratio "
          f"{r['step_time_ratio_no_stacks']:.4f}); stacks on vs off {r['stacks_step_time_ratio']:.4f}")
    print(f"agent CPU: {r['agent_cpu_pct_of_one_core_per_agent']:.2f}% of one core per agent "
          f"({r['ranks_per_agent']} ranks each; target <= 5% for 8 ranks); RSS {r['agent_rss_mib']:.0f} MiB "
          f"(peak {r['agent_peak_rss_mib']:.0f} MiB)")
    for build, what in (("plain", "plain prologue"), ("endbr", "endbr64 prologue")):
        if f"{build}_sync_ns_added" in r:
            print(f"probe cost, {what}: cudaStreamSynchronize +{r[f'{build}_sync_ns_added']:.0f} ns/call "
                  f"(entry+return, one record), cudaLaunchKernel +{r[f'{build}_launch_ns_added']:.0f} "
                  "ns/call (in-kernel count)")
    print(f"probe cost, plain prologue, agent with --no-stacks: cudaStreamSynchronize "
          f"+{r['nostacks_sync_ns_added']:.0f} ns/call (the difference is the entry stack a sync takes)")
    st, first, stop, detach = (r[k] for k in ("agent_start_to_attached_s", "agent_start_to_first_attach_s",
                                              "agent_stop_s", "agent_stop_detach_s"))
    b = r["agent_start_breakdown"]
    print(f"agent start to attached: median {st['median']:.2f} s, max {st['max']:.2f} s (target <= 2 s); "
          f"to its first attach {first['median']:.2f} s; apart: interpreter "
          f"{b['interpreter_start_and_exit_s']:.2f} s, imports {b['imports_s']:.2f} s, "
          f"BPF compile+load {b['bpf_compile_load_s']:.2f} s; CPU used by then "
          f"{r['agent_start_cpu_s']['median']:.2f} s (median)")
    print(f"agent stop (SIGTERM to exit): median {stop['median']:.2f} s, max {stop['max']:.2f} s "
          f"(target <= 2 s); of which detaching uprobes median {detach['median']:.2f} s, max "
          f"{detach['max']:.2f} s ({r['agent_uprobes_detached']} uprobes); "
          f"exit codes {r['agent_exit_codes']}")
    print(f"points: agents acknowledged {r['agent_delivery']}, Echo {r['echo_counts']}; "
          f"lost {r['points_lost']:.0f}")
