"""The per-rank health score (agent/health.py, docs/health.md) at many slowdowns, not one.

A score that only reacted to slowdowns above some factor, a mean for a median, or a baseline window of
the wrong length would pass a single 4.2x case; each test here pins one part of the formula, first on
:mod:`rankecho.agent.health` alone, then through the tracker on synthetic records (no root, no kernel).
"""

from __future__ import annotations

import pytest
from test_agent_tracker import MS, STREAM, Rank

from rankecho.agent.events import FN, OffCpuRecord
from rankecho.agent.health import HISTORY, MIN_HISTORY, StepHealth, score
from rankecho.shared import contract as c

BASE_MS = 90
SLOWDOWNS = [0.5, 0.9, 1.0, 1.1, 1.5, 2.0, 3.0, 4.0, 4.2, 10.0]


def expected(slowdown: float) -> float:
    """docs/health.md: baseline / compute when slower than the baseline, else 1; 4 digits."""
    return round(min(1.0, 1 / slowdown), 4)


@pytest.mark.parametrize("slowdown", SLOWDOWNS)
def test_score_is_the_inverse_slowdown_at_every_factor(slowdown: float) -> None:
    h = StepHealth()
    for _ in range(5):
        assert h.step(BASE_MS * MS).score == 1.0
    slow = h.step(int(slowdown * BASE_MS * MS))
    assert slow.score == expected(slowdown) and slow.baseline_ns == BASE_MS * MS
    assert slow.compute_ns == int(slowdown * BASE_MS * MS)
    assert h.step(BASE_MS * MS).score == 1.0  # one slow step does not move the median baseline


def test_stragglers_by_the_canonical_threshold() -> None:
    # The stragglers query reads value_double < 0.40: a step 2.5x its baseline or slower is one.
    flagged = [f for f in SLOWDOWNS if score(int(f * BASE_MS * MS), BASE_MS * MS, 0, False) < 0.40]
    assert flagged == [3.0, 4.0, 4.2, 10.0]
    assert score(int(2.5 * BASE_MS * MS), BASE_MS * MS, 0, False) == 0.4


def test_no_baseline_until_min_history_steps() -> None:
    h = StepHealth()
    first = [h.step(BASE_MS * MS) for _ in range(MIN_HISTORY)]
    assert [s.baseline_ns for s in first] == [0] * MIN_HISTORY and MIN_HISTORY == 3
    assert h.step(10 * BASE_MS * MS).baseline_ns == BASE_MS * MS  # the 4th step has a baseline
    early = StepHealth()
    assert [early.step(n * MS).score for n in (90, 90, 900)] == [1.0, 1.0, 1.0]  # too soon to judge


