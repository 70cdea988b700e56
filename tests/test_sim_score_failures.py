"""Scoring find_hangs against ground truth: a hang is right with exactly the missing ranks and named
within max(30 s, 10 steps) of its start; a crash or desync with the truth's first rank; any kind the truth
lacks is a false alarm (on a healthy run, anything named)."""

from __future__ import annotations

from typing import Any

from rankecho.sim.score_failures import hang_start_ns, live_limit_s, score_failures

STEP_NS = 50_000_000


def truth(failures: list[dict[str, Any]], step_ms: float = 50.0) -> dict[str, Any]:
    """Four ranks, steps 0-2 complete (a failure at step 3), each rank entering its step's collective at
    k x step + rank us."""
    return {
        "cluster_id": "c",
        "per_step": [{"step": k, "ranks": [
            {"rank": r, "enter_ns": k * STEP_NS + r * 1000, "step_ms": step_ms} for r in range(4)]}
            for k in range(3)],
        "failures": failures,
    }  # fmt: skip


HANG = {"kind": "hang", "rank": 3, "step": 3, "ms": None}
CRASH = {"kind": "crash", "rank": 2, "step": 3, "status": 7}
DESYNC = {"kind": "desync", "rank": 1, "step": 3}
START_NS = 2 * STEP_NS + 3000  # the last entry before step 3


def hang(missing: list[int], cluster: str = "c") -> dict[str, Any]:
    return {"cluster_id": cluster, "entered": [r for r in range(4) if r not in missing], "missing": missing}


def answer(hangs: Any = (), crashes: Any = (), desyncs: Any = ()) -> dict[str, Any]:
    return {"hangs": list(hangs), "crashes": list(crashes), "desyncs": list(desyncs)}


def crash(rank: int, first: bool) -> dict[str, Any]:
    return {"cluster_id": "c", "rank": rank, "first": first, "status": 7 if first else 70}


def test_hang_start_and_live_limit() -> None:
    t = truth([HANG])
    assert hang_start_ns(t, 3) == START_NS and hang_start_ns(t, 0) is None
    assert live_limit_s(t) == 30.0 and live_limit_s(truth([HANG], step_ms=5000.0)) == 50.0


def test_hang_named_live_with_the_missing_rank_is_right() -> None:
    # Two open instances (the world's and rank 3's sub-communicator's) both missing rank 3.
    s = score_failures(truth([HANG]), answer([hang([3]), hang([3])]), first_named_ns=START_NS + 12 * 10**9)
    assert (s.expected, s.right, s.missed, s.false_alarms) == (("hangs",), ("hangs",), (), ())
    assert (s.named_after_s, s.live_limit_s, s.ok) == (12.0, 30.0, True)


def test_hang_named_late_or_with_the_wrong_ranks_or_not_at_all_is_missed() -> None:
    late = score_failures(truth([HANG]), answer([hang([3])]), first_named_ns=START_NS + 31 * 10**9)
    assert late.missed == ("hangs",) and late.named_after_s == 31.0 and "31.0 s > 30" in late.wrong[0]
    extra = score_failures(truth([HANG]), answer([hang([2, 3])]), first_named_ns=START_NS)
    assert (extra.missed, extra.unnamed) == (("hangs",), ())
    assert extra.wrong == ("hang: missing [2, 3], truth [3]",)
    never = score_failures(truth([HANG]), answer())
    assert (never.missed, never.unnamed, never.wrong) == (("hangs",), ("hangs",), ())
    assert never.named_after_s is None
    untimed = score_failures(truth([HANG]), answer([hang([3])]))  # no watcher time: not shown live
    assert untimed.missed == ("hangs",)


def test_crash_right_only_with_the_first_rank_and_its_peers_aborts_are_no_alarm() -> None:
    s = score_failures(truth([CRASH]), answer(crashes=[crash(2, True), crash(0, False), crash(1, False)]))
    assert (s.right, s.false_alarms, s.ok) == (("crashes",), (), True)
    wrong = score_failures(truth([CRASH]), answer(crashes=[crash(0, True), crash(2, False)]))
    assert wrong.missed == ("crashes",) and wrong.wrong == ("crash: first to exit named 0, truth 2",)


def test_desync_right_with_the_first_rank_and_a_hang_beside_it_is_a_false_alarm() -> None:
    desync = {"cluster_id": "c", "first_rank": 1}
    assert score_failures(truth([DESYNC]), answer(desyncs=[desync])).ok
    s = score_failures(truth([DESYNC]), answer([hang([1])], desyncs=[{**desync, "first_rank": 0}]))
    assert s.missed == ("desyncs",) and s.false_alarms == ("hangs: 1 named",)


def test_healthy_run_anything_named_is_a_false_alarm_and_other_clusters_are_ignored() -> None:
    assert score_failures(truth([]), answer()).ok
    s = score_failures(truth([]), answer([hang([3])], crashes=[crash(2, True)]))
    assert (s.expected, s.missed, s.false_alarms) == ((), (), ("hangs: 1 named", "crashes: 1 named"))
    assert score_failures(truth([]), answer([hang([3], cluster="other")])).ok
