"""What an empty answer says instead of nothing: which clusters hold data, for which times, what to do.

An empty store, a mistyped cluster id, a window before the job and a store that only ever got points
from something other than an agent all used to answer "no stragglers" (and ``rankecho diagnose``
exit 0): indistinguishable from a healthy job. :func:`no_data_message` tells them apart from the
``data_coverage`` query and names the fix; find_stragglers, summary, get_cost, explain_straggler and
``rankecho diagnose`` all use it.

Usage::

    if not answer["clusters"]:
        answer["no_data"] = no_data_message(inv, window, cluster_id)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankecho.echo.mcp.windows import Window, iso

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation

LISTED = 10
"""Clusters named in one message; the rest are counted."""
START_AGENTS = (
    "Start `rankecho agent` on every node of the training job, pointed at this Echo (see docs/agent.md), "
    "and check it with `rankecho agent check`"
)


def _span(w: Window) -> str:
    if w.start_ns is None and w.end_ns is None:
        return "in the store"
    return f"from {iso(w.start_ns) or 'the start'} to {iso(w.end_ns) or 'the end'}"


def _cluster(row: dict[str, Any]) -> str:
    if row["collectives"]:
        return (
            f"{row['cluster_id']!r} ({row['nodes']} nodes, {row['ranks']} ranks, agent data from "
            f"{iso(row['agent_first_ns'])} to {iso(row['agent_last_ns'])})"
        )
    return f"{row['cluster_id']!r} ({row['events']} events, no agent data)"


def coverage(inv: Investigation) -> list[dict[str, Any]]:
    """Per cluster: events, collectives (agent data), nodes, ranks and the time ranges, most data first."""
    rows, _ = inv.records(inv.run_named("data_coverage", max_rows=1000))
    return rows


def no_data_message(inv: Investigation, window: Window, cluster_id: str | None) -> str:
    """Why an answer over ``window`` (and ``cluster_id``) is empty, where data is, and what to do."""
    rows = coverage(inv)
    agent = [r for r in rows if r["collectives"]]
    listed = ", ".join(_cluster(r) for r in (agent or rows)[:LISTED])
    more = f" and {len(agent or rows) - LISTED} more" if len(agent or rows) > LISTED else ""
    if not rows:
        return f"no data: the store holds no events at all. {START_AGENTS}."
    if not agent:
        return (
            f"no agent data: the store holds {sum(r['events'] for r in rows)} events (clusters "
            f"{listed}{more}) but no collective call traced by an agent, which the diagnosis needs. "
            f"{START_AGENTS}."
        )
    where = f"for cluster {cluster_id!r} " if cluster_id is not None else ""
    if cluster_id is not None and all(r["cluster_id"] != cluster_id for r in agent):
        known = "it has no agent data" if any(r["cluster_id"] == cluster_id for r in rows) else (
            "no such cluster in the store (mistyped?)"
        )  # fmt: skip
        return (
            f"no agent data {where}{_span(window)}: {known}. Agent data exists for {listed}{more}: "
            "pass one of those as the cluster id (--cluster-id in the CLI), or omit it for every cluster."
        )
    return (
        f"no agent data {where}{_span(window)}. Agent data exists for {listed}{more}: pass a window within "
        "those times (or omit the window for all data)"
        + (", or another cluster id" if cluster_id is not None else "")
        + "."
    )