def test_baseline_is_the_median_of_the_last_history_steps() -> None:
    h = StepHealth()
    for ms in (10, 90, 200):
        h.step(ms * MS)
    assert h.step(90 * MS).baseline_ns == 90 * MS  # median; the mean would be 100
    h = StepHealth()
    for ms in [90] * HISTORY + [200] * (HISTORY // 2):
        h.step(ms * MS)
    # The window holds 16 steps of each: the median is their midpoint. A window one longer or shorter
    # would hold a majority of one kind (90 or 200).
    assert HISTORY == 32 and h.step(200 * MS).baseline_ns == 145 * MS


@pytest.mark.parametrize(("preempted", "factor"), [(0, 1.0), (25, 0.75), (50, 0.5), (100, 0.0), (200, 0.0),
                                                    (-10, 1.0)])
def test_preempted_share_of_the_step_lowers_the_score(preempted: int, factor: float) -> None:
    assert score(100 * MS, 100 * MS, preempted * MS, False) == factor


def test_factors_multiply_and_stay_in_range() -> None:
    assert score(100, 100, 0, True) == 0.7
    assert score(200, 100, 50, True) == round(0.5 * 0.75 * 0.7, 4)
    assert score(300, 100, 0, False) == 0.3333
    assert score(0, 100, 50, False) == 1.0  # a zero span: nothing to divide, nothing slow
    assert score(50, 100, 0, False) == 1.0
    assert StepHealth().step(-5).compute_ns == 0


def test_edges_of_the_formula_at_nanosecond_spans() -> None:
    assert score(2, 1, 0, False) == 0.5  # any positive baseline counts, down to 1 ns
    assert score(1, 0, 1, False) == 0.0  # a 1 ns span fully preempted
    assert score(0, 100, 0, True) == 0.7  # a zero span is not slow, but throttling still counts
    h = StepHealth()
    assert [h.step(2).score for _ in range(5)] == [1.0] * 5  # by default nothing was preempted


def run_steps(r: Rank, compute_ms: list[float], preempted_ms: dict[int, float] | None = None) -> None:
    """Steps whose compute span (previous completion to next enter) is ``compute_ms[k]``; a step in
    ``preempted_ms`` also spends that long runnable off CPU (and as long asleep, which must not count)."""
    r.init()
    t = 10 * MS
    for k, span in enumerate([0.0, *compute_ms]):
        enter = t + int(span * MS)
        if preempted_ms and k - 1 in preempted_ms:
            off = int(preempted_ms[k - 1] * MS)
            r.t.handle(OffCpuRecord(r.pid, r.pid, t + MS, t + MS + off, t + MS, False, FN.NONE))
            r.t.handle(OffCpuRecord(r.pid, r.pid, t + 2 * MS + off, t + 2 * MS + 2 * off, 0, True, FN.NONE))
        r.call(FN.ALL_REDUCE, enter, enter + MS // 100, a0=0xC0, a1=STREAM, a2=1024, a3=7)
        t = enter + 5 * MS
        r.call(FN.STREAM_SYNC, enter + MS // 50, t, a1=STREAM)


@pytest.mark.parametrize("slowdown", SLOWDOWNS)
def test_tracker_scores_each_step_by_its_compute_span(slowdown: float) -> None:
    r = Rank(0, 2)
    run_steps(r, [BASE_MS] * 5 + [slowdown * BASE_MS, BASE_MS])
    health = r.metric(c.M_HEALTH)
    assert len(health) == 7  # one point per step after the first
    assert [p.value for p in health] == [1.0] * 5 + [expected(slowdown), 1.0]
    slow = health[5]
    assert slow.attributes[c.HEALTH_COMPUTE_MS] == int(slowdown * BASE_MS * MS) / 1e6
    assert slow.attributes[c.HEALTH_BASELINE_MS] == BASE_MS
    # It joins to the step's collective on every rank: the chain of the collective it scores.
    colls = r.metric(c.M_COLLECTIVE)
    assert slow.attributes[c.CAUSAL_CHAIN_ID] == colls[6].attributes[c.CAUSAL_CHAIN_ID]
    assert slow.timestamp_ns == colls[6].attributes[c.COMPLETE_NS]


def test_tracker_discounts_preempted_time_of_that_step_only() -> None:
    r = Rank(0, 2)
    run_steps(r, [BASE_MS] * 6, preempted_ms={4: 45.0})
    assert [p.value for p in r.metric(c.M_HEALTH)] == [1.0] * 4 + [0.5, 1.0]


def test_tracker_applies_the_throttle_factor_of_the_ranks_gpu() -> None:
    hot = lambda info: info.pid == 100  # noqa: E731  (NVML says the GPU of pid 100 is throttled)
    r = Rank(0, 2, throttled=hot)
    run_steps(r, [BASE_MS] * 4 + [2 * BASE_MS])
    assert [p.value for p in r.metric(c.M_HEALTH)] == [0.7] * 4 + [0.35]
    cool = Rank(1, 2, pid=101, throttled=hot)
    run_steps(cool, [BASE_MS] * 2)
    assert [p.value for p in cool.metric(c.M_HEALTH)] == [1.0] * 2
