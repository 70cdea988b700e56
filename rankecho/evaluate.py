"""Score the straggler diagnosis on the scenario set, end to end: real rank processes on the fake
libraries, one real eBPF agent per node, a real Echo, then ``find_stragglers`` against ground truth.

Each scenario runs into its own Echo (in this process) and its own store; the diagnosis is asked twice:
with ``min_late_ms`` = the scenario's threshold (the episodes it reports are scored against the truth's
episodes of at least that lateness, see :mod:`rankecho.sim.score`), and with no arguments at all (what a user
gets by default: on a healthy scenario it must name nobody). Needs root, bcc and tracefs, like the
agent. Every scenario is also asked ``find_hangs`` (:mod:`rankecho.evaluate_failures`): a scenario with a
hang, crash or desync is scored on that alone (live beside a hang), any other must name none. Usage::

    rankecho evaluate                    # the whole set in sim/scenarios/diagnosis/
    rankecho evaluate sim/scenarios/diagnosis/whole-node.yaml --markdown
    rankecho evaluate sim/scenarios/failures/*.yaml --markdown   # hangs, crashes, desyncs
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rankecho import exitcodes
from rankecho.echo.app import Echo
from rankecho.echo.mcp.diagnosis import EPISODES_LIMIT
from rankecho.echo.mcp.links import pair_name
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.settings import HostPort, Settings
from rankecho.evaluate_failures import (
    describe_fault,
    failure_markdown,
    failure_verdicts,
    is_failure_scenario,
    watched_run,
)
from rankecho.helpfmt import Parser
from rankecho.showcase_cli import EVALUATE_DESCRIPTION, EVALUATE_EXAMPLES, add_evaluate_arguments
from rankecho.sim.launcher import LaunchOptions
from rankecho.sim.procs import LaunchError
from rankecho.sim.scenario import Fault, Scenario, ScenarioError, load_scenario
from rankecho.sim.score import Score, periods, predictions_from, score, spilled_nodes, spilled_ranks
from rankecho.sim.score_failures import FailureScore, score_failures
from rankecho.sim.score_links import LinkScore, score_links

SCENARIO_SET = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "diagnosis"
TARGETS = {"precision": 0.95, "recall": 0.95, "cause_accuracy": 0.90}
"""What the set must reach (episodes pooled over every scenario), with exact periods and no straggler
named on a healthy scenario."""
LINK_TARGETS = {"precision": 0.9, "recall": 0.9, "node_accuracy": 0.9}
"""Slow links (sim/scenarios/links/, issue 24): slow steps pooled over the scenarios with a slow_link, the
right node named at 90% of those found, and no link named on a scenario without a fault."""


@dataclass
class ScenarioResult:
    scenario: str
    describes: str
    true_positives: int
    false_positives: int
    false_negatives: int
    causes_named: int
    causes_right: int
    periods: list[tuple[str, int, int | None]]
    named: list[str]
    """Who the default call (no min_late_ms) names as stragglers."""
    threshold_ms: float
    noise_threshold_ms: float | None
    wall_s: float
    run_dir: str = ""
    notes: list[str] = field(default_factory=list)
    links: LinkScore = field(default_factory=lambda: LinkScore(0, 0, 0, 0))
    """The slow links the scored call reports, against the truth's slow_link steps (sim/score_links.py)."""
    link_faults: int = 0
    failures: FailureScore = field(default_factory=FailureScore)
    """find_hangs against the truth's hangs, crashes and desyncs (sim/score_failures.py): on a scenario
    without any, whatever it names is a false alarm."""
    failure_scenario: bool = False
    """The scenario has a hang, crash or desync: scored in the failures table only (its job stops, so
    there is no straggler or link score)."""
    spilled: set[str] = field(default_factory=set)
    """Named nodes late only where a fault struck one of their ranks, and named ranks late only at a
    fault's steps (sim/score.py ``spilled_nodes``, ``spilled_ranks``): the fault's load on the shared
    cores, not named without a fault."""

    @property
    def score(self) -> Score:
        counts = (self.true_positives, self.false_positives, self.false_negatives)
        return Score(*counts, self.causes_named, self.causes_right)

    @property
    def healthy(self) -> bool:
        return not self.periods and not self.link_faults

    @property
    def faulted(self) -> set[str]:
        """Who has an injected fault, as the default call would name them ("rank 5", "node node-a")."""
        return {who for who, _, _ in self.periods}

    @property
    def unexplained(self) -> set[str]:
        """Named by the default call with no fault behind it; a scenario's links are scored apart (the
        link table), so with a slow_link fault a named link is not one of these."""
        scored_apart = {who for who in self.named if self.link_faults and who.startswith("link ")}
        return set(self.named) - scored_apart - self.faulted - self.spilled

    @property
    def periods_exact(self) -> bool:
        return all(expected == got for _, expected, got in self.periods)


