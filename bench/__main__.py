"""Run every benchmark module in ``bench/`` (or those named on the command line) and print its report.

A benchmark module exposes ``run(argv: list[str]) -> dict`` that prints a human-readable report
(medians of several runs, ratios measured side by side in the same run) and returns the same numbers.
``python -m bench ingest mcp`` runs only those (a module with ``ON_REQUEST = True`` runs only when
named); ``--json PATH`` also writes every result, with the date,
commit, command and machine load of the run and of each benchmark, to one file; ``--markdown
docs/benchmarks.md`` rewrites that page's generated section from them. ``--render PATH`` renders a saved
JSON file into ``--markdown`` without running anything.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import pkgutil
import sys
from pathlib import Path
from typing import Any

from bench._report import provenance, render, timed, update_markdown


def discover() -> list[str]:
    here = Path(__file__).parent
    # Packages would be tools, not benchmarks.
    modules = pkgutil.iter_modules([str(here)])
    return sorted(m.name for m in modules if not m.name.startswith("_") and not m.ispkg)


def default_set() -> list[str]:
    """What a run without names runs: every benchmark but those marked ``ON_REQUEST`` (a run of an hour
    and gigabytes of disk, e.g. ``day``), which run only when named."""
    return [n for n in discover() if not getattr(importlib.import_module(f"bench.{n}"), "ON_REQUEST", False)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # -h after benchmark names is that benchmark's help (``python -m bench day --help``), else this one's.
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__, add_help=False)
    parser.add_argument("-h", "--help", action="store_true", help="this help, or the named benchmark's")
    parser.add_argument("names", nargs="*",
                        help=f"benchmarks to run (default: {default_set()}; of {discover()})")
    parser.add_argument("--json", type=Path, help="also write all results and their provenance to this file")
    parser.add_argument("--markdown", type=Path, help="rewrite the generated section of this page")
    parser.add_argument("--render", type=Path, metavar="JSON", help="render a saved --json file, run nothing")
    args, rest = parser.parse_known_args(argv)
    if args.help and not args.names:
        parser.print_help()
        return 0
    if args.help:
        rest = ["--help", *rest]
    if args.render:
        if not args.markdown:
            parser.error("--render needs --markdown PAGE (e.g. docs/benchmarks.md)")
        update_markdown(args.markdown, render(json.loads(args.render.read_text())))
        return 0
    names = args.names or default_set()
    unknown = sorted(set(names) - set(discover()))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; available: {discover()}")
    doc: dict[str, Any] = {"provenance": provenance(argv), "benchmarks": {}}
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        print(f"=== bench.{name}", flush=True)
        entry = timed(functools.partial(module.run, rest))
        doc["benchmarks"][name] = entry
        print(f"=== bench.{name} done in {entry['seconds']:.1f} s\n", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=str))
    if args.markdown:
        update_markdown(args.markdown, render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
