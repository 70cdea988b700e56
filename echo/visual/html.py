"""The self-contained HTML report: the diagnosis in words, the cross-rank timeline around a late episode,
the lateness heat map, and imposed wait and cost per straggler.

It works offline: the charts are plotly figures whose JavaScript is inlined once into the file (no CDN,
nothing fetched), and the text is the one ``rankecho diagnose`` prints (:func:`render_stragglers`).
Everything drawn comes from find_stragglers' and :class:`rankecho.echo.mcp.timeline.Timeline`'s JSON.

Usage::

    Path("report.html").write_text(report_html(stragglers, view, cells))
"""

from __future__ import annotations

import html
from typing import Any

from rankecho.echo.report import render_stragglers
from rankecho.echo.visual.png import lane_order
from rankecho.echo.visual.trace import LATE_COLOR, drawing_order, kind_of, slice_name


def lane_label(node_id: str, rank: int) -> str:
    return f"{node_id} / rank {rank}"


def timeline_figure(view: dict[str, Any]) -> Any:
    import plotly.graph_objects as go

    lanes = [lane_label(n, r) for n, r in reversed(lane_order(view))]
    origin = view["focus"]["timestamp_ns"]
    fig = go.Figure()
    for kind in drawing_order(view["slices"]):
        style = kind_of(kind)
        for late in (False, True):
            picked = [s for s in view["slices"] if s["kind"] == kind and bool(s.get("late")) == late]
            if not picked:
                continue
            color = LATE_COLOR if kind == "collective" and late else style.color
            fig.add_trace(go.Bar(
                orientation="h",
                y=[lane_label(s["node_id"], s["rank"]) for s in picked],
                base=[(s["start_ns"] - origin) / 1e6 for s in picked],
                x=[max((s["end_ns"] - s["start_ns"]) / 1e6, 0.05) for s in picked],
                width=style.height,
                offset=style.bottom - 0.5,
                marker={"color": color, "opacity": 0.4 if kind == "prewindow" else 1.0},
                name=style.label + (" (late)" if late else ""),
                hovertext=[_hover(s) for s in picked],
                hoverinfo="text",
            ))
    fig.update_layout(
        barmode="overlay",
        height=max(300, 34 * len(lanes) + 140),
        margin={"l": 170, "r": 20, "t": 30, "b": 50},
        xaxis_title="ms from the focused collective instance (clock-corrected)",
        yaxis={"categoryorder": "array", "categoryarray": lanes},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def _hover(s: dict[str, Any]) -> str:
    late = f"<br>late {s['late_ms']} ms" if s.get("late_ms") is not None else ""
    return f"{slice_name(s)}<br>{(s['end_ns'] - s['start_ns']) / 1e6:.2f} ms{late}"


def heatmap_figure(cells: list[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go

    ranks = sorted({(c["node_id"], c["rank"]) for c in cells})
    steps = sorted({c["step"] for c in cells})
    row = {r: i for i, r in enumerate(ranks)}
    col = {s: i for i, s in enumerate(steps)}
    z: list[list[float | None]] = [[None] * len(steps) for _ in ranks]
    for c in cells:
        z[row[(c["node_id"], c["rank"])]][col[c["step"]]] = max(c["late_ms"], 0.0)
    fig = go.Figure(go.Heatmap(z=z, x=steps, y=[lane_label(n, r) for n, r in ranks], colorscale="Magma",
                               reversescale=True, colorbar={"title": "late (ms)"}))  # fmt: skip
    fig.update_layout(height=max(260, 22 * len(ranks) + 120), margin={"l": 170, "r": 20, "t": 20, "b": 40},
                      xaxis_title="step", yaxis={"autorange": "reversed"})  # fmt: skip
    return fig


def cost_rows(found: dict[str, Any]) -> list[dict[str, Any]]:
    """Per straggler: who, imposed GPU-seconds and what they cost (find_stragglers' own numbers)."""
    return [{"straggler": s["summary"].split(":", 1)[0], "imposed GPU-s": s["imposed_gpu_s"],
             "cost": f"{s['cost']['cost']} {s['cost']['currency']}",
             "cost per day": s["cost"]["cost_per_day"]} for s in found["stragglers"]]  # fmt: skip


def report_html(found: dict[str, Any], view: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    """The whole report as one HTML document."""
    parts = [timeline_figure(view).to_html(full_html=False, include_plotlyjs=True, div_id="timeline")]
    if cells:
        parts.append(heatmap_figure(cells).to_html(full_html=False, include_plotlyjs=False, div_id="heatmap"))
    focus = view["focus"]
    straggler = focus.get("straggler")
    headline = straggler["summary"] if straggler else "No straggler in this window."
    costs = cost_rows(found)
    table = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row.values()) + "</tr>" for row in costs
    )
    head = "".join(f"<th>{html.escape(k)}</th>" for k in (costs[0] if costs else {}))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rankecho report</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;max-width:1400px}}
pre{{white-space:pre-wrap;background:#f6f6f6;padding:12px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px}}
.headline{{font-size:1.1em;border-left:4px solid {LATE_COLOR};padding-left:10px}}</style></head><body>
<h1>rankecho report</h1>
<p class="headline" id="headline">{html.escape(headline)}</p>
<h2>Timeline around {html.escape(focus.get("why", ""))}</h2>
<p>One lane per rank, grouped by node, on the clock-corrected time line. {html.escape(_lanes_note(view))}</p>
{parts[0]}
<h2>Lateness, ranks x steps</h2>
{parts[1] if len(parts) > 1 else "<p>No complete step in the window.</p>"}
<h2>Imposed wait and cost</h2>
{f"<table><tr>{head}</tr>{table}</table>" if costs else "<p>No straggler: nothing imposed.</p>"}
<h2>Diagnosis</h2>
<pre id="diagnosis">{html.escape(render_stragglers(found))}</pre>
</body></html>
"""


def _lanes_note(view: dict[str, Any]) -> str:
    cut = " (slices cut at the limit: narrow with --node-id/--rank)" if view.get("truncated") else ""
    return f"{len(view['lanes'])} lanes, {len(view['slices'])} slices{cut}."
