"""The planting rule: the fan-in proof's numbers come out, deterministically, and every id is unique."""

from __future__ import annotations

import pytest

from rankecho.stress.planting import STRAGGLER_THRESHOLD, StressPlan


def recount(plan: StressPlan) -> tuple[int, int, dict[str, int]]:
    """Count chains and stragglers from the generated events themselves, not from the plan's helpers."""
    events = [plan.event(i) for i in range(plan.total)]
    chains = {e.chain_id for e in events if e.chain_id is not None}
    low = [e for e in events if e.health < STRAGGLER_THRESHOLD]
    per_node: dict[str, int] = {}
    for e in low:
        per_node[e.node_id] = per_node.get(e.node_id, 0) + 1
    return len(chains), len(low), per_node


def test_one_node_of_the_demo_has_40_chains_and_9_stragglers() -> None:
    plan = StressPlan("demo-cluster", "node-a100", producers=1, events_per_producer=1000)
    assert recount(plan) == (40, 9, {"node-a100": 9})
    assert plan.chain_count() == 40 and plan.straggler_count() == 9


def test_fan_in_halves_give_the_proof_totals() -> None:
    halves = [StressPlan(c, n, producers=4, events_per_producer=250) for c, n in (("ca", "a"), ("cb", "b"))]
    chains = sum(recount(p)[0] for p in halves)
    stragglers = sum(recount(p)[1] for p in halves)
    assert (sum(p.total for p in halves), chains, stragglers) == (2000, 80, 18)
    assert (
        halves[0].stragglers_per_node() == recount(halves[0])[2] == {"a-0": 2, "a-1": 2, "a-2": 3, "a-3": 2}
    )


def test_producers_own_contiguous_blocks_with_derived_node_ids() -> None:
    plan = StressPlan("c", "n", producers=3, events_per_producer=5)
    assert plan.node_ids() == ["n-0", "n-1", "n-2"]
    assert [plan.event(i).node_id for i in range(plan.total)] == ["n-0"] * 5 + ["n-1"] * 5 + ["n-2"] * 5
    assert plan.event(7).timestamp_ns == plan.start_ns + 2 * plan.step_ns


def test_events_are_deterministic_and_ids_unique() -> None:
    a = StressPlan("c", "n", producers=8, events_per_producer=250)
    b = StressPlan("c", "n", producers=8, events_per_producer=250)
    assert [a.event(i) for i in range(a.total)] == [b.event(i) for i in range(b.total)]
    assert len({a.event(i).event_id for i in range(a.total)}) == a.total
    other_run = StressPlan("c", "n", producers=8, events_per_producer=250, run_id="r1")
    assert a.event(0).event_id != other_run.event(0).event_id


def test_health_values_stay_on_their_side_of_the_threshold() -> None:
    plan = StressPlan("c", "n", producers=2, events_per_producer=5000, straggler_every=7)
    for i in range(plan.total):
        e = plan.event(i)
        assert 0.0 <= e.health < 1.0
        assert (e.health < STRAGGLER_THRESHOLD) == e.straggler == (i > 0 and i % 7 == 0)


def test_first_event_is_a_chain_marker_but_never_a_straggler() -> None:
    e = StressPlan("c", "n", straggler_every=1).event(0)
    assert e.chain_id is not None and not e.straggler


@pytest.mark.parametrize("field", ["producers", "events_per_producer", "chain_every", "straggler_every"])
def test_nonpositive_parameters_are_refused_by_name(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        StressPlan("c", "n", **{field: 0})  # type: ignore[arg-type]
