"""Scenario validation of when a fault fires (sim/scenario.py calls it): ``end_step`` ends a periodic fault,
``steps`` lists its steps outright; hang, crash and desync fire once. Settings that could never take effect
are refused with the fix, as everywhere in the scenario format: an end before the start, a listed step past
the run, both ways at once, a fault on a rank a crash already ended.

    faults:
      - {rank: 5, kind: host_compute, ms: 80, every: 4, start_step: 2, end_step: 20}   # 2, 6, ..., 18
      - {rank: 1, kind: alloc_stall, ms: 120, steps: [3, 4, 17]}
"""

from __future__ import annotations

from typing import Any

from rankecho.sim.scenario import Fault, Scenario, ScenarioError
from rankecho.sim.scenario import _number as number

MAX_LISTED_STEPS = 64
"""At most this many entries in one fault's ``steps`` (the rank programs hold them in a fixed array)."""


SELECTABLE = ("host_compute", "cpu_contention", "memcpy_stall", "hang", "crash")
"""The kinds that strike right before a collective, so ``comm``/``bucket`` can choose which one."""


def spec_tail(f: Fault, splits: tuple[str, ...]) -> str:
    """The ``--fault`` spec's optional ``:END[:STEPS[:COMM[:BUCKET]]]`` tail, as short as the settings allow:
    END -1 for none, STEPS ``-`` for none or ``S1,S2,...``, COMM -1 for the world or the split's index in
    ``splits`` (the --split order), BUCKET the world bucket (0: the first)."""
    comm = -1 if f.comm in (None, "world") else splits.index(f.comm)
    parts = [str(-1 if f.end_step is None else f.end_step), ",".join(map(str, f.steps)) or "-", str(comm),
             str(f.bucket or 0)]  # fmt: skip
    defaults = ["-1", "-", "-1", "0"]
    while parts and parts[-1] == defaults[len(parts) - 1]:
        parts.pop()
    return "".join(f":{p}" for p in parts)


def _selector_fields(where: str, d: dict[str, Any]) -> None:
    """``comm`` (a name, checked against the communicators later) and ``bucket``: only on the kinds that
    strike before a collective."""
    for key in ("comm", "bucket"):
        if key in d and d["kind"] not in SELECTABLE:
            raise ScenarioError(
                f"{where}.{key}: a {d['kind']} does not strike before a collective, so it cannot choose one; "
                f"remove {key} (it works on {', '.join(SELECTABLE)})"
            )
    if "comm" in d and not isinstance(d["comm"], str):
        raise ScenarioError(f"{where}.comm: need a communicator name ('world' or a communicators[] name)")
    if "bucket" in d:
        d["bucket"] = number(f"{where}.bucket", d["bucket"], integer=True)
        if d.get("comm", "world") != "world":
            raise ScenarioError(f"{where}.bucket: only the world all-reduce is bucketed; remove bucket or "
                                f"comm: {d['comm']}")  # fmt: skip


def check_selectors(sc: Scenario) -> None:
    """Refuse a ``comm`` that names no communicator, a ``bucket`` past the step's buckets, and either in
    the Python rank (the C rank only)."""
    names = ["world", *(c.name for c in sc.communicators)]
    for i, f in enumerate(sc.faults):
        if f.comm is None and f.bucket is None:
            continue
        if sc.program != "c":
            raise ScenarioError(f"faults[{i}]: only the C rank simulates comm/bucket; use program: c")
        if f.comm is not None and f.comm not in names:
            raise ScenarioError(f"faults[{i}].comm: {f.comm!r} is not one of the communicators {names}")
        if f.bucket is not None and f.bucket >= sc.step.buckets:
            raise ScenarioError(
                f"faults[{i}].bucket: {f.bucket} is past the step's last bucket ({sc.step.buckets - 1}); "
                f"use a bucket < {sc.step.buckets} or raise step.buckets"
            )


