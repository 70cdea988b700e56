"""Run every benchmark module in ``bench/`` (or those named on the command line) and print its report.

A benchmark module exposes ``run(argv: list[str]) -> dict`` that prints a human-readable report
(medians of several runs, ratios measured side by side in the same run) and returns the same numbers.
``python -m bench ingest mcp`` runs only those; ``--json PATH`` also writes every result to one file.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path


def discover() -> list[str]:
    here = Path(__file__).parent
    # Packages are tools (bench/launch), not benchmarks.
    modules = pkgutil.iter_modules([str(here)])
    return sorted(m.name for m in modules if not m.name.startswith("_") and not m.ispkg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {discover()})")
    parser.add_argument("--json", type=Path, help="also write all results to this JSON file")
    args, rest = parser.parse_known_args(argv)
    names = args.names or discover()
    unknown = sorted(set(names) - set(discover()))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; available: {discover()}")
    results: dict[str, object] = {}
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        print(f"=== bench.{name}", flush=True)
        started = time.monotonic()
        results[name] = module.run(rest)
        print(f"=== bench.{name} done in {time.monotonic() - started:.1f} s\n", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
