"""Call stacks in the answers: a rank's top stacks (``fleet.cluster.stacks``, ``rankecho stacks``), the
late rank's stacks against its peers' (``explain_straggler``) and a straggler's leading frames
(``find_stragglers``' cause, ``rankecho diagnose``).

The time each stack carried comes from the analysis layer ``echo/queries/layers/70_stacks.sql``; this
module binds its named queries and bounds what comes back (frames per stack, stacks per answer), so an
answer stays small whatever the agents sent. See docs/stacks.md.

Usage::

    inv.stacks.rank("node-1", 3, "last 5m")["folded"]          # ['main;train_step;forward 2260797', ...]
    inv.stacks.lead(straggler, job)                          # 'cudaMalloc <- allocate_cache <- ...'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation

MAX_STACKS = 50
"""Stacks a rank view returns by default (the most time first); the total is counted."""
STACKS_LIMIT = 200
"""The most stacks one answer may hold (the JSON sanitizer's cap on one list)."""
MAX_FRAMES = 64
"""Frames kept per stack in an answer: the innermost ones (the callee end says what ran); a cut stack
says so (``frames_cut``) and its folded line starts with ``[...]``."""
MAX_FOLDED_CHARS = 1000
"""A folded line is cut at its root end to stay under this (the sanitizer cuts text at 1024)."""
DIFF_STACKS = 5
"""Stacks explain_straggler lists in its differential view and of the late rank alone."""
CHAINS = 100
"""Late episodes whose pre-call windows a straggler's leading frames are taken from (its latest)."""
MARGIN_NS = 60_000_000_000
"""Around its episodes' times (corrected clock), where a straggler's calls are looked for on its node's own
clock: node clocks differ by far less, and the bound lets the scan skip old row groups."""


class StacksError(ValueError):
    """A stack request the tools cannot answer as given; the message says what to change."""


class Stacks:
    """The stack views over one :class:`Investigation` (its reader, windows and jobs)."""

    def __init__(self, inv: Investigation) -> None:
        self._inv = inv

    def rank(
        self,
        node_id: str | None,
        rank: int,
        window: str | None = None,
        cluster_id: str | None = None,
        job_id: str | None = None,
        causal_chain_id: str | None = None,
        limit: int = MAX_STACKS,
    ) -> dict[str, Any]:
        """One rank's stacks over the window, or over its pre-call window before the collective
        ``causal_chain_id`` (then ``node_id`` is needed), the most time first, each with its folded line
        (root first, ';'-joined, weight in microseconds last)."""
        if not 1 <= limit <= STACKS_LIMIT:
            raise StacksError(f"limit must be between 1 and {STACKS_LIMIT}")
        w = self._inv.window(window)
        job = job_id if job_id is not None else self._inv.jobs.resolve(w, None, cluster_id)
        if causal_chain_id is not None:
            if node_id is None:
                raise StacksError("give node_id with causal_chain_id (the collective is one node's call)")
            result = self._inv.run_named(
                "call_stacks",
                max_rows=limit,
                cluster_id=cluster_id,
                node_id=node_id,
                ranks=[rank],
                chains=[causal_chain_id],
                job_id=job,
                start_ns=w.start_ns,
                end_ns=w.end_ns,
            )
        else:
            result = self._inv.run_named(
                "rank_stacks",
                max_rows=limit,
                start_ns=w.start_ns,
                end_ns=w.end_ns,
                cluster_id=cluster_id,
                node_id=node_id,
                rank=rank,
                job_id=job,
            )
        rows, cut = self._inv.records(result)
        stacks = [_stack(r) for r in rows]
        return {
            "node_id": node_id,
            "rank": rank,
            "job_id": job,
            "window": w.describe(),
            "causal_chain_id": causal_chain_id,
            "weight_unit": "microseconds",
            "total_ms": round(sum(s["ms"] for s in stacks), 3),
            "stacks": stacks,
            "folded": [s["folded"] for s in stacks],
            "truncated": cut,
            "note": None
            if stacks
            else "no stack-carried time for this rank in the window: its agent sent "
            "no stacks (an older agent, or stacks off), or node_id/rank/window match nothing",
        }

    def lead(self, straggler: dict[str, Any], job: str | None) -> dict[str, Any] | None:
        """The stack that carried most of a straggler's cause class in its late episodes' pre-call windows
        (any class when none carried the cause), with its leading frames; None without stacks."""
        listed = [e for e in straggler["episodes"] if e.get("causal_chain_id")][-CHAINS:]
        chains = [e["causal_chain_id"] for e in listed]
        times = [int(e["timestamp_ns"]) for e in listed]
        ranks = straggler["ranks"] or ([straggler["rank"]] if straggler["rank"] is not None else [])
        if not chains or not ranks:
            return None
        rows, _ = self._inv.records(
            self._inv.run_named(
                "call_stacks",
                max_rows=STACKS_LIMIT,
                cluster_id=straggler["cluster_id"],
                node_id=straggler["node_id"],
                ranks=ranks,
                chains=chains,
                job_id=job,
                start_ns=min(times) - MARGIN_NS,
                end_ns=max(times) + MARGIN_NS,
            )
        )
        cause = straggler["cause"]["class"]
        for_cause = [r for r in rows if (r["ms_by_category"] or {}).get(cause)]
        if not rows:
            return None
        best = max(for_cause, key=lambda r: r["ms_by_category"][cause]) if for_cause else rows[0]
        return {
            "stack_id": best["stack_id"],
            "category": cause if for_cause else best["category"],
            "ms": round((best["ms_by_category"] or {}).get(cause, best["ms"]), 3),
            "episodes": len(chains),
            "leading_frames": best["leading_frames"],
            "truncated": best["truncated"],
        }

    def differential(self, target: dict[str, Any], peers: list[dict[str, Any]]) -> dict[str, Any]:
        """The late rank's stacks in its pre-call window against its peers' in theirs (windows as
        explain_straggler builds them: {cluster_id, node_id, pid, tid, from_ns, to_ns}): what it ran that
        they did not, largest excess first, and its own top stacks."""
        windows = [{"w": 0, "role": "target", **_thread_window(target)}]
        windows += [{"w": i + 1, "role": "peer", **_thread_window(p)} for i, p in enumerate(peers)]
        rows, cut = self._inv.records(
            self._inv.run_named("stack_diff", max_rows=STACKS_LIMIT, windows=windows)
        )
        stacks = [
            {
                k: r[k]
                for k in ("stack_id", "category", "peers_with", "distinctive", "truncated", "leading_frames")
            }
            | {
                "rank_ms": _r(r["target_ms"]),
                "peers_mean_ms": _r(r["peers_mean_ms"]),
                "excess_ms": _r(r["excess_ms"]),
            }
            | _frames(r["frames"])
            for r in rows
        ]
        distinct = [s for s in stacks if s["distinctive"]]
        top = sorted((s for s in stacks if (s["rank_ms"] or 0) > 0), key=lambda s: -(s["rank_ms"] or 0))
        return {
            "peers_compared": len(peers),
            "distinctive": distinct[:DIFF_STACKS],
            "rank_top": top[:DIFF_STACKS],
            "leading_frames": distinct[0]["leading_frames"] if distinct else None,
            "truncated": cut or len(distinct) > DIFF_STACKS,
        }


def _thread_window(w: dict[str, Any]) -> dict[str, Any]:
    return {k: w[k] for k in ("cluster_id", "node_id", "pid", "tid", "from_ns", "to_ns")}


def _stack(row: dict[str, Any]) -> dict[str, Any]:
    weight_us = max(1, round(row["ms"] * 1000))
    frames = _frames(row["frames"])
    folded = row["folded"]
    if frames["frames_cut"] or len(folded) > MAX_FOLDED_CHARS:
        kept = frames["frames"] or []
        folded = ";".join(["[...]", *[f.replace(";", ":") for f in reversed(kept)]])
        while len(folded) > MAX_FOLDED_CHARS and ";" in folded[6:]:
            folded = "[...]" + folded[folded.index(";", 6) :]
    return {
        "stack_id": row["stack_id"],
        "ms": _r(row["ms"]),
        "category": row["category"],
        "ms_by_category": {k: _r(v) for k, v in (row["ms_by_category"] or {}).items()},
        "leading_frames": row["leading_frames"],
        "truncated": row["truncated"],
        **frames,
        "folded": f"{folded} {weight_us}",
    }


def _frames(frames: list[str] | None) -> dict[str, Any]:
    """Frames innermost first, at most :data:`MAX_FRAMES` (None: the stack point was never stored)."""
    if frames is None:
        return {"frames": None, "depth": None, "frames_cut": False}
    return {"frames": frames[:MAX_FRAMES], "depth": len(frames), "frames_cut": len(frames) > MAX_FRAMES}


def _r(value: float | None) -> float | None:
    return round(float(value), 3) if value is not None else None
