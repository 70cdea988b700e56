"""The ``rankecho`` console script: one parser, subcommands owned by the packages that implement them.

Each package named in ``SUBCOMMAND_MODULES`` exposes ``register(subparsers)``, which adds its subcommands
and sets ``handler`` (a callable taking the parsed namespace and returning an exit code). Those modules
import only argparse-level code, so ``rankecho --help`` stays fast; heavy imports happen in handlers.
Every parser is a :class:`rankecho.helpfmt.Parser` (defaults shown, examples kept as written). What is
handled here once for every command: Ctrl-C (exit 130) and a reader that goes away (``rankecho diagnose
| head``: no traceback, exit 141 like any Unix tool killed by SIGPIPE). docs/cli.md lists the commands.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from rankecho import __version__, exitcodes
from rankecho.helpfmt import Parser, examples

SUBCOMMAND_MODULES = (
    "rankecho.echo.cli",
    "rankecho.echo.visual.cli",
    "rankecho.stress.cli",
    "rankecho.agent.cli",
    "rankecho.sim.cli",
    "rankecho.showcase_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="rankecho",
        description="Find the GPU rank that stalls a distributed job when every host looks healthy.",
        epilog=examples(
            "rankecho serve --db echo.db --token-file token",
            "rankecho diagnose --mcp-url http://127.0.0.1:8000/mcp --token-file token",
            "rankecho COMMAND --help",
        ),
    )
    parser.add_argument("--version", action="version", version=f"rankecho {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        module = importlib.import_module(module_name)
        module.register(subparsers)
    return parser


def _quiet_broken_pipe() -> int:
    """The reader of stdout went away (``| head``): point stdout at /dev/null so the interpreter's last
    flush cannot raise again (the Python docs' recipe), and exit as a SIGPIPE-killed tool would."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return exitcodes.BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    long_running = words[:1] == ["sim"] or (words[:1] == ["agent"] and "check" not in words)
    if long_running:
        # Before anything heavy: an agent (or a sim) told to stop while it starts must still stop cleanly.
        from rankecho import stopflag

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
        return exitcodes.USAGE
    try:
        code = int(handler(args) or exitcodes.OK)
        sys.stdout.flush()  # inside the try: a closed pipe often shows only at this last flush
        return code
    except KeyboardInterrupt:
        return exitcodes.INTERRUPTED
    except BrokenPipeError:
        return _quiet_broken_pipe()
