"""The cross-rank timeline: what every rank did, lane by lane, around a late episode, as bounded JSON.

One core for ``fleet.cluster.timeline`` (an AI agent reasons over it), ``rankecho report`` (a person
looks at it) and ``rankecho export-trace`` (Perfetto opens it). The slices come from the named queries
``timeline_slices`` and ``lateness_heatmap`` (echo/queries/timeline.sql), which read the analysis
layers, so the picture shows exactly who find_stragglers called late and nothing it did not.

Usage::

    view = Timeline(inv).around(window="last 10m")   # the latest episode of the top straggler
    view["slices"][0]["kind"], view["focus"]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankecho.echo.mcp.windows import iso

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation

MAX_SLICES = 5_000
"""Slices returned per call (earliest first); ``truncated`` says when more were in the range."""
MAX_HEATMAP_STEPS = 400
"""Steps of the lateness heat map (the latest ones of the window)."""
MAX_HEATMAP_CELLS = 200_000
"""Cells (rank x step) of the heat map at most."""
STEPS_AROUND = 2.5
"""Steps drawn before and after the focused late call."""
DEFAULT_STEP_MS = 100.0
"""The range's half-width unit when the window holds no complete step to measure."""


class TimelineError(ValueError):
    """A request the timeline cannot answer as given; the message says what to change."""


class Timeline:
    """Timelines over one :class:`Investigation` (its reader, windows and diagnosis)."""

    def __init__(self, inv: Investigation) -> None:
        self._inv = inv

    def around(
        self,
        window: str | None = None,
        cluster_id: str | None = None,
        node_id: str | None = None,
        rank: int | None = None,
        timestamp_ns: int | None = None,
        before_ms: float = 500.0,
        max_slices: int = MAX_SLICES,
        job_id: str | None = None,
    ) -> dict[str, Any]:
        """The slices of a few steps around ``timestamp_ns`` (reference clock) or, without one, around the
        latest late episode of the top straggler of the window (else the window's last steps).
        ``node_id``/``rank`` keep only those lanes; the focus and the threshold still come from all."""
        if not 1 <= max_slices <= MAX_SLICES:
            raise TimelineError(f"max_slices must be between 1 and {MAX_SLICES}")
        if not 0 < before_ms <= 60_000:
            raise TimelineError("before_ms must be between 0 and 60000")
        w = self._inv.window(window)
        found = self._inv.diagnosis.find_stragglers(window, cluster_id, max_episodes=1, job_id=job_id,
                                                    stacks=False)  # fmt: skip
        focus = _focus(found, timestamp_ns)
        if focus["cluster_id"] is None:
            return {"window": w.describe(), "focus": focus, "lanes": [], "slices": [], "truncated": False,
                    "note": "no complete collective instance in the window: widen it or check cluster_id "
                    "(fleet.cluster.summary lists what is stored)"}  # fmt: skip
        half = int(STEPS_AROUND * focus["step_ms"] * 1e6)
        if focus["timestamp_ns"] is None:  # the window's last steps, ending at its newest event
            latest = self._inv.run_named("window_anchor").rows[0][0]
            newest = min(w.end_ns, latest) if w.end_ns is not None and latest is not None else latest
            focus["timestamp_ns"] = int(newest) - half if newest is not None else 0
        late_ns = int((focus.get("late_ms") or 0.0) * 1e6)  # the others arrived this long before the focus
        from_ns, to_ns = focus["timestamp_ns"] - late_ns - half, focus["timestamp_ns"] + half
        result = self._inv.run_named(
            "timeline_slices",
            max_rows=max_slices,
            start_ns=w.start_ns,
            end_ns=w.end_ns,
            from_ns=from_ns,
            to_ns=to_ns,
            cluster_id=focus["cluster_id"],
            node_id=node_id,
            rank=rank,
            before_ms=before_ms,
            job_id=found["job_id"],
        )
        slices, cut = self._inv.records(result)
        lanes = sorted({(s["node_id"], s["rank"]) for s in slices})
        return {
            "window": w.describe(),
            "job_id": found["job_id"],
            "range": {"from_ns": from_ns, "to_ns": to_ns, "from": iso(from_ns), "to": iso(to_ns)},
            "focus": focus,
            "threshold_ms": found["clusters"][0]["noise"]["threshold_ms"] if found["clusters"] else None,
            "lanes": [{"node_id": n, "rank": r} for n, r in lanes],
            "slices": slices,
            "truncated": cut,
        }

    def heatmap(self, window: str | None = None, cluster_id: str | None = None,
                max_steps: int = MAX_HEATMAP_STEPS, job_id: str | None = None) -> dict[str, Any]:  # fmt: skip
        """Ranks x steps lateness (ms) of the latest ``max_steps`` steps of the window, of one job
        (``job_id``, else the most recent one)."""
        w = self._inv.window(window)
        job = self._inv.jobs.resolve(w, job_id, cluster_id)
        result = self._inv.run_named(
            "lateness_heatmap",
            max_rows=MAX_HEATMAP_CELLS,
            start_ns=w.start_ns,
            end_ns=w.end_ns,
            cluster_id=cluster_id,
            max_steps=max_steps,
            job_id=job,
        )
        cells, cut = self._inv.records(result)
        return {"window": w.describe(), "job_id": job, "cells": cells, "truncated": cut}


def _focus(found: dict[str, Any], timestamp_ns: int | None) -> dict[str, Any]:
    """Where to look: the asked time, else the top straggler's latest episode, else the window's end."""
    clusters = found["clusters"]
    if not clusters:
        return {"cluster_id": None, "why": "no data"}
    top = found["stragglers"][0] if found["stragglers"] else None
    cluster = next((c for c in clusters if top and c["cluster_id"] == top["cluster_id"]), clusters[0])
    step_ms = cluster["step_ms"] or DEFAULT_STEP_MS
    if timestamp_ns is not None:
        return {"cluster_id": cluster["cluster_id"], "timestamp_ns": timestamp_ns, "step_ms": step_ms,
                "why": "the time asked for"}  # fmt: skip
    if top is not None and top["episodes"]:
        episode = top["episodes"][-1]
        return {
            "cluster_id": top["cluster_id"],
            "timestamp_ns": int(episode["timestamp_ns"]),
            "step_ms": step_ms,
            "step": episode.get("step"),
            "late_ms": episode.get("late_by_ms"),
            "straggler": {"kind": top["kind"], "node_id": top["node_id"], "rank": top["rank"],
                          "ranks": top["ranks"], "summary": top["summary"]},
            "why": "the latest late episode of the top straggler",
        }  # fmt: skip
    return {"cluster_id": cluster["cluster_id"], "timestamp_ns": None, "step_ms": step_ms,
            "why": "no straggler: the window's last steps"}  # fmt: skip
