"""One late call explained (``explain_straggler``): the late rank's time per cause in its pre-call window
against its peers' median, its timeline, and its call stacks against theirs.

find_stragglers (echo/mcp/diagnosis.py) names who held a job back over a window, from rows that are
already rolled up; this answers a narrower question about one call, from the raw intervals or the agents'
window summaries of the ranks compared, so it has its own queries (``locate_call``, ``explain_*``), limits
and wording. The MCP tool, ``rankecho explain`` and the tests call it.

Usage::

    Explainer(Investigation(reader, load_rates())).explain_straggler("node-1", 3, causal_chain_id="c:42")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankecho.echo.mcp.causes import CATEGORIES, CAUSE_TEXT, next_step
from rankecho.echo.mcp.coverage import no_data_message
from rankecho.echo.mcp.diagnosis import DiagnosisError
from rankecho.echo.mcp.windows import Window, iso

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation

MAX_PEERS = 16
"""Peers whose pre-call windows explain_straggler compares against."""
MAX_TIMELINE = 200
"""Intervals of the late rank's timeline returned by explain_straggler."""


class Explainer:
    """explain_straggler over one :class:`Investigation` (its reader, jobs, stacks and limits)."""

    def __init__(self, inv: Investigation) -> None:
        self._inv = inv

    def explain_straggler(
        self,
        node_id: str,
        rank: int,
        causal_chain_id: str | None = None,
        timestamp_ns: int | None = None,
        before_ms: float = 500.0,
        cluster_id: str | None = None,
        job_id: str | None = None,
    ) -> dict[str, Any]:
        """One late call of ``rank`` on ``node_id`` against its peers', within its job (``job_id``, else
        the job of that call)."""
        if causal_chain_id is None and timestamp_ns is None:
            raise DiagnosisError(
                "give causal_chain_id or timestamp_ns of the late call (find_stragglers lists both)"
            )
        if not 0 < before_ms <= 60_000:
            raise DiagnosisError("before_ms must be between 0 and 60000")
        at_ns = timestamp_ns
        if causal_chain_id is not None and at_ns is None:
            found = self._inv.run_named("locate_call", node_id=node_id, rank=rank, chain=causal_chain_id,
                                        job_id=job_id).rows  # fmt: skip
            at_ns = int(found[0][1]) if found else None
        job = job_id if job_id is not None else self._inv.jobs.at_call(node_id, rank, at_ns, causal_chain_id)
        span = 15_000_000_000  # enough steps around the call for its clocks and noise, and fast
        start, end = (at_ns - span, at_ns + span) if at_ns is not None else (None, None)
        arrival = self._inv.run_named(
            "explain_arrival",
            start_ns=start,
            end_ns=end,
            cluster_id=cluster_id,
            node_id=node_id,
            rank=rank,
            at_ns=at_ns,
            chain=causal_chain_id,
            job_id=job,
        )
        ranks, _ = self._inv.records(arrival)
        target = next((r for r in ranks if r["is_target"]), None)
        if target is None:
            raise DiagnosisError(
                f"no complete collective of rank {rank} on {node_id} near that call: check node_id and rank "
                "(fleet.cluster.summary lists them) and pass a causal_chain_id or timestamp_ns from "
                "find_stragglers"
                + ("" if ranks else f"; {no_data_message(self._inv, Window(start, end), cluster_id)}")
            )
        before_ns = int(before_ms * 1e6)
        peers = [r for r in ranks if not r["is_target"] and not _late(r)][:MAX_PEERS]
        windows = [_window(r, before_ns) for r in [target, *peers]]
        # The agents' own summaries of each rank's pre-call window when every rank compared has one;
        # else the raw intervals in the last before_ms (older agents, or a mix).
        summarised = all(r["window_ms"] is not None for r in [target, *peers])
        if summarised:
            mine = _categories(target)
            peer_rows = [_categories(p) for p in peers]
        else:
            breakdown, _ = self._inv.records(self._inv.run_named("explain_breakdown", windows=windows))
            by_thread = {(b["node_id"], b["pid"], b["tid"]): b for b in breakdown}
            mine = _categories(by_thread.get((target["node_id"], target["pid"], target["tid"])))
            peer_rows = [_categories(by_thread.get((p["node_id"], p["pid"], p["tid"]))) for p in peers]
        peer_median = {c: _median([p[c] for p in peer_rows]) for c in CATEGORIES}
        judged = self._inv.run_named("explain_excess", mine=mine, peers=peer_median if peers else None)
        verdict = judged.rows[0]
        excess = {c: round(float(verdict[0][c]), 3) for c in CATEGORIES}
        top = str(verdict[1])
        w = windows[0]
        timeline, cut = self._inv.records(
            self._inv.run_named(
                "explain_timeline",
                max_rows=MAX_TIMELINE,
                cluster_id=target["cluster_id"],
                node_id=node_id,
                pid=target["pid"],
                tid=target["tid"],
                from_ns=w["from_ns"],
                to_ns=w["to_ns"],
            )
        )
        late_ms = max(target["host_late_ms"] or 0.0, target["gpu_late_ms"] or 0.0)
        span_ns = [int(r["window_ms"] * 1e6) if summarised else before_ns for r in [target, *peers]]
        stack_windows = [_window(r, n) for r, n in zip([target, *peers], span_ns, strict=True)]
        return {
            "node_id": node_id,
            "rank": rank,
            "job_id": job,
            "causal_chain_id": target["causal_chain_id"],
            "timestamp_ns": int(target["enter_c"]),
            "time": iso(int(target["enter_c"])),
            "step": target["step"],
            "late_by_ms": round(late_ms, 3),
            "host_late_ms": _round(target["host_late_ms"]),
            "gpu_late_ms": _round(target["gpu_late_ms"]),
            "threshold_ms": _round(target["threshold_ms"]),
            "delay_ms": _round(target["delay_ms"]),
            "before_ms": before_ms,
            "breakdown_source": "agent" if summarised else "intervals",
            "window_ms": _round(target["window_ms"]) if summarised else before_ms,
            "breakdown_ms": mine,
            "peers_median_ms": peer_median,
            "excess_ms": excess,
            "cause": top if late_ms >= (target["threshold_ms"] or 0) else None,
            "explanation": _explain(
                node_id, rank, late_ms, target, top, excess, mine, peer_median,
                f"{target['window_ms']:.0f} ms since its previous call" if summarised
                else f"{before_ms:.0f} ms before the call",
            ),
            "next_step": next_step(top, "rank", node_id, rank) if late_ms >= (target["threshold_ms"] or 0)
            else None,
            "peers_compared": len(peers),
            "timeline": timeline,
            "timeline_truncated": cut,
            "stacks": self._inv.stacks.differential(stack_windows[0], stack_windows[1:]),
            "arrivals": [
                {"node_id": r["node_id"], "rank": r["rank"], "host_late_ms": _round(r["host_late_ms"]),
                 "gpu_late_ms": _round(r["gpu_late_ms"])}
                for r in ranks
            ],
        }  # fmt: skip


