"""The job ``python -m bench agent`` runs side by side with and without agents: its built-in shape, or a
scenario file's (``--scenario``), as the ranks' options :class:`rankecho.sim.job.SimJob` launches.

A scenario's ranks get exactly the options ``rankecho sim`` gives them (:func:`sim.programs.rank_argv`,
less the program and ``--log``, which SimJob supplies), so the bench measures the job shape the scenario
names. SimJob runs the linked C rank with the same ranks on every node; a scenario that needs anything
else is refused with what to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rankecho.sim.programs import rank_argv, rank_command
from rankecho.sim.scenario import load_scenario

BUILTIN_ARGS = ("--compute-us", "30000", "--kernels", "60", "--buckets", "2")


@dataclass(frozen=True)
class JobShape:
    label: str
    nodes: list[str]
    ranks_per_node: int
    steps: int
    endbr_nodes: tuple[str, ...] = ()
    cluster_id: str = "sim"
    args: list[str] = field(default_factory=list)
    """Every rank's options."""
    per_rank: dict[int, list[str]] = field(default_factory=dict)
    """Options of one rank after ``args`` (a scenario's: all of them, faults included)."""


def builtin_shape(steps: int | None) -> JobShape:
    """2 nodes x 4 ranks, 30 ms of compute, 60 launches and 2 all-reduce buckets per step; node-b runs
    the endbr64 build of the libraries (the probe-cost comparison needs one)."""
    steps = 30 if steps is None else steps
    return JobShape("built-in: 2 nodes x 4 ranks, 30 ms compute, 60 launches, 2 buckets",
                    ["node-a", "node-b"], 4, steps, ("node-b",), args=["--steps", str(steps), *BUILTIN_ARGS])


def scenario_shape(path: Path, steps: int | None) -> JobShape:
    """The scenario's nodes, ranks and per-rank options; ``steps`` overrides its step count."""
    sc = load_scenario(path)
    if steps is not None:
        sc = sc.with_steps(steps)
    per_node = {n.ranks for n in sc.nodes}
    problems = [
        why for bad, why in (
            (len(per_node) != 1, "every node must have the same number of ranks"),
            (sc.program != "c" or sc.load != "linked" or not sc.frame_pointers,
             "the bench runs the linked C rank with frame pointers (drop program/load/frame_pointers; "
             "--omit-frame-pointers measures that build)"),
            (sc.bus_gbps is not None, "drop bus_gbps (the bench's ranks use the default bus bandwidth)"),
            (sc.agent_start_after_step != 0 or any(n.agent_restart_after_step or n.agent_start_after_step
                                                   for n in sc.nodes),
             "agents start before the ranks here: drop agent_start_after_step/agent_restart_after_step"),
        ) if bad
    ]  # fmt: skip
    if problems:
        raise SystemExit(f"--scenario {path}: " + "; ".join(problems))
    prefix = len(rank_command(sc))
    per_rank = {}
    for rank, node, _ in sc.rank_layout():
        argv = rank_argv(sc, rank, node, Path("LOG"), Path("."))[prefix:]
        i = argv.index("--log")
        per_rank[rank] = argv[:i] + argv[i + 2:]
    endbr = tuple(n.id for n in sc.nodes) if sc.endbr else ()
    return JobShape(f"{path} ({sc.name}: {len(sc.nodes)} nodes x {per_node.pop()} ranks, {sc.steps} steps)",
                    [n.id for n in sc.nodes], sc.nodes[0].ranks, sc.steps, endbr, sc.cluster_id, [], per_rank)
