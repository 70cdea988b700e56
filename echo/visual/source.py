"""Where the report and the trace get their JSON: a store file opened here, or a running Echo over MCP.

Both go through :mod:`rankecho.echo.ask` (the path ``diagnose`` and ``explain`` take), so the two sources
give the same dicts and fail with the same messages: find_stragglers' answer, the timeline and the heat
map, from the tools' core in this process or from the MCP tools of a running Echo.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankecho.echo.ask import ask_endpoint, ask_store

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation


@dataclass(frozen=True)
class Picture:
    """Everything a report or a trace draws."""

    found: dict[str, Any]
    """find_stragglers' answer for the window."""
    view: dict[str, Any]
    """The timeline around the focused episode (:meth:`Timeline.around`)."""
    cells: list[dict[str, Any]]
    """The lateness heat map's cells."""


def picture_from_store(db: Path, window: str | None, cluster_id: str | None, timeout_s: float,
                       memory_limit: str, **around: Any) -> Picture:  # fmt: skip
    """The picture of a store file no Echo holds, computed in this process."""

    def question(inv: Investigation) -> dict[str, Any]:
        from rankecho.echo.mcp.timeline import TimelineError
        from rankecho.echo.mcp.tools import InvestigationError

        try:
            progress("finding stragglers")
            found = inv.diagnosis.find_stragglers(window, cluster_id)
            progress("reading the timeline around the focused episode")
            view = inv.timeline.around(window, cluster_id, **around)
            progress("reading the lateness heat map")
            cells = inv.timeline.heatmap(window, view["focus"].get("cluster_id"))["cells"]
        except TimelineError as exc:
            raise InvestigationError(str(exc)) from None
        return {"found": found, "view": view, "cells": cells}

    got = ask_store(db, question, timeout_s, memory_limit)
    return Picture(got["found"], got["view"], got["cells"])


def picture_from_mcp(url: str, token: str | None, window: str | None, cluster_id: str | None,
                     timeout_s: float, **around: Any) -> Picture:  # fmt: skip
    """The picture a running Echo's MCP tools give (find_stragglers, then timeline with the heat map)."""
    base = {"window": window, "cluster_id": cluster_id}
    progress("asking Echo for the stragglers")
    found = ask_endpoint(url, token, "fleet.cluster.find_stragglers", base, timeout_s)
    progress("asking Echo for the timeline and the heat map")
    view = ask_endpoint(url, token, "fleet.cluster.timeline", {**base, **around, "heatmap": True}, timeout_s)
    return Picture(found, view, view.pop("heatmap", []))


def progress(what: str) -> None:
    """One line on stderr per stage, so a report on a large store shows it is working."""
    print(f"rankecho: {what} ...", file=sys.stderr, flush=True)
