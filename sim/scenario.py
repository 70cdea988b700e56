"""Scenario files for ``rankecho sim``: YAML in, one frozen, validated ``Scenario`` out.

A scenario names the cluster, its nodes and rank counts, the shape of a training step, extra
communicators made with ncclCommSplit, and the faults to inject. Every problem is reported with
its location and the fix (``faults[1].kind: 'slowgpu' is not one of ...``). docs/sim.md has the
full format. Usage::

    scenario = load_scenario(Path("sim/scenarios/seed-rank5.yaml"))
    scenario.world_size  # 8
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rankecho.sim.clocks import ClockStep, check_clock_steps, node_clock_fields
from rankecho.sim.scenario_noise import Jitter, parse_jitter

DELAY_KINDS = ("host_compute", "dataloader_stall", "cpu_contention", "slow_gpu", "alloc_stall",
               "memcpy_stall")  # fmt: skip
FAILURE_KINDS = ("hang", "crash", "desync")
"""Fire once, at ``start_step``: hang (stop before the step's first collective for ``ms``, 0 or 'forever':
until killed), crash (exit with ``status`` there), desync (that collective with twice the byte count)."""
LINK_KINDS = ("slow_link",)
"""Not a delay but a factor: ``slow_link`` divides the transfer bandwidth of a rank (every communicator it is
in) or of a node's NIC (only communicators spanning more than one node) by ``factor`` at the steps it fires
(as a delay's steps: ``start_step``, ``start_step + every``, ...); every member of such an instance waits."""
FAULT_KINDS = DELAY_KINDS + FAILURE_KINDS + LINK_KINDS
LOAD_MODES = ("linked", "dlopen")
PROGRAMS = ("c", "python")
"""The rank program: build/simrank (C) or sim/pyrank.py (the same loop in Python over ctypes)."""
PYTHONS = ("3.10", "3.11", "3.12")
"""pyenv interpreters the Python rank may run under (``python:``); none: the launcher's own interpreter."""
LAYOUTS = ("contiguous", "strided")


class ScenarioError(ValueError):
    """The scenario file is malformed; the message names the field and the fix."""


@dataclass(frozen=True)
class StepShape:
    """What one healthy training step does on every rank (times in ms, sizes in MiB)."""

    compute_ms: float = 20.0
    host_ms: float = 0.5
    dataloader_ms: float = 0.5
    kernel_launch_rate: float = 1000.0
    """cudaLaunchKernel calls per second of GPU compute; at least 3 launches per step."""
    allreduce_mb: float = 16.0
    buckets: int = 1
    malloc_every: int = 50
    pipeline_stages: int = 1  # > 1: stages exchange activation_mb by send/recv (sim/scenario_pipeline.py)
    activation_mb: float = 4.0
    allgather_mb: float = 0.0  # FSDP-like world all-gather before / reduce-scatter after compute (0: none)
    reducescatter_mb: float = 0.0

    @property
    def kernels_per_step(self) -> int:
        return max(3, round(self.kernel_launch_rate * self.compute_ms / 1000.0))


@dataclass(frozen=True)
class Communicator:
    """An extra communicator split from the world: ranks grouped ``group_size`` at a time."""

    name: str
    group_size: int
    layout: str = "contiguous"
    allreduce_mb: float = 4.0


@dataclass(frozen=True)
class Node:
    id: str
    ranks: int
    clock_offset_ms: float = 0.0
    agent_start_after_step: int | None = None
    """This node's agent attaches once every rank finished this step (None: the scenario's setting)."""
    agent_restart_after_step: int = 0
    """K > 0: this node's agent is killed (kill -9) once every rank finished step K, and started again."""
    clock_drift_ppm: float = 0.0
    clock_step: ClockStep | None = None
    """The offset drifts by ``clock_drift_ppm`` of true time and steps once (sim/clocks.py)."""

    @property
    def clock_offset_ns(self) -> int:
        return round(self.clock_offset_ms * 1_000_000)


@dataclass(frozen=True)
class Fault:
    """Inject ``ms`` (+- uniform ``jitter`` ms) of ``kind`` on ``rank`` (or on every rank of ``node``)
    at steps ``start_step``, ``start_step + every``, ...; a failure kind (``FAILURE_KINDS``) once, at
    ``start_step``."""

    kind: str
    ms: float = 0.0
    rank: int | None = None
    node: str | None = None
    every: int = 1
    start_step: int = 0
    jitter: float = 0.0
    status: int = 1
    """crash only: the exit status."""
    factor: float = 1.0
    """slow_link only: the transfer bandwidth is divided by it (> 1)."""
    end_step: int | None = None
    """A periodic fault's last possible step (inclusive); None: until the run ends."""
    steps: tuple[int, ...] = ()
    """An explicit list of the steps it fires at, instead of start_step/every/end_step (sorted)."""
    comm: str | None = None
    """Strike before this communicator's all-reduce ("world" or a split's name; None: the world's)."""
    bucket: int | None = None
    """Strike before this world gradient bucket's all-reduce (None: the step's first, bucket 0)."""

    @property
    def first_step(self) -> int:
        return self.steps[0] if self.steps else self.start_step

    @property
    def ends_rank(self) -> bool:
        """The rank never gets past ``start_step``: it exits there or hangs for good."""
        return self.kind == "crash" or (self.kind == "hang" and self.ms == 0)

    def targets(self, rank: int, node_id: str) -> bool:
        return self.rank == rank or self.node == node_id

    def fires_at(self, step: int) -> bool:
        if self.kind in FAILURE_KINDS:
            return step == self.start_step
        if self.steps:
            return step in self.steps
        if self.end_step is not None and step > self.end_step:
            return False
        return step >= self.start_step and (step - self.start_step) % self.every == 0

    def fire_steps(self, steps: int) -> list[int]:
        """The steps of a ``steps``-step run it fires at."""
        return [k for k in range(steps) if self.fires_at(k)]

    def spec(self, splits: tuple[str, ...] = ()) -> str:
        """The ``--fault`` argument simrank parses (a crash carries its exit status in the ms slot, a
        slow_link its factor; on a node a slow_link is simrank's ``slow_nic``: inter-node only)."""
        from rankecho.sim.scenario_faults import spec_tail  # (it imports this module)

        if self.kind == "slow_link":
            kind = "slow_nic" if self.node is not None else "slow_link"
            return f"{kind}:{self.factor}:{self.every}:{self.start_step}:0{spec_tail(self, splits)}"
        ms = self.status if self.kind == "crash" else self.ms
        return f"{self.kind}:{ms}:{self.every}:{self.start_step}:{self.jitter}{spec_tail(self, splits)}"


@dataclass(frozen=True)
class Scenario:
    name: str
    cluster_id: str
    nodes: tuple[Node, ...]
    steps: int = 50
    seed: int = 1
    step: StepShape = StepShape()
    jitter: Jitter = dataclasses.field(default_factory=Jitter)
    """Healthy noise per rank and step (sim/scenario_noise.py)."""
    communicators: tuple[Communicator, ...] = ()
    faults: tuple[Fault, ...] = ()
    agent_start_after_step: int = 0
    """0: agents start before the ranks; K > 0: once every rank has finished step K."""
    load: str = "linked"
    dlopen_delay_ms: int = 0
    endbr: bool = False
    straggler_threshold_ms: float = 50.0
    program: str = "c"
    python: str | None = None
    """``program: python`` only: the pyenv CPython version to run it under (None: the launcher's Python)."""
    frame_pointers: bool = True
    """False: the C rank built -fomit-frame-pointer (build/simrank-nofp): its stacks come back truncated."""
    bus_gbps: float | None = None
    """Every link's collective bus bandwidth in GB/s (None: the fake libnccl's default, 80): a uniformly
    slower (or faster) network from the start, not a fault."""

    @property
    def world_size(self) -> int:
        return sum(n.ranks for n in self.nodes)

    def rank_layout(self) -> list[tuple[int, Node, int]]:
        """(global rank, node, local rank) for every rank, nodes in file order."""
        out, rank = [], 0
        for node in self.nodes:
            for local in range(node.ranks):
                out.append((rank, node, local))
                rank += 1
        return out

    def with_steps(self, steps: int) -> Scenario:
        return dataclasses.replace(self, steps=steps)

    def agent_start_step(self, node: Node) -> int:
        """The step after which ``node``'s agent starts (0: before the ranks)."""
        own = node.agent_start_after_step
        return self.agent_start_after_step if own is None else own

    def fault_ranks(self, fault: Fault) -> list[int]:
        """The world ranks ``fault`` strikes."""
        return [rank for rank, node, _ in self.rank_layout() if fault.targets(rank, node.id)]


def _fields(where: str, raw: Any, cls: type, required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected a mapping, got {type(raw).__name__}")
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    missing = [k for k in required if k not in raw]
    if missing:
        raise ScenarioError(f"{where}: missing required key(s) {missing}")
    return dict(raw)


def _number(
    where: str, value: Any, *, minimum: float = 0.0, integer: bool = False, positive: bool = False
) -> Any:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise ScenarioError(f"{where}: expected {'an integer' if integer else 'a number'}, got {value!r}")
    if value < minimum or (positive and value <= 0):
        bound = f"> {minimum}" if positive else f">= {minimum}"
        raise ScenarioError(f"{where}: must be {bound}, got {value!r}")
    return value


def _choice(where: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ScenarioError(f"{where}: {value!r} is not one of {list(choices)}")
    return str(value)


def _step(raw: Any) -> StepShape:
    d = _fields("step", raw, StepShape)
    for key in ("compute_ms", "kernel_launch_rate", "allreduce_mb"):
        if key in d:
            d[key] = _number(f"step.{key}", d[key], positive=True)
    for key in ("host_ms", "dataloader_ms"):
        if key in d:
            d[key] = _number(f"step.{key}", d[key])
    for key, least in (("buckets", 1), ("malloc_every", 0)):
        if key in d:
            d[key] = _number(f"step.{key}", d[key], minimum=least, integer=True)
    from rankecho.sim.scenario_pipeline import pipeline_fields  # (it imports this module)

    pipeline_fields(d)  # pipeline_stages, activation_mb, allgather_mb, reducescatter_mb
    return StepShape(**d)


def _node(i: int, raw: Any, seen: set[str]) -> Node:
    d = _fields(f"nodes[{i}]", raw, Node, ("id", "ranks"))
    if not isinstance(d["id"], str) or not d["id"] or "/" in d["id"] or d["id"] in (".", ".."):
        raise ScenarioError(f"nodes[{i}].id: need a non-empty name without '/', got {d['id']!r}")
    if d["id"] in seen:
        raise ScenarioError(f"nodes[{i}].id: {d['id']!r} is used twice; node ids must be unique")
    seen.add(d["id"])
    d["ranks"] = _number(f"nodes[{i}].ranks", d["ranks"], minimum=1, integer=True)
    if "clock_offset_ms" in d:
        d["clock_offset_ms"] = float(
            _number(f"nodes[{i}].clock_offset_ms", d["clock_offset_ms"], minimum=-1e12)
        )
    for key in ("agent_start_after_step", "agent_restart_after_step"):
        if key in d:
            d[key] = _number(f"nodes[{i}].{key}", d[key], integer=True)
    node_clock_fields(f"nodes[{i}]", d)
    return Node(**d)


def _communicator(i: int, raw: Any, world: int, seen: set[str]) -> Communicator:
    where = f"communicators[{i}]"
    d = _fields(where, raw, Communicator, ("name", "group_size"))
    name = d["name"]
    if not isinstance(name, str) or not name.isidentifier() or name == "world" or name in seen:
        raise ScenarioError(f"{where}.name: need a unique identifier other than 'world', got {name!r}")
    seen.add(name)
    size = _number(f"{where}.group_size", d["group_size"], minimum=1, integer=True)
    if world % size:
        raise ScenarioError(f"{where}.group_size: {size} does not divide the world size {world}")
    d["group_size"] = size
    if "layout" in d:
        d["layout"] = _choice(f"{where}.layout", d["layout"], LAYOUTS)
    if "allreduce_mb" in d:
        d["allreduce_mb"] = _number(f"{where}.allreduce_mb", d["allreduce_mb"], positive=True)
    return Communicator(**d)


def _fault(i: int, raw: Any, world: int, steps: int, node_ids: set[str]) -> Fault:
    where = f"faults[{i}]"
    d = _fields(where, raw, Fault, ("kind",))
    if ("rank" in d) == ("node" in d):
        raise ScenarioError(f"{where}: give exactly one of rank (one rank) or node (every rank of a node)")
    if "rank" in d:
        d["rank"] = _number(f"{where}.rank", d["rank"], integer=True)
        if d["rank"] >= world:
            raise ScenarioError(f"{where}.rank: {d['rank']} is outside the world (ranks 0..{world - 1})")
    elif d["node"] not in node_ids:
        raise ScenarioError(f"{where}.node: {d['node']!r} is not one of the nodes {sorted(node_ids)}")
    d["kind"] = _choice(f"{where}.kind", d["kind"], FAULT_KINDS)
    from rankecho.sim.scenario_faults import failure_fields, schedule_fields  # (it imports this module)

    if d["kind"] in FAILURE_KINDS:
        failure_fields(where, d, world)
    elif d["kind"] in LINK_KINDS:
        from rankecho.sim.scenario_links import link_fields  # (it imports this module)

        link_fields(where, d)
    else:
        if "factor" in d:
            raise ScenarioError(f"{where}.factor: only a slow_link takes a factor; remove it")
        if "ms" not in d:
            raise ScenarioError(f"{where}: missing required key(s) ['ms']")
        if "status" in d:
            raise ScenarioError(f"{where}.status: only a crash has an exit status; remove it")
        d["ms"] = float(_number(f"{where}.ms", d["ms"], positive=True))
    if "every" in d:
        d["every"] = _number(f"{where}.every", d["every"], minimum=1, integer=True)
    if "start_step" in d:
        d["start_step"] = _number(f"{where}.start_step", d["start_step"], integer=True)
    schedule_fields(where, d, steps)
    if "jitter" in d:
        d["jitter"] = float(_number(f"{where}.jitter", d["jitter"]))
        if d["jitter"] > d["ms"]:
            raise ScenarioError(f"{where}.jitter: {d['jitter']} ms exceeds ms={d['ms']}; keep jitter <= ms")
    fault = Fault(**d)
    if steps and fault.start_step >= steps:
        raise ScenarioError(f"{where}.start_step: {fault.start_step} is past the last step ({steps - 1})")
    return fault


def parse_scenario(raw: Any, name: str = "scenario") -> Scenario:
    """Validate a parsed YAML document into a ``Scenario``."""
    d = _fields(name, raw, Scenario, ("cluster_id", "nodes"))
    d.setdefault("name", name)
    if not isinstance(d["cluster_id"], str) or not d["cluster_id"]:
        raise ScenarioError("cluster_id: need a non-empty string")
    if not isinstance(d["nodes"], list) or not d["nodes"]:
        raise ScenarioError("nodes: need a non-empty list of {id, ranks}")
    seen: set[str] = set()
    d["nodes"] = tuple(_node(i, n, seen) for i, n in enumerate(d["nodes"]))
    world = sum(n.ranks for n in d["nodes"])
    d["steps"] = _number("steps", d.get("steps", Scenario.steps), integer=True)
    d["seed"] = _number("seed", d.get("seed", Scenario.seed), integer=True)
    d["step"] = _step(d.get("step") or {})
    d["jitter"] = parse_jitter(d["jitter"]) if d.get("jitter") is not None else Jitter()
    names: set[str] = set()
    comms = d.get("communicators") or []
    if not isinstance(comms, list) or len(comms) > 4:
        raise ScenarioError("communicators: need a list of at most 4 entries")
    d["communicators"] = tuple(_communicator(i, c, world, names) for i, c in enumerate(comms))
    faults = d.get("faults") or []
    if not isinstance(faults, list) or len(faults) > 16:
        raise ScenarioError("faults: need a list of at most 16 entries")
    d["faults"] = tuple(_fault(i, f, world, d["steps"], seen) for i, f in enumerate(faults))
    d["agent_start_after_step"] = _number(
        "agent_start_after_step", d.get("agent_start_after_step", 0), integer=True
    )
    d["load"] = _choice("load", d.get("load", "linked"), LOAD_MODES)
    d["dlopen_delay_ms"] = _number("dlopen_delay_ms", d.get("dlopen_delay_ms", 0), integer=True)
    for key in ("endbr", "frame_pointers"):
        if not isinstance(d.get(key, False), bool):
            raise ScenarioError(f"{key}: expected true or false")
    from rankecho.sim.programs import program_fields  # (it imports this module)

    program_fields(d)
    d["straggler_threshold_ms"] = float(
        _number("straggler_threshold_ms", d.get("straggler_threshold_ms", 50.0), positive=True)
    )
    if d.get("bus_gbps") is not None:
        d["bus_gbps"] = float(_number("bus_gbps", d["bus_gbps"], positive=True))
    scenario = Scenario(**d)
    from rankecho.sim.scenario_faults import check_failures  # (these import this module)
    from rankecho.sim.scenario_links import check_links
    from rankecho.sim.scenario_pipeline import check_pipeline

    for check in (check_failures, check_clock_steps, check_links, check_pipeline):
        check(scenario)
    return scenario


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file; its stem becomes the scenario name unless it sets one."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read ({e.strerror})") from e
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}") from e
    try:
        return parse_scenario(raw, path.stem)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from e
