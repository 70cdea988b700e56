"""Score the slow links a diagnosis reports against a simulated run's ground truth (issue 24's targets).

An episode is a slow step: a step at which a ``slow_link`` fault fired (the truth's ``links[].steps``). The
diagnosis reports each slow step as an episode of a ``kind: 'link'`` entry of find_stragglers, named by
time; this maps it to the truth's step whose calls are nearest (after undoing the reference node's true
clock offset at that step, as :mod:`rankecho.sim.score` does for stragglers). A named slow step with no
fault is a false positive, a faulted step not named a false negative; of the true positives, ``node_right``
counts those where one link is named at that step and it holds the faulted node (a node's NIC: that node; a
rank's link: the rank's node): the faulted node itself, a rank on it, or a node pair (the link between two
nodes, ``peer_node_id`` set) of which it is one end. A pair is the most the data can say where both ends of
the only slow inter-node path finished late alike (two nodes, or a rank and its one partner); the search is
then down to one path and its two ends. Two links named at the step (two single nodes, say), a pair without
the faulted node, or a link not localised, is not right. Usage::

    s = score_links(truth, diagnosis)   # diagnosis: Diagnosis.find_stragglers(...)
    s.precision, s.recall, s.node_accuracy
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rankecho.echo.mcp.links import pair_name
from rankecho.sim.score import true_time


@dataclass(frozen=True)
class LinkScore:
    true_positives: int
    false_positives: int
    false_negatives: int
    node_right: int
    named: tuple[str, ...] = ()
    """Who the diagnosis names as slow links ("node-b", "node-a<->node-b" for the link between two nodes,
    "rank 3 (node-b)" when send/recv pairs single out a rank, or "-" when not localised)."""

    @property
    def precision(self) -> float:
        named = self.true_positives + self.false_positives
        return self.true_positives / named if named else 1.0

    @property
    def recall(self) -> float:
        real = self.true_positives + self.false_negatives
        return self.true_positives / real if real else 1.0

    @property
    def node_accuracy(self) -> float:
        return self.node_right / self.true_positives if self.true_positives else 1.0

    def __add__(self, other: LinkScore) -> LinkScore:
        return LinkScore(
            self.true_positives + other.true_positives, self.false_positives + other.false_positives,
            self.false_negatives + other.false_negatives, self.node_right + other.node_right,
            self.named + other.named,
        )  # fmt: skip


def link_steps(truth: dict[str, Any], diagnosis: dict[str, Any]) -> dict[int, set[tuple[str, ...]]]:
    """Every slow step the diagnosis names for the truth's cluster, as truth step -> the links named there,
    each as the nodes it holds (one node, a rank's node, a pair's two; () when not localised); an episode
    no step's calls are near (within half a step) maps to step -1."""
    to_true = true_time(truth, diagnosis)
    calls = sorted((r["enter_ns"], s["step"]) for s in truth["per_step"] for r in s["ranks"])
    steps_ms = sorted(r["step_ms"] for s in truth["per_step"] for r in s["ranks"])
    half_step_ns = (steps_ms[len(steps_ms) // 2] if steps_ms else 100.0) * 1e6 / 2
    out: dict[int, set[tuple[str, ...]]] = {}
    for entry in diagnosis["stragglers"]:
        if entry["cluster_id"] != truth["cluster_id"] or entry["kind"] != "link":
            continue
        for episode in entry["episodes"]:
            true_ns = to_true(episode["timestamp_ns"])
            nearest = min(calls, key=lambda c: abs(c[0] - true_ns), default=None)
            step = nearest[1] if nearest and abs(nearest[0] - true_ns) <= half_step_ns else -1
            out.setdefault(step, set()).add(_nodes(entry))
    return out


def score_links(truth: dict[str, Any], diagnosis: dict[str, Any]) -> LinkScore:
    faulted: dict[int, str] = {}
    for link in truth.get("links", []):
        for step in link["steps"]:
            faulted[step] = link["node_id"]
    named = link_steps(truth, diagnosis)
    tp = [step for step in named if step in faulted]
    who = tuple(sorted({_named(e) for e in diagnosis["stragglers"]
                        if e["kind"] == "link" and e["cluster_id"] == truth["cluster_id"]}))  # fmt: skip
    return LinkScore(
        true_positives=len(tp),
        false_positives=len(set(named) - set(faulted)),
        false_negatives=len(set(faulted) - set(named)),
        node_right=sum(len(named[step]) == 1 and faulted[step] in next(iter(named[step])) for step in tp),
        named=who,
    )


def _nodes(entry: dict[str, Any]) -> tuple[str, ...]:
    """The nodes a link entry holds: its node, and its peer when it is the link between two nodes."""
    return tuple(n for n in (entry["node_id"], entry.get("peer_node_id")) if n is not None)


def _named(entry: dict[str, Any]) -> str:
    if entry.get("rank") is not None:
        return f"rank {entry['rank']} ({entry['node_id']})"
    return pair_name(entry) or entry["node_id"] or "-"
