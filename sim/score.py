"""Score a straggler diagnosis against a simulated run's ground truth.

An episode is a rank late at a step. Positives are the (step, rank) pairs where a rank was at least
the scenario's threshold late (host or GPU side) *and* a fault was injected there. Lateness the truth
cannot attribute, or that sits near the threshold (from half of it up), is neutral: naming it is
neither rewarded nor penalised, since a rank really late from scheduling noise was late, and one
measured at 19.8 ms against a 20 ms threshold should not flip a score; so is a (step, rank) a fault
fired on whose effect fell short of the threshold. Every other (step, rank) named
is a false positive. A diagnosis names episodes by time (``find_stragglers``: ``timestamp_ns`` on its
reference node's clock), so this module maps each one to the step of the truth whose call time of that
rank is nearest, after undoing the reference node's true clock offset (at that step, when its clock
drifts or steps: :func:`true_time`). Usage::

    predictions = predictions_from(truth, diagnosis)     # diagnosis: Diagnosis.find_stragglers(...)
    s = score(truth, predictions)
    s.precision, s.recall, s.cause_accuracy
    periods(truth, diagnosis)                            # [(who, expected every, reported period)]
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Prediction = tuple[int, int, str | None]
"""(step, rank, cause or None when the diagnosis names no cause)"""

CAUSE_TO_FAULT: dict[str, str] = {
    "allocator": "alloc_stall",
    "slow_gpu": "slow_gpu",
    "cpu_contention": "cpu_contention",
    "sleeping": "dataloader_stall",
    "host_compute": "host_compute",
    "memcpy": "memcpy_stall",
}
"""find_stragglers' cause classes, as the simulator's fault kinds."""
NEUTRAL_FROM = 0.5
"""Lateness from this fraction of the threshold up is never a false positive."""


@dataclass(frozen=True)
class Score:
    true_positives: int
    false_positives: int
    false_negatives: int
    causes_named: int
    causes_right: int

    @property
    def precision(self) -> float:
        called = self.true_positives + self.false_positives
        return self.true_positives / called if called else 1.0

    @property
    def recall(self) -> float:
        real = self.true_positives + self.false_negatives
        return self.true_positives / real if real else 1.0

    @property
    def cause_accuracy(self) -> float:
        """Right causes among true positives that named one (1.0 when none did)."""
        return self.causes_right / self.causes_named if self.causes_named else 1.0


def lateness(truth: dict[str, Any]) -> dict[tuple[int, int], tuple[float, str | None]]:
    """(step, rank) -> (worst of host and GPU lateness in ms, injected cause or None)."""
    out: dict[tuple[int, int], tuple[float, str | None]] = {}
    for s in truth["per_step"]:
        for r in s.get("ranks") or s["stragglers"]:
            late = max(r["entered_late_by_ms"], r.get("gpu_late_by_ms", r["entered_late_by_ms"]),
                       r.get("chosen_late_by_ms", r["entered_late_by_ms"]))  # a fault's chosen collective
            out[(s["step"], r["rank"])] = (late, r["cause"])
    return out


def injected_stragglers(truth: dict[str, Any]) -> dict[tuple[int, int], str]:
    """(step, rank) -> cause, for every straggler the ground truth attributes to an injected fault and
    an agent could see (see :func:`unobserved`)."""
    threshold = truth.get("straggler_threshold_ms", 0.0)
    hidden = unobserved(truth)
    return {
        key: cause
        for key, (late, cause) in lateness(truth).items()
        if cause is not None and late >= threshold and key not in hidden
    }


def unobserved(truth: dict[str, Any]) -> set[tuple[int, int]]:
    """(step, rank) pairs no agent could have judged: its node's agents (``truth["observed"]``) were not
    watching from two steps before the rank's call on (a late attach, the gap of a restart). Empty when
    the truth records no agents (a run without them, or a hand-made truth)."""
    spans = truth.get("observed") or []
    if not spans:
        return set()
    node_of = {r["rank"]: r["node_id"] for r in truth["ranks"]}
    hidden = set()
    for s in truth["per_step"]:
        for r in s["ranks"]:
            lead_ns = 2 * r["step_ms"] * 1e6
            mine = [o for o in spans if o["node_id"] == node_of.get(r["rank"])]
            if not any(o["from_ns"] + lead_ns <= r["enter_ns"] <= o["to_ns"] for o in mine):
                hidden.add((s["step"], r["rank"]))
    return hidden


def score(truth: dict[str, Any], predictions: Iterable[Prediction]) -> Score:
    threshold = truth.get("straggler_threshold_ms", 0.0)
    late = lateness(truth)
    positives = injected_stragglers(truth)
    named = {(step, rank): cause for step, rank, cause in predictions}
    tp = [key for key in named if key in positives]
    fp = [
        key for key in named if key not in positives and not _neutral(late.get(key, (0.0, None)), threshold)
    ]
    with_cause = [key for key in tp if named[key] is not None]
    return Score(
        true_positives=len(tp),
        false_positives=len(fp),
        false_negatives=len(set(positives) - set(named)),
        causes_named=len(with_cause),
        causes_right=sum(named[key] == positives[key] for key in with_cause),
    )


def _neutral(late: tuple[float, str | None], threshold: float) -> bool:
    """Naming this (step, rank) is neither right nor wrong: it was late from half the threshold up, or a
    fault fired on it at that step (its effect fell short of the threshold, yet it was there)."""
    late_ms, cause = late
    return late_ms >= NEUTRAL_FROM * threshold or cause is not None


def true_time(truth: dict[str, Any], diagnosis: dict[str, Any]) -> Callable[[int], float]:
    """Reference-clock ns -> true ns: the diagnosis reports times on its reference node's clock. A node
    whose clock drifts or steps (``clock_drift_ppm``, ``clock_step``) has its true offset at every step in
    the truth (``offsets``): a time takes the offset of the step whose first call it is nearest to, as that
    clock read it. Any other node's offset is its constant ``clock_offset_ns``."""
    nodes = {n["node_id"]: n for n in truth["nodes"]}
    cluster = next((c for c in diagnosis["clusters"] if c["cluster_id"] == truth["cluster_id"]), None)
    node = nodes.get((cluster or {}).get("reference_node"), {})
    constant = int(node.get("clock_offset_ns", 0))
    first_call = {s["step"]: min(r["enter_ns"] for r in s["ranks"]) for s in truth["per_step"] if s["ranks"]}
    marks = sorted((first_call[o["step"]] + o["offset_ns"], o["offset_ns"])
                   for o in node.get("offsets") or [] if o["step"] in first_call)  # fmt: skip
    if not marks:
        return lambda ns: ns - constant

    def undo(ns: int) -> float:
        i = bisect.bisect_left(marks, (ns, -math.inf))
        near = min(marks[max(i - 1, 0) : i + 1], key=lambda m: abs(m[0] - ns))
        return ns - near[1]

    return undo


