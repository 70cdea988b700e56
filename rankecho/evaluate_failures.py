"""The failures half of ``rankecho evaluate``: hangs, crashes and desyncs (issue 24), scored on every
scenario it runs.

A scenario with a ``hang``, ``crash`` or ``desync`` fault is a failure scenario: its job stops rather than
slows, so it is scored here only (not in the straggler or link tables). Every other scenario (straggler,
link, healthy) is checked here too: ``find_hangs`` must name nothing on it. A hang is only worth naming
while it happens, so a scenario with a hang runs beside :class:`rankecho.sim.hang_watch.HangWatch`, asking
with the job's own threshold (what a user gets); everything else is asked once the run has ended. Scoring
is :mod:`rankecho.sim.score_failures`. Usage (from :mod:`rankecho.evaluate`)::

    result, answer, first_named_ns = watched_run(scenario, opts, ask)
    score = score_failures(result.truth, answer, first_named_ns)
    print(failure_markdown(results)); failure_verdicts(results)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rankecho.agent.tracker import PENDING_TIMEOUT_NS
from rankecho.sim.hang_watch import HangWatch
from rankecho.sim.launcher import LaunchOptions, RunResult, run_scenario
from rankecho.sim.scenario import FAILURE_KINDS, Fault, Scenario
from rankecho.sim.score_failures import FailureScore

SETTLE_S = PENDING_TIMEOUT_NS / 1e9 + 2
"""A hang answer unchanged for one agent pending timeout (plus a poll) has every node's open calls."""


class Scored(Protocol):
    """What the failures table reads of a scenario's result (rankecho.evaluate.ScenarioResult)."""

    scenario: str
    describes: str
    failures: FailureScore

    @property
    def failure_scenario(self) -> bool: ...


def is_failure_scenario(scenario: Scenario) -> bool:
    return any(f.kind in FAILURE_KINDS for f in scenario.faults)


def describe_fault(f: Fault) -> str:
    """A failure fault in words ("hang for good on rank 3 at step 3"); '' for a fault of another kind."""
    who = f"node {f.node}" if f.node else f"rank {f.rank}"
    before = f" before {f.comm}" if f.comm not in (None, "world") else ""
    at = f"at step {f.start_step}" + (before or (f" before bucket {f.bucket}" if f.bucket else ""))
    if f.kind == "hang":
        return f"hang {'for good' if not f.ms else f'{f.ms:g} ms'} on {who} {at}"
    if f.kind == "crash":
        return f"crash (exit {f.status}) on {who} {at}"
    if f.kind == "desync":
        return f"desync (twice the bytes) on {who} {at}"
    return ""


def watched_run(
    scenario: Scenario, opts: LaunchOptions, ask: Callable[[], dict[str, Any]]
) -> tuple[RunResult, dict[str, Any], int | None]:
    """Run the scenario; with a hang fault, beside the live watcher. Returns the run, the find_hangs
    answer to score (the watcher's settled one for a hang; else asked after the run) and when a hang was
    first named (wall-clock ns; None when none was)."""
    if not any(f.kind == "hang" for f in scenario.faults):
        result = run_scenario(scenario, opts)
        answer = ask()
        return result, answer, None
    if opts.run_dir is None:
        raise ValueError("a hang scenario needs a run directory: the watcher reads the hung rank's pid there")
    with HangWatch(ask, opts.run_dir, scenario, settle_s=SETTLE_S) as watch:
        result = run_scenario(scenario, opts)
    return result, watch.answer or ask(), watch.first_named_ns


def _named(s: FailureScore) -> str:
    return ", ".join(s.right) or "-"


def failure_markdown(results: Sequence[Scored]) -> str:
    """The failures table (docs/analysis.md#hangs-crashes-and-desyncs): per scenario, the failures the
    truth has, those named right, false alarms, misses (and why) and the time to name a hang."""
    lines = [
        "| scenario | what it is | failures | named right | false alarms | missed | hang named after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r.failures
        missed = "; ".join([*s.wrong, *(f"{k} not named" for k in s.unnamed)]) or "-"
        after = "-"
        if s.live_limit_s is not None:
            when = "never" if s.named_after_s is None else f"{s.named_after_s} s"
            after = f"{when} (limit {s.live_limit_s:g} s)"
        lines.append(
            f"| {r.scenario} | {r.describes} | {', '.join(s.expected) or 'none'} | {_named(s)} | "
            f"{'; '.join(s.false_alarms) or 'none'} | {missed} | {after} |"
        )
    expected = sum(len(r.failures.expected) for r in results)
    right = sum(len(r.failures.right) for r in results)
    alarms = sum(bool(r.failures.false_alarms) for r in results)
    lines.append(
        f"| **all** | {len(results)} scenarios ({sum(r.failure_scenario for r in results)} with a failure) "
        f"| {expected} | **{right}/{expected}** | **{alarms} scenarios** | {expected - right} | |"
    )
    return "\n".join(lines)


def failure_verdicts(results: Sequence[Scored]) -> list[str]:
    """The failure targets missed, in words: every failure named right, and nothing named on a scenario
    without one (straggler, link and healthy scenarios included)."""
    misses = [f"{r.scenario}: {why}" for r in results for why in r.failures.wrong]
    misses += [f"{r.scenario}: {kind} not named" for r in results for kind in r.failures.unnamed]
    misses += [f"{r.scenario}: false alarm {a}" for r in results for a in r.failures.false_alarms]
    return misses