def describe(scenario: Scenario) -> str:
    """One line: nodes, clocks, agents and faults of the scenario."""
    nodes = ", ".join(
        f"{n.id}:{n.ranks}"
        + (f" clock {n.clock_offset_ms:+g} ms" if n.clock_offset_ms else "")
        + (f" drift {n.clock_drift_ppm:+g} ppm" if n.clock_drift_ppm else "")
        + (f" clock step {n.clock_step.ms:+g} ms after step {n.clock_step.at_step}" if n.clock_step else "")
        + (f" agent after step {scenario.agent_start_step(n)}" if scenario.agent_start_step(n) else "")
        + (f" agent killed at step {n.agent_restart_after_step}" if n.agent_restart_after_step else "")
        for n in scenario.nodes
    )
    faults = "; ".join(
        describe_fault(f)
        or f"{f.kind} {f'/{f.factor:g}' if f.kind == 'slow_link' else f'{f.ms:g} ms'} on "
        f"{'node ' + f.node if f.node else 'rank ' + str(f.rank)} {when(f)}"
        for f in scenario.faults
    )
    splits = "".join(f", split {c.name}/{c.group_size}" for c in scenario.communicators)
    j = scenario.jitter
    noise = f" + jitter {j.compute_ms:g}/{j.host_ms:g}/{j.dataloader_ms:g} ms" if j else ""
    return f"{nodes}{splits}; step {scenario.step.compute_ms:g} ms{noise}; {faults or 'no fault'}"


def when(f: Fault) -> str:
    """A delay's steps (and the collective it strikes before, when it chose one)."""
    steps = f"at steps {', '.join(map(str, f.steps))}" if f.steps else f"every {f.every}"
    steps += f" until step {f.end_step}" if f.end_step is not None else ""
    where = f" before {f.comm}" if f.comm not in (None, "world") else ""
    return steps + (where or (f" before bucket {f.bucket}" if f.bucket is not None else ""))


def evaluate(path: Path, workdir: Path, timeout_s: float = 300.0) -> ScenarioResult:
    """Run one scenario under real agents into a fresh Echo and score the diagnosis: find_stragglers
    (unless the scenario has a failure) and find_hangs (always; live beside a hang)."""
    scenario = load_scenario(path)
    token = secrets.token_hex(16)
    any_port = HostPort("127.0.0.1", 0)
    workdir.mkdir(parents=True, exist_ok=True)  # Echo refuses a missing directory (a mistyped --db)
    settings = Settings(
        db_path=workdir / "echo.db", token=token, otlp_grpc=any_port, otlp_http=any_port, mcp_http=None
    )
    started = time.monotonic()
    failing = is_failure_scenario(scenario)
    with Echo(settings) as echo:
        def ask() -> dict[str, Any]:  # the job's own hang threshold: what a user gets (any thread)
            tool = Investigation(echo.reader, load_rates()).failures
            return tool.find_hangs(cluster_id=scenario.cluster_id)

        opts = LaunchOptions(run_dir=workdir / "run", agent_endpoint=echo.grpc_address, token=token,
                             timeout_s=timeout_s, progress=None)  # fmt: skip
        run, hangs, first_named_ns = watched_run(scenario, opts, ask)
        if run.truth is None or (run.returncode != 0 and not failing):
            raise LaunchError(f"scenario {scenario.name} failed (exit {run.returncode}); see {run.run_dir}")
        failures = score_failures(run.truth, hangs, first_named_ns)
        if failing:
            return ScenarioResult(
                scenario.name, describe(scenario), 0, 0, 0, 0, 0, [], [], scenario.straggler_threshold_ms,
                None, round(time.monotonic() - started, 1), str(run.run_dir), failures=failures,
                failure_scenario=True,
            )  # fmt: skip
        diagnosis = Investigation(echo.reader, load_rates()).diagnosis
        threshold = scenario.straggler_threshold_ms
        scored = diagnosis.find_stragglers(min_late_ms=threshold, max_episodes=EPISODES_LIMIT, links=True)
        default = diagnosis.find_stragglers(links=True)
    unseen = [_who(x) for x in scored["stragglers"] if x["episodes_total"] > len(x["episodes"])]
    if unseen:
        raise LaunchError(
            f"scenario {scenario.name}: {', '.join(unseen)} had more than {EPISODES_LIMIT} late episodes, "
            "more than one answer lists; score it with fewer steps"
        )
    s = score(run.truth, predictions_from(run.truth, scored))
    cluster = next((c for c in default["clusters"] if c["cluster_id"] == scenario.cluster_id), None)
    return ScenarioResult(
        scenario=scenario.name,
        describes=describe(scenario),
        true_positives=s.true_positives,
        false_positives=s.false_positives,
        false_negatives=s.false_negatives,
        causes_named=s.causes_named,
        causes_right=s.causes_right,
        periods=periods(run.truth, scored),
        named=[_who(x) for x in default["stragglers"] if x["cluster_id"] == scenario.cluster_id],
        spilled=spilled_nodes(run.truth, default) | spilled_ranks(run.truth, default),
        threshold_ms=scenario.straggler_threshold_ms,
        noise_threshold_ms=cluster["noise"]["threshold_ms"] if cluster else None,
        wall_s=round(time.monotonic() - started, 1),
        run_dir=str(run.run_dir),
        links=score_links(run.truth, scored),
        link_faults=len(run.truth.get("links", [])),
        failures=failures,
    )


