"""Simulated node clocks that drift and step: a node's ``clock_drift_ppm`` makes the skew its agent adds to
every timestamp grow with true time (from the run's start, the epoch), and ``clock_step: {at_step, ms}``
steps it by ``ms`` once every rank has completed ``at_step`` steps (as ``agent_start_after_step`` counts),
as an NTP step would. The agent does the shifting (testing-only options, agent/clock.py); this module
validates the settings, gives the agent its options, triggers the step (a file the agent polls; it writes
back the instant it applied it) and writes the ground truth of each node's true offset at every step::

    clocks = SimClocks(scenario, run_dir)      # epoch: now
    agent_argv += clock_argv(node, clocks.epoch_ns, node_dir)
    clocks.poll(min_step_done)                 # in the launcher's wait loop
    truth_nodes = clocks.truth(logs)           # node id -> clock fields of the ground truth
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankecho.sim.groundtruth import RankLog
    from rankecho.sim.scenario import Node, Scenario

MAX_DRIFT_PPM = 1000.0
"""Real oscillators drift tens of ppm; beyond this a setting is a typo."""
STEP_FILE = "clock-step"


@dataclass(frozen=True)
class ClockStep:
    at_step: int
    ms: float


def node_clock_fields(where: str, d: dict[str, Any]) -> None:
    """Validate a node's ``clock_drift_ppm`` and ``clock_step`` in place; refuse settings that do nothing."""
    from rankecho.sim.scenario import ScenarioError, _fields, _number  # (it imports this module)

    if "clock_drift_ppm" in d:
        ppm = _number(f"{where}.clock_drift_ppm", d["clock_drift_ppm"], minimum=-MAX_DRIFT_PPM)
        if ppm == 0 or abs(ppm) > MAX_DRIFT_PPM:
            bound = f"{MAX_DRIFT_PPM:g}"
            raise ScenarioError(f"{where}.clock_drift_ppm: {ppm} ppm is none or out of range; pick a "
                                f"non-zero value in -{bound}..{bound}, or drop it")  # fmt: skip
        d["clock_drift_ppm"] = float(ppm)
    if "clock_step" in d:
        step = _fields(f"{where}.clock_step", d["clock_step"], ClockStep, ("at_step", "ms"))
        at = _number(f"{where}.clock_step.at_step", step["at_step"], integer=True)
        if at < 1:
            raise ScenarioError(f"{where}.clock_step.at_step: a step before any training step is a constant "
                                "offset; use clock_offset_ms, or an at_step >= 1")  # fmt: skip
        ms = _number(f"{where}.clock_step.ms", step["ms"], minimum=-1e9)
        if ms == 0:
            raise ScenarioError(f"{where}.clock_step.ms: a 0 ms step changes nothing; give the jump in ms "
                                "(negative: backwards) or drop clock_step")  # fmt: skip
        d["clock_step"] = ClockStep(at, float(ms))


def check_clock_steps(sc: Scenario) -> None:
    """A step once every rank has completed all its steps would shift nothing the run still does."""
    from rankecho.sim.scenario import ScenarioError  # (it imports this module)

    for i, node in enumerate(sc.nodes):
        if node.clock_step is not None and node.clock_step.at_step >= sc.steps:
            raise ScenarioError(
                f"nodes[{i}].clock_step.at_step: {node.clock_step.at_step} leaves no step to run on the "
                f"stepped clock (the run has {sc.steps}); use an at_step < {sc.steps}"
            )


def clock_argv(node: Node, epoch_ns: int, node_dir: Path) -> list[str]:
    """The agent's testing-only clock options for ``node`` (nothing for a node with a constant offset)."""
    argv = []
    if node.clock_drift_ppm:
        argv += ["--clock-drift-ppm", f"{node.clock_drift_ppm:g}", "--clock-epoch-ns", str(epoch_ns)]
    if node.clock_step is not None:
        argv += ["--clock-step-file", str(node_dir / STEP_FILE)]
    return argv


def offset_ns(node: Node, epoch_ns: int, step_at_ns: int | None, true_ns: int) -> int:
    """What the node's agent adds to a timestamp of true Unix time ``true_ns`` (agent/clock.py's
    ClockConverter.simulated_offset_ns): the constant offset, the drift since the epoch, the step once
    taken (from ``step_at_ns``; None: not taken)."""
    drift = round(node.clock_drift_ppm * (true_ns - epoch_ns) / 1e6) if node.clock_drift_ppm else 0
    taken = node.clock_step is not None and step_at_ns is not None and true_ns >= step_at_ns
    step = round(node.clock_step.ms * 1e6) if node.clock_step is not None and taken else 0
    return node.clock_offset_ns + drift + step


def median(values: list[int]) -> int:
    return int(statistics.median(values))


@dataclass
class SimClocks:
    scenario: Scenario
    run_dir: Path
    epoch_ns: int = field(default_factory=time.time_ns)
    requested: dict[str, int] = field(default_factory=dict)
    """node id -> true Unix ns when the launcher wrote its clock-step file."""

    def poll(self, done: int) -> list[str]:
        """Write the clock-step file of every node once every rank has completed ``at_step`` steps (``done``:
        the fewest steps any rank has completed); the ids of the nodes stepped now."""
        now = []
        for node in self.scenario.nodes:
            step = node.clock_step
            if step is None or node.id in self.requested or done < step.at_step:
                continue
            path = self.run_dir / node.id / STEP_FILE
            tmp = path.with_suffix(".tmp")
            tmp.write_text(f"{step.ms!r}\n")
            self.requested[node.id] = time.time_ns()
            tmp.replace(path)  # the agent never reads half a file
            now.append(node.id)
        return now

    def applied_ns(self, node: Node) -> int | None:
        """When the node's agent applied its step (None: no agent did)."""
        path = self.run_dir / node.id / f"{STEP_FILE}.applied"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def truth(self, logs: dict[int, RankLog]) -> dict[str, dict[str, Any]]:
        """node id -> its ground-truth clock fields, for nodes that drift or step: the settings, when the step
        was requested and applied, and the true offset at every step (at the median of its ranks' call of
        the step's first all-reduce; a step not yet applied by an agent counts from its request)."""
        out: dict[str, dict[str, Any]] = {}
        for node in self.scenario.nodes:
            if not node.clock_drift_ppm and node.clock_step is None:
                continue
            applied = self.applied_ns(node)
            at = applied if applied is not None else self.requested.get(node.id)
            ranks = [r for r, n, _ in self.scenario.rank_layout() if n.id == node.id]
            enters: dict[int, list[int]] = {}
            for r in ranks:
                for rec in logs[r].steps:
                    enters.setdefault(rec.step, []).append(rec.enter_ns)
            out[node.id] = {
                "clock_drift_ppm": node.clock_drift_ppm, "clock_epoch_ns": self.epoch_ns,
                "clock_step": None if node.clock_step is None else {
                    "at_step": node.clock_step.at_step, "ms": node.clock_step.ms,
                    "requested_ns": self.requested.get(node.id), "applied_ns": applied},
                "offsets": [{"step": k, "offset_ns": offset_ns(node, self.epoch_ns, at, median(e))}
                            for k, e in sorted(enters.items())],
            }  # fmt: skip
        return out