def predictions_from(truth: dict[str, Any], diagnosis: dict[str, Any]) -> list[Prediction]:
    """Every episode of every straggler the diagnosis reports for the truth's cluster, as (step, rank,
    fault kind) on the truth's step numbering; an episode no step's call of that rank is near (within
    half a step) keeps step -1, which is never a positive."""
    to_true = true_time(truth, diagnosis)
    calls: dict[int, list[tuple[int, int]]] = {}
    for s in truth["per_step"]:
        for r in s["ranks"]:
            calls.setdefault(r["rank"], []).append((r["enter_ns"], s["step"]))
    for f in truth.get("faults") or []:  # a fault that chose a later collective: the rank is late there
        for e in f.get("late_at") or []:
            calls.setdefault(e["rank"], []).append((e["call_ns"], e["step"]))
    steps_ms = sorted(r["step_ms"] for s in truth["per_step"] for r in s["ranks"])
    half_step_ns = (steps_ms[len(steps_ms) // 2] if steps_ms else 100.0) * 1e6 / 2
    out: list[Prediction] = []
    for straggler in diagnosis["stragglers"]:
        if straggler["cluster_id"] != truth["cluster_id"] or straggler["kind"] == "link":
            continue  # a slow link names no late rank: scored on its own (links in rankecho.evaluate)
        for episode in straggler["episodes"]:
            cause = CAUSE_TO_FAULT.get(episode["cause"] or "")
            true_ns = to_true(episode["timestamp_ns"])
            for rank in episode.get("ranks") or [straggler["rank"]]:
                nearest = min(calls.get(rank, []), key=lambda c: abs(c[0] - true_ns), default=None)
                step = nearest[1] if nearest and abs(nearest[0] - true_ns) <= half_step_ns else -1
                out.append((step, rank, cause))
    return out


def spilled_nodes(truth: dict[str, Any], diagnosis: dict[str, Any]) -> set[str]:
    """Nodes the diagnosis names (``"node node-b"``) only at steps where a planted fault struck one of
    their own ranks. The simulated nodes share this machine's few cores, so a fault's CPU hog or stall
    can hold the node's other ranks back too: their calls really enter late (the agent times the call;
    the rank's log times the instant before it), and a node late at that step is late by that fault,
    not named without one."""
    node_of = {r["rank"]: r["node_id"] for r in truth["ranks"]}
    struck = {(s["step"], node_of[r["rank"]]) for s in truth["per_step"] for r in s["ranks"] if r["cause"]}
    out = set()
    for straggler in diagnosis["stragglers"]:
        if straggler["cluster_id"] != truth["cluster_id"] or straggler["kind"] != "node":
            continue
        episodes = straggler["episodes"]
        if episodes and all(_struck_episode(truth, diagnosis, straggler, e, struck) for e in episodes):
            out.add(f"node {straggler['node_id']}")
    return out


def spilled_ranks(truth: dict[str, Any], diagnosis: dict[str, Any]) -> set[str]:
    """Ranks the diagnosis names (``"rank 7"``) only at steps where a planted fault struck some rank and
    the ground truth has this rank itself late (from half the threshold up) there. The simulated ranks
    share this machine's two cores, so a fault's CPU hog (a SCHED_FIFO neighbour) really holds other
    ranks back at the fault's steps: naming one of them then reports lateness that happened, caused by
    that fault, and is not a straggler named without one. So is a rank late at a slow_link fault's step
    or the step after it: the ranks whose transfer was slow finish that step late and start the next one
    late (slow-rank: ranks 0 and 3, ~36 ms, at each step after a slow one). A rank also named at any
    other step, or not late where it is named, stays unexplained."""
    threshold = truth.get("straggler_threshold_ms", 0.0)
    late = lateness(truth)
    struck = {s["step"] for s in truth["per_step"] for r in s["ranks"] if r["cause"]}
    link_steps = {step for link in truth.get("links") or [] for step in link["steps"]}
    struck |= link_steps | {step + 1 for step in link_steps}
    out = set()
    for straggler in diagnosis["stragglers"]:
        if straggler["kind"] != "rank":
            continue
        named = predictions_from(truth, {**diagnosis, "stragglers": [straggler]})  # [] for another cluster
        if named and all(
            step in struck and late.get((step, rank), (0.0, None))[0] >= NEUTRAL_FROM * threshold
            for step, rank, _ in named
        ):
            out.add(f"rank {straggler['rank']}")
    return out


def _struck_episode(truth: dict[str, Any], diagnosis: dict[str, Any], straggler: dict[str, Any],
                    episode: dict[str, Any], struck: set[tuple[int, str]]) -> bool:
    """Whether any rank of a node's episode maps to a step where a fault struck that node."""
    one = {**diagnosis, "stragglers": [{**straggler, "episodes": [episode]}]}
    return any((step, straggler["node_id"]) in struck for step, _, _ in predictions_from(truth, one))


def periods(truth: dict[str, Any], diagnosis: dict[str, Any]) -> list[tuple[str, int, int | None]]:
    """For every injected fault big enough to make episodes of the scenario's threshold (ms + jitter at
    least the threshold): (who, its period, the period the diagnosis reports for that rank or node;
    None when it reports none)."""
    found: dict[tuple[str, Any], int | None] = {}
    for s in diagnosis["stragglers"]:
        if s["cluster_id"] == truth["cluster_id"] and s["kind"] != "link":
            key = ("node", s["node_id"]) if s["kind"] == "node" else ("rank", s["rank"])
            found[key] = (s["period"] or {}).get("steps")
    out = []
    threshold = truth.get("straggler_threshold_ms", 0.0)
    for f in truth["faults"]:
        if f.get("kind") == "slow_link" or f.get("steps"):
            continue  # no late rank, no straggler period; or listed steps: no period either
        if float(f.get("ms", threshold)) + float(f.get("jitter", 0.0)) < threshold:
            continue  # it can never make an episode the scenario counts: no period to expect
        key = ("node", f["node"]) if f.get("node") else ("rank", f["rank"])
        who = f"node {f['node']}" if f.get("node") else f"rank {f['rank']}"
        out.append((who, int(f["every"]), found.get(key)))
    return out
