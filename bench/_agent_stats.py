"""Helpers of ``python -m bench agent`` (bench/agent.py): step-time statistics per arm, and the agent's
start-to-attached and stop times with where they go.

Pure functions (``percentile``, ``step_stats``, ``arm_summary``, ``ratio``, ``spread``) are tested in
tests/test_bench_agent_stats.py; the rest starts, waits for and stops real agents. The module name starts
with ``_`` so ``python -m bench`` does not take it for a benchmark.

Why these statistics: issue 20's targets are the median step (<= +1%), the p95 step (<= +3%) and a
single 2x step seen once; a median alone hides the tail the agent's bursts (ring-buffer polls, exporter
flushes, stack symbolisation) would add. Each round's statistic is taken over every rank's steps of that
round (step 0 left out: it pays for communicator setup), then the median over rounds is reported, except
the worst step, which is the worst of all rounds.
"""

from __future__ import annotations

import math
import os
import re
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rankecho.sim.agents import Agent, wait_ready
from rankecho.sim.job import SimJob

ATTACHED = re.compile(r"^(\S+ \S+) rankecho-agent INFO attached \d+ probes to ")
DETACHED = re.compile(r"detached (\d+) uprobes in ([\d.]+) s")
SUMMARY = re.compile(r"delivery summary: (\d+) points acknowledged by Echo, (\d+) rejected for good, "
                     r"(\d+) dropped from a full spool, (\d+) left unsent")  # agent/export.py Delivery
STOP_GRACE_S = 120.0
"""How long a stopping agent may take before it is killed (detaching waits on RCU grace periods: ~5 s
per agent on the 2-vCPU VM, up to ~40 s loaded; see tests/test_no_silent_loss.py)."""


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0 < q <= 1) by nearest rank: the smallest value with at least ``q`` of the
    values at or below it (so p95 of 20 values is the 19th smallest, and always a value that occurred)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q}")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def ratio(a: float, b: float) -> float:
    """``a / b``; NaN when ``b`` is 0 (no baseline: no ratio), never a ZeroDivisionError mid-report."""
    return a / b if b else math.nan


@dataclass(frozen=True)
class StepStats:
    median_ms: float
    p95_ms: float
    max_ms: float


def step_stats(steps_ms: list[float]) -> StepStats:
    return StepStats(statistics.median(steps_ms), percentile(steps_ms, 0.95), max(steps_ms))


def arm_summary(rounds: list[StepStats]) -> StepStats:
    """One arm over its rounds: the median of each round's median and p95, the worst step of any round."""
    return StepStats(statistics.median(r.median_ms for r in rounds),
                     statistics.median(r.p95_ms for r in rounds), max(r.max_ms for r in rounds))


def spread(values: list[float]) -> dict[str, Any]:
    """Median and max of per-agent times (s), and each, for the report; NaN (a figure an agent's log did
    not give) is left out of the median and max, which are NaN only when no agent gave one."""
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return {"median": math.nan, "max": math.nan, "each": values}
    return {"median": statistics.median(known), "max": max(known), "each": values}


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def step_lines(job: SimJob) -> list[list[str]]:
    """Every rank's ``step`` log lines of the job's last run, split, step 0 left out: ``step N start enter
    end ...`` in ns (sim/src/simrank.c; enter: the step's first collective)."""
    out = []
    for r in range(job.world):
        for line in job.rank_log(r).splitlines():
            w = line.split()
            if w and w[0] == "step" and int(w[1]) > 0:
                out.append(w)
    return out


def step_times_ms(job: SimJob) -> list[float]:
    """Every rank's step times (end - start, step 0 left out) of the job's last run."""
    return [(int(w[4]) - int(w[2])) / 1e6 for w in step_lines(job)]


def phase_medians_ms(job: SimJob) -> dict[str, float]:
    return phase_medians(step_lines(job))


def phase_medians(lines: list[list[str]]) -> dict[str, float]:
    """Where a step's time goes, median over split ``step`` lines: before its first collective (data
    loading, forward, backward, their launches and syncs: the rank's own work) and from there to the
    step's end (the collectives, where a rank waits for the slowest, then the optimizer's sync, whose
    own wait is ``final_sync_ms``: the line's fifth field, end minus the sync's start)."""
    return {"to_first_collective_ms": statistics.median((int(w[3]) - int(w[2])) / 1e6 for w in lines),
            "collectives_to_end_ms": statistics.median((int(w[4]) - int(w[3])) / 1e6 for w in lines),
            "final_sync_ms": statistics.median(int(w[5]) / 1e6 for w in lines)}


@dataclass
class AgentTimes:
    """One agent's start and stop, in wall-clock seconds; ``log`` is read for the agent's own figures."""

    node: str
    log: Path
    start_to_ready_s: float = 0.0
    start_to_first_attach_s: float = math.nan
    """Launch to its first 'attached N probes' log line: interpreter start, imports, BPF compile and load."""
    start_cpu_s: float = math.nan
    """CPU time (user + system) the agent had used when it was seen ready: what its start costs a core,
    whatever the machine's load stretches the wall time to."""
    stop_s: float = 0.0
    detach_s: float = math.nan
    """The agent's own 'detached N uprobes in X s' figure (part of ``stop_s``)."""
    uprobes: int = 0
    """N of that line: the uprobes it detached (the kernel releases them one after another)."""
    delivery: dict[str, int] = field(default_factory=dict)


