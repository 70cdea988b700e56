"""Ground truth for a simulated run, computed from what the rank processes logged they did.

Each simrank process writes one line per step: when the step started, the wall-clock time it
entered the step's first all-reduce, when its final stream sync returned, how long that sync
blocked and which faults fired. From those lines this module derives, per step and rank,
``entered_late_by_ms`` (host enter time minus the median of the ranks no fault struck at that step:
what "on time" was), ``gpu_late_by_ms`` (the same for the time the GPU reached the collective) and the
injected cause: a rank is a straggler at a step when either lateness reaches the scenario's
threshold. A diagnosis is scored against this. Usage::

    logs = read_rank_logs(run_dir, scenario)
    truth = build_ground_truth(scenario, logs)
    Path("truth.json").write_text(json.dumps(truth, indent=1))
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankecho.sim.faultsites import FAULT_SITES, fault_frame, fault_function
from rankecho.sim.scenario import FAILURE_KINDS, Fault, Scenario
from rankecho.sim.scenario_pipeline import PIPELINE_COMM, pipeline_truth, slowed_pairs


@dataclass(frozen=True)
class StepRecord:
    step: int
    start_ns: int
    enter_ns: int
    end_ns: int
    sync_wait_ns: int
    loader_ns: int
    alloc_ns: int
    fwd_sync_ns: int
    gpu_arrive_ns: int
    """When the GPU reached the step's first all-reduce (CUDA events; wall clock)."""
    causes: tuple[tuple[str, float], ...]
    """(fault kind, injected ms) for every fault that fired on this rank at this step."""


@dataclass
class RankLog:
    rank: int
    node_id: str = ""
    local_rank: int = 0
    pid: int = 0
    tid: int = 0
    comms: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """communicator name -> (hash hex, rank in communicator, communicator size)"""
    steps: list[StepRecord] = field(default_factory=list)
    start_ns: int = 0
    """Wall-clock ns when the process entered main()."""
    done_ns: int = 0
    """Wall-clock ns after it destroyed its communicators; 0 if it never got there."""
    failures: list[tuple[str, int, float]] = field(default_factory=list)
    """(kind, step, value) of each hang, crash or desync that fired, logged before it acted (value: a
    hang's ms, 0 for good; a crash's exit status; 0 for a desync)."""
    links: dict[int, tuple[float, float]] = field(default_factory=dict)
    """step -> (rank factor, NIC factor) of the slow_link faults that fired on this rank there."""
    colls: dict[tuple[int, str, int], int] = field(default_factory=dict)
    """(step, communicator, bucket) -> wall-clock ns the rank called that all-reduce (``coll`` lines, only
    logged when a fault chose its collective with comm/bucket)."""

    @property
    def finished(self) -> bool:
        return self.done_ns > 0


def rank_log_path(run_dir: Path, node_id: str, rank: int) -> Path:
    return run_dir / node_id / f"rank{rank}.log"


def parse_rank_log(text: str, rank: int) -> RankLog:
    """Parse one simrank log; a truncated last line (process still writing) is ignored."""
    log = RankLog(rank=rank)
    for line in text.split("\n")[:-1]:  # the piece after the last newline may be half-written
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "rank" and len(parts) >= 14:
            log.local_rank, log.node_id = int(parts[5]), parts[7]
            log.pid, log.tid, log.start_ns = int(parts[9]), int(parts[11]), int(parts[13])
        elif parts[0] == "comm" and len(parts) == 5:
            log.comms[parts[1]] = (parts[2], int(parts[3]), int(parts[4]))
        elif parts[0] == "step" and len(parts) == 11:
            causes: tuple[tuple[str, float], ...] = ()
            if parts[10] != "-":
                causes = tuple((kind, float(ms)) for kind, ms in (c.split(":") for c in parts[10].split(",")))
            k, start, enter, end, wait, loader, alloc, fwd, gpu = (int(p) for p in parts[1:10])
            log.steps.append(StepRecord(k, start, enter, end, wait, loader, alloc, fwd, gpu, causes))
        elif parts[0] == "fault" and len(parts) == 4:
            log.failures.append((parts[1], int(parts[2]), float(parts[3])))
        elif parts[0] == "link" and len(parts) == 4:
            log.links[int(parts[1])] = (float(parts[2]), float(parts[3]))
        elif parts[0] == "coll" and len(parts) == 5:
            log.colls[(int(parts[1]), parts[2], int(parts[3]))] = int(parts[4])
        elif parts[0] == "done" and len(parts) == 2:
            log.done_ns = int(parts[1])
    return log


