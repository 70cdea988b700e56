"""Slow links as find_stragglers reports them: rows of ``rk_links`` (echo/queries/layers/65_links.sql) in,
entries shaped like a straggler's out (``kind: 'link'``, ``node_id`` the node the data singles out or None,
``peer_node_id`` the other node when the data singles out a node pair (the link between the two: node_id
the lesser name), else None, ``rank`` the rank whose own link send/recv pairs single out, else None), so
one answer says what held the job back, a late rank or a slow transfer.

    entry = link_entry(row, cluster, rate=2.5, currency="USD")  # cluster: find_stragglers' cluster entry
    entry["link"]["inter_node"]  # True: the slow communicators span nodes (a NIC, the network)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankecho.echo.mcp.entries import cost_fields, episode_fields
from rankecho.echo.mcp.windows import Window

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation

NEXT_STEP = (
    "check the named node's NICs and links (ibstat / ethtool error counters, switch port congestion; "
    "NVLink: nvidia-smi nvlink -e) and run nccl-tests between it and a healthy node"
)
PAIR_STEP = (
    "run nccl-tests between node {a} and node {b} alone, and check both nodes' NICs (ibstat / ethtool error "
    "counters) and the switch path between them (port congestion, errors on either uplink)"
)
UNLOCALISED_STEP = (
    "every node finished the slow steps alike, so the data cannot single one out: run nccl-tests across "
    "node pairs (or give the job communicators that pair nodes differently) to find the slow link"
)


def find_links(
    inv: Investigation, w: Window, cluster_id: str | None, min_late_ms: float | None, max_episodes: int,
    job: str | None, clusters: dict[str, dict[str, Any]], rates: dict[str, float],
) -> tuple[list[dict[str, Any]], bool]:
    """The slow links of the window (named query find_links) as find_stragglers entries of kind 'link', each
    with ``significant``; and whether the rows were cut."""
    rows, cut = inv.records(inv.run_named(
        "find_links", start_ns=w.start_ns, end_ns=w.end_ns, cluster_id=cluster_id, min_late_ms=min_late_ms,
        max_episodes=max_episodes, job_id=job,
    ))  # fmt: skip
    out = []
    for row in rows:
        entry = link_entry(row, clusters.get(row["cluster_id"], {}), rates.get(row["cluster_id"]),
                           inv.rates.currency)  # fmt: skip
        entry["significant"] = bool(row["significant"])
        out.append(entry)
    return out, cut


def link_entry(
    row: dict[str, Any], cluster: dict[str, Any], rate: float | None, currency: str
) -> dict[str, Any]:
    """One slow link, with the fields every find_stragglers entry has (``episodes``, ``late_ms`` = the
    extra transfer time per slow step, ``imposed_gpu_s`` and ``cost``) and a ``link`` section."""
    entry: dict[str, Any] = {
        "cluster_id": row["cluster_id"],
        "kind": "link",
        "node_id": row["node_id"],
        "peer_node_id": row["peer_node_id"],
        "rank": row["rank"],
        "ranks": row["ranks"] or [],
        "side": "link",
    } | episode_fields(row) | {
        "cause": {"class": "slow_link", "counts": row["causes"] or {}, "evidence_ms": None, "stack": None,
                  "leading_frames": None},
    } | cost_fields(row, cluster.get("window_ms"), rate, currency) | {
        "what_if": {"step_ms_actual": None, "step_ms_if_on_time": None, "slowdown": None},
        "link": {"inter_node": row["inter_node"], "communicators": row["communicators"] or [],
                 "transfer_ms": _round(row["transfer_ms"]),
                 "typical_transfer_ms": _round(row["typical_transfer_ms"])},
        "next_step": next_step(row),
    }  # fmt: skip
    entry["summary"] = summary(entry, cluster.get("steps"))
    return entry


def next_step(row: dict[str, Any]) -> str:
    """What to check: the named node's links, the path between a pair's two nodes, or (nobody singled out)
    node pairs one by one."""
    if row["node_id"] is None:
        return UNLOCALISED_STEP
    if row.get("peer_node_id") is not None:
        return PAIR_STEP.format(a=row["node_id"], b=row["peer_node_id"])
    return NEXT_STEP


def pair_name(entry: dict[str, Any]) -> str | None:
    """A node pair's link as the tables spell it (``node-a<->node-b``), or None when the entry is no pair:
    the one spelling the report, ``rankecho evaluate`` and the link score share."""
    if entry.get("peer_node_id") is None:
        return None
    return f"{entry['node_id']}<->{entry['peer_node_id']}"


def who(s: dict[str, Any]) -> str:
    where = "inter-node" if s["link"]["inter_node"] else "intra-node"
    if s["node_id"] is None:
        return f"a slow {where} link (not localised to a node)"
    if s.get("peer_node_id") is not None:
        return f"a slow {where} link between node {s['node_id']} and node {s['peer_node_id']}"
    if s["rank"] is not None:
        return f"a slow {where} link at rank {s['rank']} (node {s['node_id']})"
    return f"a slow {where} link at node {s['node_id']}"


def summary(s: dict[str, Any], steps: int | None) -> str:
    link = s["link"]
    of = f" of {steps}" if steps else ""
    return (
        f"{who(s)}: every rank arrived on time, yet the collectives took a median "
        f"{s['late_ms']['median']:.1f} ms longer than usual (transfer {link['transfer_ms']} ms against a "
        f"typical {link['typical_transfer_ms']} ms) "
        f"at {s['episodes_total']}{of} steps. The ranks waited {s['imposed_gpu_s']:.2f} GPU-s "
        f"({s['cost']['cost']:.4f} {s['cost']['currency']}). Next: {s['next_step']}."
    )


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)
