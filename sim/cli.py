"""Subcommands of `rankecho` implemented by the `sim` package: `rankecho sim SCENARIO.yaml`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rankecho import exitcodes
from rankecho.helpfmt import DeprecatedAlias, examples
from rankecho.shared.clientflags import add_token_options


def register(subparsers: Any) -> None:
    """Add this package's subcommands to the `rankecho` parser."""
    p = subparsers.add_parser(
        "sim",
        help="run a simulated GPU cluster (fake libcudart/libnccl, one process per rank)",
        description="Launch nodes x ranks of simrank processes from a scenario file; see docs/sim.md. "
        "With --endpoint, one rankecho agent per node traces them and sends to that Echo (root).",
        epilog=examples(
            "rankecho sim sim/scenarios/seed-rank5.yaml --ground-truth truth.json",
            "sudo rankecho sim sim/scenarios/seed-rank5.yaml --endpoint 127.0.0.1:4317 --token-file token",
        ),
    )
    p.add_argument("scenario", type=Path, help="scenario YAML (e.g. sim/scenarios/seed-rank5.yaml)")
    p.add_argument(
        "--ground-truth", type=Path, metavar="OUT.json", help="write per-step, per-rank ground truth"
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="where node libraries and rank logs go (default: a new temporary directory)",
    )
    p.add_argument(
        "--endpoint",
        metavar="HOST:PORT",
        help="start one rankecho agent per node, exporting to this Echo's OTLP/gRPC HOST:PORT",
    )
    p.add_argument(
        "--agent-endpoint",
        action=DeprecatedAlias,
        replacement="--endpoint",
        dest="endpoint",
        metavar="HOST:PORT",
    )
    add_token_options(p, token_flag=True)
    p.add_argument("--steps", type=int, help="override the scenario's step count")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="stop everything after this long")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    import os
    import sys

    from rankecho.shared.clientflags import TokenFileError, read_token
    from rankecho.sim.launcher import LaunchOptions, run_scenario
    from rankecho.sim.procs import LaunchError
    from rankecho.sim.scenario import ScenarioError, load_scenario

    try:
        scenario = load_scenario(args.scenario)
        if args.steps is not None:
            if args.steps < 1:
                raise ScenarioError("--steps must be at least 1")
            scenario = scenario.with_steps(args.steps)
        token = read_token(args.token_file, os.environ, token=args.token)
    except (ScenarioError, TokenFileError) as e:
        print(f"rankecho sim: {e}", file=sys.stderr)
        return exitcodes.USAGE
    opts = LaunchOptions(
        run_dir=args.run_dir,
        ground_truth=args.ground_truth,
        agent_endpoint=args.endpoint,
        token=token,
        timeout_s=args.timeout,
        progress=None if args.quiet else sys.stderr,
    )
    try:
        return run_scenario(scenario, opts).returncode
    except LaunchError as e:
        print(f"rankecho sim: {e}", file=sys.stderr)
        return exitcodes.FAILED