def read_rank_logs(run_dir: Path, scenario: Scenario) -> dict[int, RankLog]:
    logs = {}
    for rank, node, _local in scenario.rank_layout():
        path = rank_log_path(run_dir, node.id, rank)
        logs[rank] = parse_rank_log(path.read_text() if path.exists() else "", rank)
    return logs


def _ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def communicator_members(logs: dict[int, RankLog]) -> list[dict[str, Any]]:
    """Every communicator instance seen in the logs, its members as world ranks in comm-rank order."""
    groups: dict[tuple[str, str], dict[int, int]] = {}
    sizes: dict[tuple[str, str], int] = {}
    for world_rank, log in sorted(logs.items()):
        for name, (hash_hex, comm_rank, size) in log.comms.items():
            groups.setdefault((name, hash_hex), {})[comm_rank] = world_rank
            sizes[(name, hash_hex)] = size
    return [
        {"name": name, "hash": h, "size": sizes[(name, h)], "members": [m[r] for r in sorted(m)]}
        for (name, h), m in sorted(groups.items())
    ]


def failures(logs: dict[int, RankLog]) -> list[dict[str, Any]]:
    """Every hang, crash and desync that really fired, by step then rank: the rank, the step whose first
    collective it struck, and for a crash its exit status, for a hang its length (``null``: for good)."""
    out: list[dict[str, Any]] = []
    for rank, log in sorted(logs.items()):
        for kind, step, value in log.failures:
            entry: dict[str, Any] = {"kind": kind, "rank": rank, "step": step}
            if kind == "crash":
                entry["status"] = int(value)
            elif kind == "hang":
                entry["ms"] = value or None
            out.append(entry)
    return sorted(out, key=lambda e: (e["step"], e["rank"]))


def fired_steps(scenario: Scenario, fault: Fault, logs: dict[int, RankLog]) -> list[int]:
    """The steps ``fault`` really fired at, from its ranks' logs: a delay's scheduled steps where one of them
    logged its kind as a cause, a slow_link's where one logged its factor, a failure's logged step."""
    struck = scenario.fault_ranks(fault)
    if fault.kind in FAILURE_KINDS:
        return sorted({s for r in struck for kind, s, _ in logs[r].failures if kind == fault.kind})
    if fault.kind == "slow_link":
        return sorted({s for r in struck for s, fac in logs[r].links.items() if max(fac) >= fault.factor})
    logged = {rec.step for r in struck for rec in logs[r].steps if fault.kind in (k for k, _ in rec.causes)}
    return [s for s in fault.fire_steps(scenario.steps) if s in logged]


def late_at(scenario: Scenario, fault: Fault, logs: dict[int, RankLog]) -> list[dict[str, Any]]:
    """For a fault that chose its collective (``comm``/``bucket``): at each step it fired, how late each of
    its ranks called that all-reduce against the median of its group's members the fault spared."""
    comm, bucket = fault.comm or "world", fault.bucket or 0
    struck = scenario.fault_ranks(fault)
    groups = [c["members"] for c in communicator_members(logs) if c["name"] == comm]
    out = []
    for step in fired_steps(scenario, fault, logs):
        for rank in struck:
            members = next((g for g in groups if rank in g), [rank])
            calls = {m: logs[m].colls.get((step, comm, bucket)) for m in members}
            spared = [ns for m, ns in calls.items() if ns is not None and m not in struck]
            mine = calls[rank]
            if mine is None or not spared:
                continue  # it never called it (a crash, a hang for good), or nobody spared to compare with
            late = _ms(mine - statistics.median(spared))
            out.append({"step": step, "rank": rank, "comm": comm, "bucket": bucket, "late_by_ms": late,
                        "call_ns": mine})  # fmt: skip
    return out


BUS_GBPS, LAT_US = 80.0, 20.0
"""The fake libnccl's default bus bandwidth and per-collective latency (sim/src/simint.h)."""


