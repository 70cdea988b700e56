"""Diagnosis results rendered for a person at a terminal: one paragraph per straggler, then a table.

The same dicts the MCP tools return (:mod:`rankecho.echo.mcp.diagnosis`) come in; nothing is recomputed here.
``rankecho diagnose`` and the demo print with it.

Usage::

    print(render_stragglers(Diagnosis(inv).find_stragglers("last 10m")))
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rankecho.echo.mcp.links import pair_name
from rankecho.exitcodes import FAILED


def text_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as an aligned text table (floats to 3 places)."""
    if not rows:
        return "  (no rows)"
    cols = list(rows[0])
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in (r[c] for c in cols)] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]

    def line(vals: Sequence[str]) -> str:
        return "  " + " | ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True))

    return "\n".join([line(cols), "  " + "-+-".join("-" * w for w in widths), *(line(r) for r in cells)])


def _who(s: dict[str, Any]) -> str:
    if s["kind"] == "link":  # a slow transfer, not a late rank (echo/mcp/links.py)
        if s.get("rank") is not None:
            return f"link at rank {s['rank']} ({s['node_id']})"
        if (pair := pair_name(s)) is not None:
            return f"link {pair}"
        return f"link at {s['node_id']}" if s["node_id"] is not None else "link (not localised)"
    return f"node {s['node_id']}" if s["kind"] == "node" else f"rank {s['rank']} ({s['node_id']})"


def straggler_rows(stragglers: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One table row per straggler, the columns a person scans first."""
    rows = []
    for s in stragglers:
        period = s["period"]
        rows.append(
            {
                "straggler": _who(s),
                "side": s["side"],
                "episodes": s["episodes_total"],
                "share": f"{100 * (s['share_of_steps'] or 0):.1f}%",
                "late ms (median/p95)": f"{s['late_ms']['median']:.1f}/{s['late_ms']['p95']:.1f}",
                "every": f"{period['steps']} (conf {period['confidence']:.2f})" if period else "-",
                "cause": s["cause"]["class"],
                "imposed GPU-s": s["imposed_gpu_s"],
                "slowdown": f"x{s['what_if']['slowdown']:.3f}" if s["what_if"]["slowdown"] else "-",
            }
        )
    return rows


def render_stragglers(result: dict[str, Any]) -> str:
    """The whole answer of find_stragglers as text."""
    window = result["window"]
    span = "all stored data" if window["start"] is None and window["end"] is None else (
        f"{window['start'] or 'the start'} to {window['end'] or 'now'}"
    )  # fmt: skip
    job = result.get("job_id")
    out = [f"Stragglers over {span}" + (f", job {job!r}" if job else "")]
    if result.get("no_data"):
        out.append(f"  {result['no_data']}")
    for cluster in result["clusters"]:
        noise = cluster["noise"]
        step = cluster.get("step_ms_mean")
        out.append(
            f"\ncluster {cluster['cluster_id']}: {cluster['ranks']} ranks, {cluster['steps']} steps"
            + (f" of {step} ms (mean: the window's span over its steps; every step time below is a mean)"
               if step is not None else "")
            + f"; lateness threshold {noise['threshold_ms']} ms from the job's "
            f"noise (sigma {noise['sigma_ms']} ms); times on {cluster['reference_node']}'s clock"
        )  # fmt: skip
        out.append(f"  {cluster['verdict']}")
        named = [s for s in result["stragglers"] if s["cluster_id"] == cluster["cluster_id"]]
        for s in named:
            out.append(f"\n  {s['summary']}")
        if named:
            out.append("\n" + text_table(straggler_rows(named)))
        isolated = [x for x in result["isolated_late_episodes"] if x["cluster_id"] == cluster["cluster_id"]]
        if isolated:
            listed = ", ".join(
                f"{_who(x)} ({x['episodes_total']}, max {x['late_ms']['max']:.0f} ms)"
                for x in isolated
            )
            out.append(f"\n  isolated late episodes, too few or small to tell from noise: {listed}")
    if result["truncated"]:
        out.append("\n(more stragglers than shown: narrow the window or pass --cluster-id)")
    return "\n".join(out)


def no_data_exit(command: str, result: dict[str, Any], as_json: bool) -> int | None:
    """When the answer says there was no agent data (``no_data``), print that on stderr (with --json also
    an error object on stdout) and return exit code 1: nothing to diagnose is a failure to answer, not
    "no straggler". None when there was data."""
    message = result.get("no_data")
    if not message:
        return None
    print(f"rankecho {command}: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_code": FAILED, "window": result.get("window")}, indent=1))
    return FAILED
