"""The fields every find_stragglers entry has, whatever held the job back: a late rank, a whole node
(echo/mcp/diagnosis.py) or a slow link (echo/mcp/links.py), so the two builders cannot drift apart.

Its own module because diagnosis imports links: a helper in either would make the import circular.

Usage::

    entry = {"cluster_id": ..., "kind": ...} | episode_fields(row) | {"cause": ...} | cost_fields(
        row, window_ms=cluster["window_ms"], rate=2.5, currency="USD")
"""

from __future__ import annotations

from typing import Any

from rankecho.echo.mcp.windows import iso

MIN_PERIOD_CONFIDENCE = 0.5
"""A period less sure than this is left out (``period`` None): 'irregularly' says more than a guess."""


def episode_fields(row: dict[str, Any]) -> dict[str, Any]:
    """How often and how late, from a row of rk_stragglers or rk_links: ``episodes`` (each given its ISO
    ``time``), ``episodes_total``, ``share_of_steps``, ``late_ms`` (median, p95, max) and ``period``."""
    episodes = row["episode_list"] or []
    for e in episodes:
        e["time"] = iso(e["timestamp_ns"])
    confident = row["period"] is not None and (row["period_confidence"] or 0) >= MIN_PERIOD_CONFIDENCE
    return {
        "episodes": episodes,
        "episodes_total": row["episodes"],
        "share_of_steps": _round(row["share"], 4),
        "late_ms": {"median": _round(row["median_late_ms"]), "p95": _round(row["p95_late_ms"]),
                    "max": _round(row["max_late_ms"])},
        "period": {"steps": row["period"], "confidence": _round(row["period_confidence"], 3)}
        if confident else None,
    }  # fmt: skip


def cost_fields(
    row: dict[str, Any], window_ms: float | None, rate: float | None, currency: str
) -> dict[str, Any]:
    """What it cost: ``imposed_gpu_s`` (GPU-seconds the others waited) and ``cost`` at ``rate`` per GPU-hour,
    also per day at the pace of the window (``window_ms`` long; None when the window has no length)."""
    imposed = row["imposed_gpu_s"] or 0.0
    cost = imposed / 3600.0 * (rate or 0.0)
    window_s = (window_ms or 0.0) / 1000.0
    return {
        "imposed_gpu_s": _round(imposed),
        "cost": {"currency": currency, "rate_per_gpu_hour": rate, "cost": round(cost, 6),
                 "cost_per_day": round(cost * 86400 / window_s, 6) if window_s > 0 else None},
    }  # fmt: skip


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)
