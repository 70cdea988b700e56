"""The ``rankecho`` console script: one parser, subcommands owned by the packages that implement them.

Each package named in ``SUBCOMMAND_MODULES`` exposes ``register(subparsers)``, which adds its subcommands
and sets ``handler`` (a callable taking the parsed namespace and returning an exit code). Those modules
import only argparse-level code, so ``rankecho --help`` stays fast; heavy imports happen in handlers.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rankecho import __version__

SUBCOMMAND_MODULES = ("rankecho.echo.cli", "rankecho.stress.cli", "rankecho.agent.cli", "rankecho.sim.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankecho",
        description="Find the GPU rank that stalls a distributed job when every host looks healthy.",
    )
    parser.add_argument("--version", action="version", version=f"rankecho {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        module = importlib.import_module(module_name)
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    long_running = words[:1] == ["sim"] or (words[:1] == ["agent"] and "check" not in words)
    if long_running:
        # Before anything heavy: an agent (or a sim) told to stop while it starts must still stop cleanly.
        from rankecho.agent import stopflag

        stopflag.install()
    try:
        return _dispatch(argv)
    finally:
        if long_running:  # done: a repeated stop must not turn the exit into -15 during finalization
            stopflag.ignore_further()


def _dispatch(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130