def schedule_fields(where: str, d: dict[str, Any], steps: int) -> None:
    """Validate ``end_step`` and ``steps`` in place (``steps``: the scenario's step count, 0 if unknown),
    and the ``comm``/``bucket`` selectors."""
    _selector_fields(where, d)
    last = f"the last step ({steps - 1})"
    if "steps" in d:
        clash = [k for k in ("start_step", "every", "end_step") if k in d]
        if clash:
            raise ScenarioError(
                f"{where}.steps: an explicit list of steps replaces start_step/every/end_step; remove "
                f"{clash} (or drop steps and keep the periodic form)"
            )
        listed = d["steps"]
        if not isinstance(listed, list) or not listed or len(listed) > MAX_LISTED_STEPS:
            raise ScenarioError(f"{where}.steps: need a list of 1..{MAX_LISTED_STEPS} steps, got {listed!r}")
        values = [number(f"{where}.steps[{i}]", v, integer=True) for i, v in enumerate(listed)]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ScenarioError(f"{where}.steps: step(s) {twice} listed twice; list each step once")
        late = [v for v in values if steps and v >= steps]
        if late:
            raise ScenarioError(
                f"{where}.steps: step(s) {late} are past {last} and would never fire; drop them or add steps"
            )
        d["steps"] = tuple(sorted(values))
        d["start_step"] = d["steps"][0]
        return
    if "end_step" not in d:
        return
    end = number(f"{where}.end_step", d["end_step"], integer=True)
    start = d.get("start_step", 0)
    if end < start:
        raise ScenarioError(
            f"{where}.end_step: {end} is before start_step {start}, so the fault would never fire; "
            f"use an end_step >= {start}"
        )
    if steps and end >= steps - 1:
        raise ScenarioError(
            f"{where}.end_step: {end} is not before {last}: the fault runs to the end anyway; drop end_step "
            f"or use one < {steps - 1}"
        )
    d["end_step"] = end


def failure_fields(where: str, d: dict[str, Any], world: int) -> None:
    """hang, crash and desync fire once: refuse the settings that could never take effect."""
    kind = d["kind"]
    for key in ("every", "jitter", "end_step", "steps"):
        if key in d:
            raise ScenarioError(
                f"{where}.{key}: a {kind} fires once, at start_step; remove {key} (write one fault per step)"
            )
    if kind == "hang":
        ms = d.get("ms", "forever")
        d["ms"] = 0.0 if ms == "forever" else float(number(f"{where}.ms", ms))
    elif "ms" in d:
        fix = "set status (the exit status) instead" if kind == "crash" else "remove it"
        raise ScenarioError(f"{where}.ms: a {kind} takes no duration; {fix}")
    if kind == "crash":
        d["status"] = number(f"{where}.status", d.get("status", 1), minimum=1, integer=True)
        if d["status"] > 255:
            raise ScenarioError(f"{where}.status: {d['status']} is not an exit status; pick 1..255")
    elif "status" in d:
        raise ScenarioError(f"{where}.status: only a crash has an exit status; remove it")
    if kind == "desync" and world < 2:
        raise ScenarioError(f"{where}: a desync needs another rank to disagree with; use at least 2 ranks")


def check_failures(sc: Scenario) -> None:
    """Refuse what a crash or a hang for good makes impossible: a later fault on the same rank, or an
    agent that would only start (or restart) after every rank passed a step some rank never finishes."""
    check_selectors(sc)
    for i, f in enumerate(sc.faults):
        if not f.ends_rank:
            continue
        struck = set(sc.fault_ranks(f))
        for j, g in enumerate(sc.faults):
            if j != i and g.first_step > f.start_step and struck & set(sc.fault_ranks(g)):
                raise ScenarioError(
                    f"faults[{j}].start_step: {g.first_step} comes after faults[{i}] ({f.kind}) at step "
                    f"{f.start_step} ends its rank; move it to step {f.start_step} or earlier, or drop it"
                )
        for node in sc.nodes:
            for key, step in (("agent_start_after_step", sc.agent_start_step(node)),
                              ("agent_restart_after_step", node.agent_restart_after_step)):  # fmt: skip
                if step > 0 and f.start_step <= step:
                    raise ScenarioError(
                        f"{key}: {step} for {node.id} waits for every rank to finish step {step}, but "
                        f"faults[{i}] ({f.kind}) stops a rank at step {f.start_step}; use a step "
                        f"< {f.start_step} or 0"
                    )
