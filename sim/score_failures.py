"""Score a ``fleet.cluster.find_hangs`` answer against a simulated run's ground truth ``failures``
(issue 24's targets for hangs, crashes and desyncs).

- A **hang** is right when the hangs named, together, miss exactly the ranks the truth hung (an instance
  of a sub-communicator misses only its members, so the union is compared), and it was named **live**:
  within max(30 s, 10 steps) of the hang's start. The caller measures when it was first named (the
  answer of a watcher asking while the job is stuck, :mod:`rankecho.sim.hang_watch`); the start is the
  last collective any rank entered before the hung step (the truth logs no time for the hang itself), at
  most one step before the rank stopped, so the time to name is over- rather than under-stated.
- A **crash** is right when the rank named first to exit is the truth's (first by step, then rank).
- A **desync** is right when the first desync named has the truth's rank as its first rank.
- A kind named that the truth does not have is a **false alarm** (on a scenario without failures, any
  hang, crash or desync named): a crash's peers aborting after it are more crashes, not a false alarm.

Usage::

    s = score_failures(truth, answer, first_named_ns=watcher.first_named_ns)
    s.right, s.false_alarms, s.missed, s.named_after_s
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

LIVE_MIN_S = 30.0
LIVE_STEPS = 10
"""A hang must be named within max(LIVE_MIN_S, LIVE_STEPS x the job's step) of its start (issue 24)."""
KINDS = ("hangs", "crashes", "desyncs")
"""find_hangs' answer keys, one per failure kind."""
TRUTH_KIND = {"hang": "hangs", "crash": "crashes", "desync": "desyncs"}


@dataclass(frozen=True)
class FailureScore:
    expected: tuple[str, ...] = ()
    """The truth's failure kinds, as find_hangs names them ("hangs", ...)."""
    named: tuple[str, ...] = ()
    """Of those, the kinds named at all (right or not)."""
    right: tuple[str, ...] = ()
    """Of those, the kinds named with the right rank(s) (and a hang in time)."""
    false_alarms: tuple[str, ...] = ()
    """Kinds named that the truth does not have, one entry per row named ("crashes: rank 2")."""
    wrong: tuple[str, ...] = ()
    """Why each expected kind that was named is not right, in words."""
    named_after_s: float | None = None
    """How long after the hang's start find_hangs first named one (None: no hang, or never named)."""
    live_limit_s: float | None = None
    """max(LIVE_MIN_S, LIVE_STEPS x step) for the truth's hang (None: no hang)."""

    @property
    def missed(self) -> tuple[str, ...]:
        """Expected kinds not named right (named wrong, late, or not at all)."""
        return tuple(k for k in self.expected if k not in self.right)

    @property
    def unnamed(self) -> tuple[str, ...]:
        """Expected kinds find_hangs did not name at all."""
        return tuple(k for k in self.expected if k not in self.named)

    @property
    def ok(self) -> bool:
        return not self.missed and not self.false_alarms


def _ranks(rows: list[dict[str, Any]], key: str) -> str:
    return ", ".join(str(r[key]) for r in rows)


def hang_start_ns(truth: dict[str, Any], step: int) -> int | None:
    """The last collective entry of any rank before ``step`` (None: the hang struck before any)."""
    enters = [r["enter_ns"] for s in truth["per_step"] if s["step"] < step for r in s["ranks"]]
    return max(enters, default=None)


def live_limit_s(truth: dict[str, Any]) -> float:
    steps_ms = [r["step_ms"] for s in truth["per_step"] for r in s["ranks"]]
    step_s = statistics.median(steps_ms) / 1e3 if steps_ms else 0.0
    return max(LIVE_MIN_S, LIVE_STEPS * step_s)


def score_failures(
    truth: dict[str, Any], answer: dict[str, Any], first_named_ns: int | None = None
) -> FailureScore:
    """``answer``: find_hangs for the truth's cluster (for a hang, the one a live watcher kept);
    ``first_named_ns``: wall-clock ns when a hang was first named (a hang is not right without it)."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for f in truth.get("failures", []):
        by_kind.setdefault(TRUTH_KIND[f["kind"]], []).append(f)
    cluster = truth["cluster_id"]
    rows = {k: [r for r in answer.get(k, []) if r.get("cluster_id", cluster) == cluster] for k in KINDS}
    right: list[str] = []
    wrong: list[str] = []
    false_alarms = [f"{k}: {len(rows[k])} named" for k in KINDS if rows[k] and k not in by_kind]
    named_after_s = limit_s = None
    if "hangs" in by_kind:
        hung = {f["rank"] for f in by_kind["hangs"]}
        limit_s = live_limit_s(truth)
        start = hang_start_ns(truth, min(f["step"] for f in by_kind["hangs"]))
        if first_named_ns is not None and start is not None:
            named_after_s = round((first_named_ns - start) / 1e9, 1)
        missing = {m for h in rows["hangs"] for m in h["missing"]}
        if rows["hangs"] and missing != hung:
            wrong.append(f"hang: missing {sorted(missing)}, truth {sorted(hung)}")
        elif rows["hangs"] and (named_after_s is None or named_after_s > limit_s):
            wrong.append(f"hang: named after {named_after_s} s > {limit_s:g} s")
        elif rows["hangs"]:
            right.append("hangs")
    if "crashes" in by_kind and rows["crashes"]:
        first = [c for c in rows["crashes"] if c["first"]]
        truth_rank = by_kind["crashes"][0]["rank"]
        if [c["rank"] for c in first] == [truth_rank]:
            right.append("crashes")
        else:
            wrong.append(f"crash: first to exit named {_ranks(first, 'rank') or 'none'}, truth {truth_rank}")
    if "desyncs" in by_kind and rows["desyncs"]:
        truth_rank = by_kind["desyncs"][0]["rank"]
        if rows["desyncs"][0]["first_rank"] == truth_rank:
            right.append("desyncs")
        else:
            wrong.append(f"desync: first rank named {rows['desyncs'][0]['first_rank']}, truth {truth_rank}")
    return FailureScore(
        expected=tuple(k for k in KINDS if k in by_kind),
        named=tuple(k for k in KINDS if k in by_kind and rows[k]),
        right=tuple(right),
        false_alarms=tuple(false_alarms),
        wrong=tuple(wrong),
        named_after_s=named_after_s,
        live_limit_s=limit_s,
    )
