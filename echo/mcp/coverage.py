"""What an empty answer says instead of nothing: which clusters hold data, for which times, what to do.

An empty store, a mistyped cluster id, a window before the job and a store that only ever got points
from something other than an agent all used to answer "no stragglers" (and ``rankecho diagnose``
exit 0): indistinguishable from a healthy job. :func:`no_data_message` tells them apart from the
``data_coverage`` query and names the fix; find_stragglers, summary, get_cost, explain_straggler and
``rankecho diagnose`` all use it.

A partial answer says what it left out too: :func:`held_back` lists, per cluster, the streams of agents
that attached mid-run or restarted whose sequence numbers could not be realigned with confidence yet
(``held_back_streams``): they take no part in the comparison, so nothing is said of those ranks there.

Usage::

    if not answer["clusters"]:
        answer["no_data"] = no_data_message(inv, window, cluster_id)
    held_back(inv, window, cluster_id, job, clusters)  # clusters: find_stragglers' entries by cluster id
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankecho.echo.mcp.windows import Window, iso

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation

LISTED = 10
"""Clusters named in one message; the rest are counted."""
HELD_BACK_LISTED = 64
"""Held-back streams listed per answer (eight nodes of eight ranks); ``held_back_total`` counts them all."""
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


def held_back(
    inv: Investigation, window: Window, cluster_id: str | None, job: str | None,
    clusters: dict[str, dict[str, Any]],
) -> None:  # fmt: skip
    """Give each of ``clusters`` (find_stragglers' cluster entries by id) ``held_back``: the streams the
    alignment left out until more data arrives (node_id, rank, comm_id, steps, reason), at most
    :data:`HELD_BACK_LISTED`, and ``held_back_total``."""
    rows, _ = inv.records(inv.run_named(
        "held_back_streams", max_rows=1000, start_ns=window.start_ns, end_ns=window.end_ns,
        cluster_id=cluster_id, job_id=job,
    ))  # fmt: skip
    for cluster in clusters.values():
        mine = [{k: r[k] for k in ("node_id", "rank", "comm_id", "steps", "reason")}
                for r in rows if r["cluster_id"] == cluster["cluster_id"]]  # fmt: skip
        cluster["held_back"] = mine[:HELD_BACK_LISTED]
        cluster["held_back_total"] = len(mine)


def held_back_note(cluster: dict[str, Any]) -> str:
    """The verdict's note on what the comparison left out ('' when nothing was)."""
    streams = cluster.get("held_back") or []
    if not streams:
        return ""
    ranks = sorted({(s["node_id"], s["rank"]) for s in streams}, key=lambda nr: (str(nr[0]), nr[1] or 0))
    who = ", ".join(f"rank {r} on {n}" for n, r in ranks[:8]) + (" and more" if len(ranks) > 8 else "")
    return (
        f"; {cluster['held_back_total']} stream{'s' if cluster['held_back_total'] != 1 else ''} of "
        f"{who} held back from the comparison (an agent that attached or restarted mid-run; not enough "
        "data yet to realign its sequence numbers: see held_back)"
    )
