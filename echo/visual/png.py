"""The timeline and the lateness heat map as PNGs (matplotlib, no display needed), for the README,
chat and tickets. Drawn from :class:`rankecho.echo.mcp.timeline.Timeline`'s JSON, like the HTML report.

Usage::

    timeline_png(view, Path("timeline.png")); heatmap_png(cells, Path("heatmap.png"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rankecho.echo.visual.trace import LATE_COLOR, drawing_order, kind_of


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: never a display
    import matplotlib.pyplot as plt

    return plt


def lane_order(view: dict[str, Any]) -> list[tuple[str, int]]:
    """Lanes top to bottom, grouped by node (nodes by name, ranks ascending)."""
    return sorted((lane["node_id"], lane["rank"]) for lane in view["lanes"])


def timeline_png(view: dict[str, Any], out: Path) -> Path:
    plt = _pyplot()
    lanes = lane_order(view)
    index = {lane: i for i, lane in enumerate(reversed(lanes))}
    origin = view["focus"]["timestamp_ns"]
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(lanes) + 1.6), dpi=110)
    for kind in drawing_order(view["slices"]):
        style = kind_of(kind)
        bars: dict[str, list[tuple[float, float, float, float]]] = {}
        for s in view["slices"]:
            if s["kind"] != kind:
                continue
            y, height = index[(s["node_id"], s["rank"])] + style.bottom, style.height
            color = LATE_COLOR if kind == "collective" and s.get("late") else style.color
            start_ms, length_ms = (s["start_ns"] - origin) / 1e6, (s["end_ns"] - s["start_ns"]) / 1e6
            bars.setdefault(color, []).append((start_ms, length_ms, y, height))
        for color, items in bars.items():
            alpha = 0.35 if kind == "prewindow" else 1.0
            ax.barh([b[2] for b in items], [max(b[1], 0.05) for b in items], left=[b[0] for b in items],
                    height=[b[3] for b in items], align="edge", color=color, alpha=alpha,
                    label=style.label)
    ax.set_yticks([i + 0.5 for i in range(len(lanes))])
    ax.set_yticklabels([f"{node} / rank {rank}" for node, rank in reversed(lanes)], fontsize=8)
    ax.set_xlabel("ms from the focused collective instance (clock-corrected)")
    focus = view["focus"]
    who = (focus.get("straggler", {}).get("summary") or focus.get("why", "")).split(" Next:")[0]
    ax.set_title(_wrap(who, 150), fontsize=9, loc="left")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=7, ncols=min(len(unique), 8), loc="upper center",
              bbox_to_anchor=(0.5, -0.12 - 0.3 / max(len(lanes), 1)), frameon=False)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def heatmap_png(cells: list[dict[str, Any]], out: Path) -> Path:
    plt = _pyplot()
    ranks = sorted({(c["node_id"], c["rank"]) for c in cells})
    steps = sorted({c["step"] for c in cells})
    row = {r: i for i, r in enumerate(ranks)}
    col = {s: i for i, s in enumerate(steps)}
    grid = [[float("nan")] * len(steps) for _ in ranks]
    for c in cells:
        grid[row[(c["node_id"], c["rank"])]][col[c["step"]]] = max(c["late_ms"], 0.0)
    fig, ax = plt.subplots(figsize=(12, 0.3 * len(ranks) + 1.5), dpi=110)
    extent = (steps[0] - 0.5, steps[-1] + 0.5, len(ranks) - 0.5, -0.5) if steps else None
    image = ax.imshow(grid, aspect="auto", cmap="magma_r", interpolation="nearest", extent=extent)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"{n} / rank {r}" for n, r in ranks], fontsize=8)
    ax.set_xlabel("step")
    ax.set_title("how late each rank reached each step's first collective (ms)", fontsize=9, loc="left")
    fig.colorbar(image, ax=ax, label="late (ms)")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)[:3])