def transfer_ms(scenario: Scenario, size: int, nbytes: float, slow: float = 1.0) -> float:
    """The fake libnccl's all-reduce transfer time (comm.c transfer_ns): latency plus 2(n-1)/n of the
    bytes at the bus bandwidth divided by ``slow``."""
    gbps = scenario.bus_gbps or BUS_GBPS
    algo = 2.0 * (size - 1) / size if size > 1 else 0.0
    return round((LAT_US * 1000 + algo * nbytes * slow / gbps) / 1e6, 3)


def slow_links(scenario: Scenario, logs: dict[int, RankLog]) -> list[dict[str, Any]]:
    """One entry per slow_link fault: who (a rank, or a node's NIC), the factor, the steps it really fired
    (logged by its ranks), and each communicator it slows with the true transfer time of one of its
    instances, healthy and slowed (a node's NIC slows only communicators spanning two or more nodes)."""
    node_of = {rank: node.id for rank, node, _ in scenario.rank_layout()}
    comms = communicator_members(logs)
    world_bytes = (int(scenario.step.allreduce_mb * 2**20) // scenario.step.buckets // 2) * 2
    split_bytes = {c.name: int(c.allreduce_mb * 2**20) // 2 * 2 for c in scenario.communicators}
    out: list[dict[str, Any]] = []
    for f in scenario.faults:
        if f.kind != "slow_link":
            continue
        struck = set(scenario.fault_ranks(f))
        steps = fired_steps(scenario, f, logs)
        slowed = []
        pairs = slowed_pairs(scenario, struck, f.node is not None, f.factor)
        for c in comms:
            spans = len({node_of[m] for m in c["members"]}) > 1
            if c["size"] < 2 or not struck & set(c["members"]) or (f.node is not None and not spans):
                continue
            if c["name"] == PIPELINE_COMM:  # send/recv pairs, not an all-reduce: the pairs it slows
                mine = [p for p in pairs if p["src"] in c["members"] and p["dst"] in c["members"]]
                if mine:
                    slowed.append({"name": c["name"], "hash": c["hash"], "members": c["members"],
                                   "inter_node": spans, "pairs": mine})  # fmt: skip
                continue
            nbytes = world_bytes if c["name"] == "world" else split_bytes.get(c["name"], 0)
            slowed.append({
                "name": c["name"], "hash": c["hash"], "members": c["members"], "inter_node": spans,
                "bytes": nbytes, "transfer_ms": transfer_ms(scenario, c["size"], nbytes),
                "slow_transfer_ms": transfer_ms(scenario, c["size"], nbytes, f.factor),
            })
        out.append({
            "scope": "node" if f.node is not None else "rank", "node_id": f.node if f.node is not None
            else node_of[f.rank or 0], "rank": f.rank, "ranks": sorted(struck), "factor": f.factor,
            "every": f.every, "start_step": f.start_step, "steps": steps, "communicators": slowed,
        })
    return out


def build_ground_truth(
    scenario: Scenario, logs: dict[int, RankLog], observed: list[dict[str, Any]] | None = None,
    clocks: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ground-truth document (see docs/sim.md for its fields). ``observed``: the spans each node's
    agents saw ({node_id, from_ns, to_ns}, wall clock), when agents ran; ``clocks``: the drifting or
    stepped nodes' clock fields (sim/clocks.py)."""
    def site(kind: str) -> dict[str, str | None]:
        """Where a fault of ``kind`` ran in this scenario's rank program (sim/faultsites.py)."""
        if kind not in FAULT_SITES:  # slow_link: no function of the rank's, the transfer is slower
            return {"function": None, "frame": None}
        return {"function": fault_function(kind), "frame": fault_frame(kind, scenario.program)}

    by_step: dict[int, dict[int, StepRecord]] = {}
    for rank, log in logs.items():
        for rec in log.steps:
            by_step.setdefault(rec.step, {})[rank] = rec
    chosen = {i: late_at(scenario, f, logs) for i, f in enumerate(scenario.faults)
              if f.comm is not None or f.bucket is not None}  # fmt: skip
    late_there = {(e["step"], e["rank"]): e["late_by_ms"] for entries in chosen.values() for e in entries}
    steps_out: list[dict[str, Any]] = []
    for step in sorted(by_step):
        recs = by_step[step]
        # "On time" is what the ranks no fault struck did (all ranks if every one was struck): a whole
        # late node must not move the reference it is late against.
        on_time = [r for r in recs.values() if not r.causes] or list(recs.values())
        median = statistics.median(r.enter_ns for r in on_time)
        gpu_median = statistics.median(r.gpu_arrive_ns for r in on_time)
        ranks: list[dict[str, Any]] = []
        for rank in sorted(recs):
            r = recs[rank]
            ranks.append(
                {
                    "rank": rank,
                    "enter_ns": r.enter_ns,
                    "entered_late_by_ms": _ms(r.enter_ns - median),
                    "gpu_arrival_ns": r.gpu_arrive_ns,
                    "gpu_late_by_ms": _ms(r.gpu_arrive_ns - gpu_median),
                    "sync_wait_ms": _ms(r.sync_wait_ns),
                    "loader_ms": _ms(r.loader_ns),
                    "alloc_ms": _ms(r.alloc_ns),
                    "fwd_sync_ms": _ms(r.fwd_sync_ns),
                    "step_ms": _ms(r.end_ns - r.start_ns),
                    **({"chosen_late_by_ms": late_there[(step, rank)]} if (step, rank) in late_there else {}),
                    "cause": r.causes[0][0] if r.causes else None,
                    "injected": [{"kind": k, "ms": ms, **site(k)} for k, ms in r.causes],
                }
            )
        stragglers = [
            {
                "rank": e["rank"],
                "entered_late_by_ms": e["entered_late_by_ms"],
                "gpu_late_by_ms": e["gpu_late_by_ms"],
                "cause": e["cause"],
                **(site(e["cause"]) if e["cause"] else {"function": None, "frame": None}),
            }
            for e in ranks
            if max(e["entered_late_by_ms"], e["gpu_late_by_ms"], e.get("chosen_late_by_ms", 0.0))
            >= scenario.straggler_threshold_ms
        ]
        steps_out.append(
            {
                "step": step,
                "median_enter_ns": int(median),
                "complete": len(recs) == len(logs),
                "ranks": ranks,
                "stragglers": stragglers,
            }
        )
    summary: dict[str, dict[str, Any]] = {}
    for s in steps_out:
        for e in s["stragglers"]:
            entry = summary.setdefault(str(e["rank"]), {"steps": [], "causes": {}})
            entry["steps"].append(s["step"])
            cause = e["cause"] or "none"
            entry["causes"][cause] = entry["causes"].get(cause, 0) + 1
    return {
        "version": 1,
        "scenario": scenario.name,
        "cluster_id": scenario.cluster_id,
        "world_size": scenario.world_size,
        "steps": scenario.steps,
        "straggler_threshold_ms": scenario.straggler_threshold_ms,
        "jitter": dataclasses.asdict(scenario.jitter),
        "program": scenario.program,
        "python": scenario.python,
        "frame_pointers": scenario.frame_pointers,
        "nodes": [
            {
                "node_id": n.id,
                "ranks": [r for r, node, _ in scenario.rank_layout() if node is n],
                "clock_offset_ns": n.clock_offset_ns,
                **(clocks or {}).get(n.id, {}),
            }
            for n in scenario.nodes
        ],
        "ranks": [
            {
                "rank": r,
                "node_id": log.node_id,
                "local_rank": log.local_rank,
                "pid": log.pid,
                "tid": log.tid,
                "finished": log.finished,
            }
            for r, log in sorted(logs.items())
        ],
        "communicators": communicator_members(logs),
        "faults": [
            {
                "rank": f.rank,
                "node": f.node,
                "ranks": scenario.fault_ranks(f),
                "kind": f.kind,
                "ms": f.ms,
                "every": f.every,
                "start_step": f.start_step,
                "end_step": f.end_step,
                "steps": list(f.steps) or None,
                "fired_steps": fired_steps(scenario, f, logs),
                "comm": f.comm,
                "bucket": f.bucket,
                **({"late_at": chosen[i]} if i in chosen else {}),
                "jitter": f.jitter,
                **site(f.kind),
                **({"status": f.status} if f.kind == "crash" else {}),
                **({"factor": f.factor} if f.kind == "slow_link" else {}),
            }
            for i, f in enumerate(scenario.faults)
        ],
        "failures": failures(logs),
        "links": slow_links(scenario, logs),
        "pipeline": pipeline_truth(scenario),
        "per_step": steps_out,
        "stragglers_by_rank": summary,
        "observed": observed or [],
    }
