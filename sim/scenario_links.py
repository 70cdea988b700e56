"""Scenario validation of ``slow_link`` faults (sim/scenario.py calls it): a bandwidth factor, not a duration,
and settings that could never slow a transfer are refused with the fix."""

from __future__ import annotations

from typing import Any

from rankecho.sim.scenario import LINK_KINDS, Scenario, ScenarioError
from rankecho.sim.scenario import _number as number


def link_fields(where: str, d: dict[str, Any]) -> None:
    """slow_link takes a bandwidth factor, not a duration; refuse what would never change a transfer."""
    for key, fix in (("ms", "give factor (bandwidth divided by it) instead"),
                     ("jitter", "remove it (write one fault per factor)"),
                     ("status", "only a crash has an exit status; remove it")):  # fmt: skip
        if key in d:
            raise ScenarioError(f"{where}.{key}: a slow_link takes no {key}; {fix}")
    if "factor" not in d:
        raise ScenarioError(f"{where}: missing required key(s) ['factor'] (the bandwidth is divided by it)")
    d["factor"] = float(number(f"{where}.factor", d["factor"]))
    if not 1.0 < d["factor"] <= 100.0:
        raise ScenarioError(f"{where}.factor: {d['factor']} would not slow anything or is out of range; "
                            "pick a factor > 1 and <= 100")


def check_links(sc: Scenario) -> None:
    """Refuse a slow_link that could never take effect: on a one-rank world (no transfer), on a node
    when no communicator spans two nodes (a NIC carries only inter-node traffic), in the Python rank."""
    for i, f in enumerate(sc.faults):
        if f.kind not in LINK_KINDS:
            continue
        if sc.program != "c":
            raise ScenarioError(f"faults[{i}].kind: only the C rank simulates slow_link; use program: c")
        if sc.world_size < 2:
            raise ScenarioError(f"faults[{i}]: a slow_link needs a collective to slow; use at least 2 ranks")
        if f.node is not None and len(sc.nodes) < 2:
            raise ScenarioError(
                f"faults[{i}].node: a slow NIC slows only communicators spanning more than one node and "
                f"this scenario has one node; add a node, or give rank instead of node (every communicator)"
            )
