"""Score a straggler diagnosis against a simulated run's ground truth.

Positives are the (step, rank) pairs where a rank entered at least the threshold late *and* a fault
was injected there. A rank that was that late with no injected fault (scheduling noise on a busy
machine) really was late, so naming it is neither rewarded nor penalised. Usage::

    s = score(truth, {(7, 5, "alloc_stall"), (21, 5, None)})
    s.precision, s.recall, s.cause_accuracy
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Prediction = tuple[int, int, str | None]
"""(step, rank, cause or None when the diagnosis names no cause)"""


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


def injected_stragglers(truth: dict[str, Any]) -> dict[tuple[int, int], str]:
    """(step, rank) -> cause, for every straggler the ground truth attributes to an injected fault."""
    return {
        (s["step"], x["rank"]): x["cause"]
        for s in truth["per_step"]
        for x in s["stragglers"]
        if x["cause"] is not None
    }


def score(truth: dict[str, Any], predictions: Iterable[Prediction]) -> Score:
    positives = injected_stragglers(truth)
    noise = {(s["step"], x["rank"]) for s in truth["per_step"] for x in s["stragglers"] if x["cause"] is None}
    named = {(step, rank): cause for step, rank, cause in predictions}
    tp = [key for key in named if key in positives]
    fp = [key for key in named if key not in positives and key not in noise]
    with_cause = [key for key in tp if named[key] is not None]
    return Score(
        true_positives=len(tp),
        false_positives=len(fp),
        false_negatives=len(set(positives) - set(named)),
        causes_named=len(with_cause),
        causes_right=sum(named[key] == positives[key] for key in with_cause),
    )
