"""Healthy jitter: a scenario's ``jitter:`` adds uniform random noise to every rank's healthy work at every
step, so a scenario has noise without oversubscribing the CPU (which also slows the agents and the test
machine). Seeded by the scenario's ``seed``, rank and step: the same noise on every run and in both rank
programs (simrank_faults.c and pyrank_lib.py draw it the same way). sim/scenario.py calls it::

    jitter: {compute_ms: 8, host_ms: 0.5, dataloader_ms: 3}   # + uniform [0, x) ms per rank and step
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Jitter:
    """Upper bounds (ms) of the uniform noise added to each healthy step's GPU compute, host work and
    data-loader wait, per rank and step (0: none)."""

    compute_ms: float = 0.0
    host_ms: float = 0.0
    dataloader_ms: float = 0.0

    def __bool__(self) -> bool:
        return any((self.compute_ms, self.host_ms, self.dataloader_ms))

    def argv(self) -> list[str]:
        """The rank programs' ``--noise-us COMPUTE:HOST:LOADER`` (nothing when there is no jitter)."""
        us = (self.compute_ms * 1000, self.host_ms * 1000, self.dataloader_ms * 1000)
        return ["--noise-us", ":".join(f"{v:g}" for v in us)] if self else []


def parse_jitter(raw: Any) -> Jitter:
    """Validate a scenario's ``jitter`` mapping; refuse one that would add no noise."""
    from rankecho.sim.scenario import ScenarioError, _fields, _number  # (it imports this module)

    d = _fields("jitter", raw, Jitter)
    for key in list(d):
        d[key] = float(_number(f"jitter.{key}", d[key]))
    jitter = Jitter(**d)
    if not jitter:
        raise ScenarioError("jitter: every bound is 0, so it adds no noise; give compute_ms, host_ms or "
                            "dataloader_ms > 0, or drop jitter")  # fmt: skip
    return jitter