def start_timed(job: SimJob, node: str, endpoint: str, token: str, *extra: str) -> tuple[Agent, AgentTimes]:
    """Launch the node's agent the way SimJob does and wait until its ready file exists (the agent
    writes it once probes are attached, agent/runner.py); the time is launch to the file's mtime, so the
    50 ms poll of :func:`wait_ready` does not count. Agents start one at a time, as each real node's does."""
    t0 = time.time_ns()
    agent = job.start_agent(node, endpoint, token, *extra, wait=False)
    wait_ready([agent])
    times = AgentTimes(node, agent.log, (agent.ready.stat().st_mtime_ns - t0) / 1e9)
    times.start_cpu_s = cpu_ticks(agent.proc.pid) / os.sysconf("SC_CLK_TCK")
    lines = agent.log.read_text().splitlines()
    first = next((m for m in map(ATTACHED.match, lines) if m), None)
    if first:  # logging's asctime: local time, ms resolution
        at = datetime.strptime(first.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        times.start_to_first_attach_s = at - t0 / 1e9
    return agent, times


def stop_timed(agent: Agent, times: AgentTimes) -> int:
    """SIGTERM to exit (the agent drains its ring buffer, flushes its exporter and spool, detaches its
    uprobes, then logs its delivery summary); fills ``times`` and returns the exit code."""
    t0 = time.monotonic()
    agent.stopped_ns = time.time_ns()
    agent.proc.send_signal(signal.SIGTERM)
    try:
        code = agent.proc.wait(timeout=STOP_GRACE_S)
    except Exception:
        agent.proc.kill()
        code = agent.proc.wait()
    times.stop_s = time.monotonic() - t0
    text = times.log.read_text()
    detached = DETACHED.search(text)
    if detached:
        times.uprobes, times.detach_s = int(detached.group(1)), float(detached.group(2))
    summary = SUMMARY.search(text)
    if summary:
        keys = ("acknowledged", "rejected", "dropped", "unsent")
        times.delivery = dict(zip(keys, map(int, summary.groups()), strict=True))
    return int(code)


COMPILE_SCRIPT = """
import sys, time
t0 = time.monotonic()
from rankecho.agent import probes, runner  # noqa: F401  (what the agent imports before it compiles)
t1 = time.monotonic()
bpf = probes.load(probes.ProbeConfig())
t2 = time.monotonic()
bpf.cleanup()
print(t1 - t0, t2 - t1)
"""


def compile_breakdown(python: str, runs: int) -> dict[str, float]:
    """Where an agent's start goes before its first attach, measured apart from it (median of ``runs``):
    interpreter start and exit (wall minus what the script times), the agent's imports, and compiling and
    loading its BPF program (agent/probes.py ``load``: clang, then the kernel verifier)."""
    walls, imports, compiles = [], [], []
    for _ in range(runs):
        t0 = time.monotonic()
        out = subprocess.run([python, "-c", COMPILE_SCRIPT], check=True, capture_output=True, text=True)
        walls.append(time.monotonic() - t0)
        i, c = map(float, out.stdout.split()[-2:])
        imports.append(i)
        compiles.append(c)
    wall, imp, comp = (statistics.median(v) for v in (walls, imports, compiles))
    return {"interpreter_start_and_exit_s": wall - imp - comp, "imports_s": imp, "bpf_compile_load_s": comp}


def echo_counts(metrics_text: str) -> dict[str, float]:
    """Echo's ``/metrics`` counters the bench compares with the agents' summaries (received by signal
    summed; committed = newly stored; duplicates skipped)."""
    out: dict[str, float] = {"received": 0.0, "committed": 0.0, "duplicates": 0.0}
    for line in metrics_text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("rankecho_echo_received_total"):
            out["received"] += float(value)
        elif name == "rankecho_echo_committed_total":
            out["committed"] = float(value)
        elif name == "rankecho_echo_duplicates_skipped_total":
            out["duplicates"] = float(value)
    return out


def timing_report(times: list[AgentTimes]) -> dict[str, Any]:
    """Per-agent start and stop figures as the bench returns them."""
    def vals(attr: str) -> list[float]:
        return [round(getattr(t, attr), 3) for t in times]

    return {
        "agent_start_to_attached_s": spread(vals("start_to_ready_s")),
        "agent_start_to_first_attach_s": spread(vals("start_to_first_attach_s")),
        "agent_start_cpu_s": spread(vals("start_cpu_s")),
        "agent_stop_s": spread(vals("stop_s")),
        "agent_stop_detach_s": spread(vals("detach_s")),
        "agent_uprobes_detached": [t.uprobes for t in times],
        "agent_delivery": {k: sum(t.delivery.get(k, 0) for t in times)
                           for k in ("acknowledged", "rejected", "dropped", "unsent")},
        "agents_without_summary": [t.node for t in times if not t.delivery],
    }
