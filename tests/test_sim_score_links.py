"""Scoring slow links against ground truth: each link episode maps to the truth's step by time (the
reference node's clock offset undone); faulted steps found count, others named are false alarms, and
the node named is right or not; straggler entries are left to sim/score.py."""

from __future__ import annotations

from typing import Any

from rankecho.sim.score import predictions_from
from rankecho.sim.score_links import score_links

STEP_NS = 50_000_000
OFFSET_NS = 7_000_000  # the reference node's clock is 7 ms ahead


def truth(slow_steps: list[int]) -> dict[str, Any]:
    return {
        "cluster_id": "c", "straggler_threshold_ms": 20.0,
        "nodes": [{"node_id": "node-a", "clock_offset_ns": OFFSET_NS},
                  {"node_id": "node-b", "clock_offset_ns": 0}],
        "per_step": [{"step": k, "stragglers": [], "ranks": [
            {"rank": r, "enter_ns": k * STEP_NS + r * 1000, "step_ms": 50.0, "entered_late_by_ms": 0.0,
             "gpu_late_by_ms": 0.0, "cause": None} for r in range(4)]} for k in range(20)],
        "links": [{"scope": "node", "node_id": "node-b", "rank": None, "steps": slow_steps}],
    }  # fmt: skip


def answer(entries: list[tuple[str | tuple[str, str] | None, list[int]]]) -> dict[str, Any]:
    """A find_stragglers answer with one link entry per (node named, steps), times on node-a's clock; a
    (node, peer) tuple names the link between two nodes."""
    return {
        "clusters": [{"cluster_id": "c", "reference_node": "node-a"}],
        "stragglers": [
            {"cluster_id": "c", "kind": "link", "node_id": node[0] if isinstance(node, tuple) else node,
             "peer_node_id": node[1] if isinstance(node, tuple) else None,
             "rank": None, "ranks": [2, 3], "episodes": [
                {"step": k, "timestamp_ns": k * STEP_NS + OFFSET_NS + 3_000_000, "ranks": [2, 3],
                 "cause": "slow_link"} for k in steps]}
            for node, steps in entries
        ],
    }  # fmt: skip


def test_right_node_at_every_slow_step() -> None:
    s = score_links(truth([3, 7, 11]), answer([("node-b", [3, 7, 11])]))
    assert (s.true_positives, s.false_positives, s.false_negatives, s.node_right) == (3, 0, 0, 3)
    assert (s.precision, s.recall, s.node_accuracy, s.named) == (1.0, 1.0, 1.0, ("node-b",))


def test_two_nodes_named_at_a_step_is_not_the_right_node() -> None:
    s = score_links(truth([3, 7]), answer([("node-b", [3, 7]), ("node-a", [7])]))
    assert (s.true_positives, s.node_right) == (2, 1)


def test_misses_false_alarms_and_unlocalised_links() -> None:
    s = score_links(truth([3, 7, 11]), answer([(None, [3, 7]), ("node-a", [15])]))
    assert (s.true_positives, s.false_positives, s.false_negatives, s.node_right) == (2, 1, 1, 0)
    assert s.named == ("-", "node-a")


def test_a_healthy_run_and_the_straggler_score_ignore_each_other() -> None:
    t = truth([])
    assert score_links(t, answer([])).precision == 1.0 and score_links(t, answer([])).recall == 1.0
    assert predictions_from(t, answer([("node-b", [3])])) == []  # a link names no late rank


def test_a_link_named_by_rank_is_right_on_its_node() -> None:
    """Send/recv pairs name a rank's own link: its node is the one scored, the rank shows in ``named``."""
    reply = answer([("node-b", [3, 7])])
    reply["stragglers"][0] |= {"rank": 3, "ranks": [3]}
    s = score_links(truth([3, 7]), reply)
    assert (s.true_positives, s.node_right, s.named) == (2, 2, ("rank 3 (node-b)",))


def test_a_node_pair_holding_the_faulted_node_is_right() -> None:
    """The link between two nodes (both ends of the only slow path finished late alike) holds node-b."""
    s = score_links(truth([3, 7, 11]), answer([(("node-a", "node-b"), [3, 7, 11])]))
    assert (s.true_positives, s.node_right, s.named) == (3, 3, ("node-a<->node-b",))


def test_a_pair_without_the_faulted_node_two_single_nodes_or_none_are_wrong() -> None:
    s = score_links(truth([3, 7, 11]), answer([(("node-a", "node-c"), [3]), ("node-a", [7]), ("node-b", [7]),
                                               (None, [11])]))  # fmt: skip
    assert (s.true_positives, s.false_positives, s.node_right) == (3, 0, 0)
    assert s.named == ("-", "node-a", "node-a<->node-c", "node-b")


def test_a_pair_beside_another_link_at_the_step_is_wrong() -> None:
    """Right means one link at the step: a pair holding node-b and a second link named there is not."""
    s = score_links(truth([3, 7]), answer([(("node-a", "node-b"), [3, 7]), ("node-c", [7])]))
    assert (s.true_positives, s.node_right) == (2, 1)
