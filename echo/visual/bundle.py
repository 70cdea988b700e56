"""One report on disk: ``report.html``, ``timeline.png``, ``heatmap.png`` and ``trace.json`` in a directory.

What ``rankecho report`` writes and ``make demo`` leaves behind, from one :class:`Picture`.
"""

from __future__ import annotations

import json
from pathlib import Path

from rankecho.echo.visual.source import Picture, progress


def write_report(picture: Picture, out: Path) -> Path:
    """Write every file of the report into ``out`` (created); returns the HTML page's path."""
    from rankecho.echo.visual.html import report_html
    from rankecho.echo.visual.png import heatmap_png, timeline_png
    from rankecho.echo.visual.trace import to_trace

    out.mkdir(parents=True, exist_ok=True)
    progress("drawing")
    page = out / "report.html"
    page.write_text(report_html(picture.found, picture.view, picture.cells), encoding="utf-8")
    timeline_png(picture.view, out / "timeline.png")
    if picture.cells:
        heatmap_png(picture.cells, out / "heatmap.png")
    (out / "trace.json").write_text(json.dumps(to_trace(picture.view)), encoding="utf-8")
    return page