def _who(s: dict[str, Any]) -> str:
    if s["kind"] == "link":
        if (pair := pair_name(s)) is not None:
            return f"link {pair}"
        return f"link {s['node_id'] or '(not localised)'}"
    return f"node {s['node_id']}" if s["kind"] == "node" else f"rank {s['rank']}"


def pooled(results: list[ScenarioResult]) -> Score:
    return Score(
        sum(r.true_positives for r in results),
        sum(r.false_positives for r in results),
        sum(r.false_negatives for r in results),
        sum(r.causes_named for r in results),
        sum(r.causes_right for r in results),
    )


def pooled_links(results: list[ScenarioResult]) -> LinkScore:
    """The slow-link score over the scenarios with a slow_link fault."""
    total = LinkScore(0, 0, 0, 0)
    for r in results:
        if r.link_faults:
            total = total + r.links
    return total


def link_markdown(results: list[ScenarioResult]) -> str:
    """The slow-link table (docs/analysis.md#slow-links): per scenario, the slow steps found and the node."""
    lines = ["| scenario | what it is | P | R | TP/FP/FN | right node | links named |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        s = r.links
        lines.append(
            f"| {r.scenario} | {r.describes} | {s.precision:.3f} | {s.recall:.3f} | "
            f"{s.true_positives}/{s.false_positives}/{s.false_negatives} | "
            f"{s.node_right}/{s.true_positives} | {', '.join(s.named) or 'none'} |"
        )
    t = pooled_links(results)
    lines.append(
        f"| **with a slow link** | {sum(bool(r.link_faults) for r in results)} scenarios | "
        f"**{t.precision:.3f}** | **{t.recall:.3f}** | "
        f"{t.true_positives}/{t.false_positives}/{t.false_negatives} | "
        f"{t.node_right}/{t.true_positives} ({t.node_accuracy:.3f}) | "
        f"{sum(bool(r.links.named) for r in results if r.healthy)} healthy named |"
    )
    return "\n".join(lines)


def verdicts(results: list[ScenarioResult]) -> list[str]:
    """What misses a target, in words (empty when the set meets every target)."""
    total = pooled(results)
    misses = [
        f"{name} {getattr(total, name):.3f} < {target}"
        for name, target in TARGETS.items()
        if getattr(total, name) < target
    ]
    misses += [f"{r.scenario}: period {r.periods} not exact" for r in results if not r.periods_exact]
    misses += [f"{r.scenario}: healthy but named {r.named}" for r in results if r.healthy and r.named]
    misses += [f"{r.scenario}: healthy but named links {r.links.named}" for r in results
               if r.healthy and r.links.named]  # fmt: skip
    if any(r.link_faults for r in results):
        links = pooled_links(results)
        misses += [f"links {name} {getattr(links, name):.3f} < {target}"
                   for name, target in LINK_TARGETS.items() if getattr(links, name) < target]  # fmt: skip
    misses += [
        f"{r.scenario}: named {sorted(r.unexplained)} with no fault"
        for r in results
        if not r.healthy and r.unexplained
    ]
    return misses


def markdown(results: list[ScenarioResult]) -> str:
    """The score table of docs/analysis.md."""
    lines = [
        "| scenario | what it is | P | R | TP/FP/FN | period (expected -> found) | cause right "
        "| default call names |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r.score
        per = ", ".join(f"{who}: {e} -> {g if g is not None else '-'}" for who, e, g in r.periods) or "-"
        cause = f"{s.causes_right}/{s.causes_named}" if s.causes_named else "-"
        lines.append(
            f"| {r.scenario} | {r.describes} | {s.precision:.3f} | {s.recall:.3f} | "
            f"{s.true_positives}/{s.false_positives}/{s.false_negatives} | {per} | {cause} | "
            f"{', '.join(r.named) or 'nobody'} |"
        )
    t = pooled(results)
    lines.append(
        f"| **all** | {len(results)} scenarios | **{t.precision:.3f}** | **{t.recall:.3f}** | "
        f"{t.true_positives}/{t.false_positives}/{t.false_negatives} | "
        f"{sum(r.periods_exact for r in results if not r.healthy)}/"
        f"{sum(not r.healthy for r in results)} exact | "
        f"{t.causes_right}/{t.causes_named} ({t.cause_accuracy:.3f}) | "
        f"{sum(bool(r.named) for r in results if r.healthy)} healthy named |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m rankecho.evaluate``: the same flags as ``rankecho evaluate``."""
    parser = Parser(
        prog="python -m rankecho.evaluate", description=EVALUATE_DESCRIPTION, epilog=EVALUATE_EXAMPLES
    )
    add_evaluate_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Evaluate ``args.scenarios`` (flags: :func:`rankecho.showcase_cli.add_evaluate_arguments`)."""
    paths = args.scenarios or sorted(SCENARIO_SET.glob("*.yaml"))
    try:
        for path in paths:  # every file checked before the first (minutes-long) run
            load_scenario(path)
    except ScenarioError as err:
        print(f"rankecho evaluate: {err}", file=sys.stderr)
        return exitcodes.USAGE
    results = []
    for path in paths:
        workdir = Path(tempfile.mkdtemp(prefix=f"rankecho-eval-{path.stem}-"))
        try:
            result = evaluate(path, workdir)
        except LaunchError as err:
            print(f"rankecho evaluate: {err}", file=sys.stderr)
            return exitcodes.FAILED
        results.append(result)
        s = result.score
        scores = (
            f"failures {result.failures}" if result.failure_scenario else
            f"P {s.precision:.3f} R {s.recall:.3f} (TP {s.true_positives} FP {s.false_positives} FN "
            f"{s.false_negatives}) periods {result.periods} causes {s.causes_right}/{s.causes_named} "
            f"named {result.named} links {result.links} false alarms {list(result.failures.false_alarms)}"
        )  # fmt: skip
        print(f"{result.scenario}: {scores} ({result.wall_s} s; {workdir})", file=sys.stderr, flush=True)
        if not args.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(results_json(results))
    print(tables(results) if args.markdown else "\n".join(all_verdicts(results)) or "every target met")
    return exitcodes.OK if not all_verdicts(results) else exitcodes.FAILED


def results_json(results: list[ScenarioResult]) -> str:
    """``--json``'s file: every result as a JSON object (sets, such as ``spilled``, as sorted lists)."""

    def plain(value: object) -> object:
        if isinstance(value, (set, frozenset)):
            return sorted(value)
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    return json.dumps([asdict(r) for r in results], indent=1, default=plain) + "\n"


def tables(results: list[ScenarioResult]) -> str:
    """The straggler table (scenarios without a hang, crash or desync), the slow-link table when any
    link was injected or named, and the failures table when any failure was injected or named."""
    scored = [r for r in results if not r.failure_scenario]
    with_links = any(r.link_faults or r.links.named for r in scored)
    with_failures = any(r.failure_scenario or r.failures.false_alarms for r in results)
    parts = [markdown(scored)] if scored else []
    parts += [link_markdown(scored)] if with_links else []
    parts += [failure_markdown(results)] if with_failures else []
    return "\n\n".join(parts)


def all_verdicts(results: list[ScenarioResult]) -> list[str]:
    """The straggler and link targets on the scenarios they score, then the failure targets on all."""
    scored = [r for r in results if not r.failure_scenario]
    return (verdicts(scored) if scored else []) + failure_verdicts(results)


if __name__ == "__main__":
    sys.exit(main())
