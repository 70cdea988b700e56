"""How big and how slow ``rankecho report`` is on big stores: its output must stay bounded.

For each ``--sizes`` entry, the analysis benchmark's synthetic store of that many events
(:func:`bench.analysis.build`: 16 ranks on 2 nodes, two planted stragglers) gets a whole report written
from it, as ``rankecho report --db`` does: find_stragglers, the timeline around the latest late episode,
the heat map, the HTML page, two PNGs and the trace. Reported per size (medians of ``--repeat`` runs):
seconds per stage and bytes per file. The page and the trace are bounded by the timeline's slice cap
and the heat map's step cap, not by the store: the ratio of the largest to the smallest store's report
size is printed beside the ratio of their event counts.

Usage: ``python -m bench report [--sizes 1000000,10000000] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.analysis import build
from rankecho.echo.visual.bundle import write_report
from rankecho.echo.visual.source import picture_from_store


def measure(db: Path, out: Path) -> dict[str, float]:
    started = time.perf_counter()
    picture = picture_from_store(db, None, None, timeout_s=600.0, memory_limit="8GB")
    queried = time.perf_counter()
    write_report(picture, out)
    drawn = time.perf_counter()
    sizes = {f"{p.name}_bytes": float(p.stat().st_size) for p in sorted(out.iterdir())}
    counts = {"slices": float(len(picture.view["slices"])), "heatmap_cells": float(len(picture.cells))}
    return {"query_s": queried - started, "draw_s": drawn - queried, "total_s": drawn - started, **counts,
            **sizes}


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench report")
    parser.add_argument("--sizes", default="1000000,10000000", help="events per store, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    args, _ = parser.parse_known_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rankecho-bench-report-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            db = Path(tmp) / f"store-{size}.db"
            print(f"building a {size:,}-event store ...", flush=True)
            build(db, size).close()
            runs = [measure(db, Path(tmp) / f"out-{size}-{i}") for i in range(args.repeat)]
            median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            results[str(size)] = median
            m = median
            print(f"{size:>12,} events: report in {m['total_s']:.2f} s (queries {m['query_s']:.2f} s, "
                  f"drawing {m['draw_s']:.2f} s); report.html {m['report.html_bytes'] / 1e6:.2f} MB, "
                  f"trace.json {m['trace.json_bytes'] / 1e6:.2f} MB, {m['slices']:.0f} slices, "
                  f"{m['heatmap_cells']:.0f} heat-map cells")
    sizes = sorted(results, key=int)
    if len(sizes) > 1:
        small, large = results[sizes[0]], results[sizes[-1]]
        ratio = large["report.html_bytes"] / small["report.html_bytes"]
        print(f"events x{int(sizes[-1]) / int(sizes[0]):.0f}: report.html x{ratio:.2f}, "
              f"time x{large['total_s'] / small['total_s']:.2f}")  # fmt: skip
        results["size_ratio"] = ratio
    return results