def _explain(
    node_id: str, rank: int, late_ms: float, target: dict[str, Any], top: str, excess: dict[str, float],
    mine: dict[str, float], peers: dict[str, float | None], window: str,
) -> str:  # fmt: skip
    if late_ms < (target["threshold_ms"] or 0):
        return (f"rank {rank} on {node_id} was not late at this call ({late_ms:.1f} ms, threshold "
                f"{target['threshold_ms']:.1f} ms)")  # fmt: skip
    return (
        f"rank {rank} on {node_id} was {late_ms:.1f} ms late; in the {window} it "
        f"spent "
        f"{mine[top]:.1f} ms {CAUSE_TEXT[top]} against its peers' median {peers[top] or 0:.1f} ms "
        f"(+{excess[top]:.1f} ms)"
    )


def _late(row: dict[str, Any]) -> bool:
    threshold = row["threshold_ms"] or 0.0
    return (row["host_late_ms"] or 0.0) >= threshold or row["gpu_late_ms"] is not None


def _window(row: dict[str, Any], before_ns: int) -> dict[str, Any]:
    to_ns = int(row["enter_c"] + row["clock_offset_ns"])  # back on the node's own clock
    return {
        "cluster_id": row["cluster_id"],
        "node_id": row["node_id"],
        "pid": row["pid"],
        "tid": row["tid"],
        "from_ns": to_ns - before_ns,
        "to_ns": to_ns,
    }


def _categories(row: dict[str, Any] | None) -> dict[str, float]:
    return {c: round(float(row[f"{c}_ms"]), 3) if row else 0.0 for c in CATEGORIES}


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return round(ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2, 3)


def _round(value: float | None, digits: int = 3) -> float | None:
    return round(float(value), digits) if value is not None else None
