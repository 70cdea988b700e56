"""``rankecho demo`` and ``rankecho evaluate``: the flags of the demo (:mod:`rankecho.demo`) and of the
scored evaluation (:mod:`rankecho.evaluate`), defined once for both spellings of each (the subcommand and
``python -m rankecho.demo`` / ``python -m rankecho.evaluate``, which the Makefile uses).

Import-light: the demo and the evaluation load Echo, the simulator and the agent only when they run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rankecho.helpfmt import examples

DEMO_DESCRIPTION = (
    "The demo (make demo). Part 1, the fan-in proof: two nodes push 1,000 events each into one Echo, then "
    "the four fan-in queries show that every event landed, every causal chain survived and the stragglers "
    "surface. Part 2 (needs root for eBPF): a simulated job, real agents, and an MCP investigation that "
    "names the straggling rank, its period and its cause. Runs from a source checkout (it drives the "
    "repository's bench/ launchers). Exit 0 only if every check holds."
)
DEMO_EXAMPLES = examples("rankecho demo", "rankecho demo --part fanin --keep /tmp/echo-fanin-demo.db")
EVALUATE_DESCRIPTION = (
    "Score the straggler diagnosis on the scenario set, end to end: real rank processes on the fake "
    "libraries, one real eBPF agent per node, a real Echo, then find_stragglers (and find_hangs: hangs, "
    "crashes and desyncs named, or none on a scenario without one) against ground truth. "
    "Needs root, bcc and tracefs, like the agent. Exit 0 when every target is met."
)
EVALUATE_EXAMPLES = examples(
    "rankecho evaluate", "rankecho evaluate sim/scenarios/diagnosis/whole-node.yaml --markdown"
)


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep", type=Path, help="copy the fan-in DB here (e.g. /tmp/echo-fanin-demo.db)")
    p.add_argument(
        "--part",
        choices=("fanin", "straggler", "all"),
        default="all",
        help="fanin: the fan-in proof; straggler: sim + eBPF agents + MCP investigation (root); all: both",
    )


def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "scenarios", nargs="*", type=Path, help="scenario files (default: the set in sim/scenarios/diagnosis)"
    )
    p.add_argument("--markdown", action="store_true", help="print the score table as Markdown")
    p.add_argument("--json", type=Path, metavar="OUT", help="write every result as JSON")
    p.add_argument("--keep", action="store_true", help="keep each run's directory and store")


def _demo(args: argparse.Namespace) -> int:
    from rankecho.demo import run

    return run(args)


def _evaluate(args: argparse.Namespace) -> int:
    from rankecho.evaluate import run

    return run(args)


def register(subparsers: Any) -> None:
    """Add ``rankecho demo`` and ``rankecho evaluate``."""
    demo = subparsers.add_parser(
        "demo", help="the fan-in proof, then a straggler investigation (make demo)",
        description=DEMO_DESCRIPTION, epilog=DEMO_EXAMPLES,
    )  # fmt: skip
    add_demo_arguments(demo)
    demo.set_defaults(handler=_demo)
    evaluate = subparsers.add_parser(
        "evaluate", help="score the diagnosis on the scenario set against ground truth (root)",
        description=EVALUATE_DESCRIPTION, epilog=EVALUATE_EXAMPLES,
    )  # fmt: skip
    add_evaluate_arguments(evaluate)
    evaluate.set_defaults(handler=_evaluate)
