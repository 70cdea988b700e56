"""The straggler diagnosis, independent of MCP: named analysis queries in, bounded JSON-shaped dicts out.

``find_stragglers`` answers "which rank (or node) held the others back, by how much, how often, why,
and what did it cost" from the layered SQL in ``echo/queries/layers`` (see docs/analysis.md);
``stall_costs`` prices the imposed waits for ``get_cost``. One late call against its peers'
(``explain_straggler``) is echo/mcp/explain.py. The MCP tools, ``rankecho diagnose`` and the tests all
call these.

Usage::

    d = Diagnosis(Investigation(reader, load_rates()))
    d.find_stragglers("last 10m")["stragglers"][0]["summary"]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankecho.echo.mcp.causes import CAUSE_TEXT, next_step
from rankecho.echo.mcp.coverage import held_back, held_back_note, no_data_message
from rankecho.echo.mcp.entries import cost_fields, episode_fields
from rankecho.echo.mcp.links import find_links
from rankecho.echo.mcp.links import who as link_who
from rankecho.echo.mcp.sanitize import MAX_ITEMS

if TYPE_CHECKING:
    from rankecho.echo.mcp.tools import Investigation

MAX_STRAGGLERS = 50
"""Stragglers returned per call (significant ones first); the rest are counted."""
ISOLATED_FIELDS = ("cluster_id", "kind", "node_id", "rank", "ranks", "episodes_total", "late_ms")
"""What find_stragglers lists of a rank or node whose late episodes are too few or small to name."""
MAX_EPISODES = 100
"""Late episodes listed per straggler by default: its latest, oldest first; the total is always given."""
EPISODES_LIMIT = MAX_ITEMS
"""The most episodes per straggler a caller may ask for (the JSON sanitizer's cap on one list)."""


class DiagnosisError(ValueError):
    """A request the diagnosis cannot answer as given; the message says what to change."""


class Diagnosis:
    """find_stragglers and the stall costs over one :class:`Investigation` (its reader, windows, limits
    and rates)."""

    def __init__(self, inv: Investigation) -> None:
        self._inv = inv

    def find_stragglers(
        self,
        window: str | None = None,
        cluster_id: str | None = None,
        min_late_ms: float | None = None,
        max_episodes: int = MAX_EPISODES,
        job_id: str | None = None,
        stacks: bool = True,
        links: bool = False,
    ) -> dict[str, Any]:
        """The stragglers of one job in the window (``job_id``, else the window's most recent job);
        ``max_episodes`` bounds the episodes listed per straggler; ``stacks`` False leaves out the call
        stack of each cause (a query per straggler: callers that only want the verdict skip it);
        ``links`` adds the slow links (kind 'link'), a second pass over the window's lateness (~+60% on
        the benchmark store), so the callers that run it often (the exporter, the timeline) leave it out."""
        if min_late_ms is not None and not min_late_ms >= 0:
            raise DiagnosisError(
                "min_late_ms must be a number of milliseconds >= 0 (omit it to use the noise)"
            )
        if not 1 <= max_episodes <= EPISODES_LIMIT:
            raise DiagnosisError(f"max_episodes must be between 1 and {EPISODES_LIMIT}")
        w = self._inv.window(window)
        job = self._inv.jobs.resolve(w, job_id, cluster_id)
        result = self._inv.run_named(
            "find_stragglers",
            start_ns=w.start_ns,
            end_ns=w.end_ns,
            cluster_id=cluster_id,
            min_late_ms=min_late_ms,
            max_episodes=max_episodes,
            job_id=job,
        )
        rows, cut = self._inv.records(result)
        rates = self._cluster_rates(w.start_ns, w.end_ns, cluster_id, job)
        clusters: dict[str, dict[str, Any]] = {}
        stragglers: list[dict[str, Any]] = []
        noise: list[dict[str, Any]] = []
        for row in rows:
            cluster = clusters.setdefault(row["cluster_id"], _cluster(row))
            if row["kind"] is None:
                continue
            entry = _straggler(row, cluster, rates.get(row["cluster_id"]), self._inv.rates.currency)
            (stragglers if row["significant"] else noise).append(entry)
        for s in stragglers[:MAX_STRAGGLERS] if stacks else []:  # the cause's stack, from the late episodes
            s["cause"]["stack"] = self._inv.stacks.lead(s, job)
            s["cause"]["leading_frames"] = (s["cause"]["stack"] or {}).get("leading_frames")
            s["summary"] = _summary(s, clusters[s["cluster_id"]])
        links_found, links_cut = (
            find_links(self._inv, w, cluster_id, min_late_ms, max_episodes, job, clusters, rates)
            if links else ([], False)
        )  # slow links (echo/mcp/links.py)
        stragglers += [s for s in links_found if s.pop("significant")]  # after ranks and nodes: order holds
        noise += [s for s in links_found if s not in stragglers]
        held_back(self._inv, w, cluster_id, job, clusters)  # streams left out until they can be aligned
        for cluster in clusters.values():
            named = [s for s in stragglers if s["cluster_id"] == cluster["cluster_id"]]
            cluster["verdict"] = (
                f"{len(named)} straggler{'s' if len(named) != 1 else ''}: "
                + ", ".join(_who(s) for s in named)
                if named
                else f"no straggler (noise: lateness sigma {cluster['noise']['sigma_ms']} ms, "
                f"threshold {cluster['noise']['threshold_ms']} ms)"
            ) + held_back_note(cluster)
        return {
            "window": w.describe(),
            "job_id": job,
            "no_data": None if clusters else no_data_message(self._inv, w, cluster_id),
            "clusters": list(clusters.values()),
            "stragglers": stragglers[:MAX_STRAGGLERS],
            "stragglers_total": len(stragglers),
            "isolated_late_episodes": [
                {k: s[k] for k in ISOLATED_FIELDS} | {k: s[k] for k in ("peer_node_id",) if k in s}
                for s in noise  # a link between two nodes keeps its second node
            ][:MAX_STRAGGLERS],
            "truncated": cut or links_cut or len(stragglers) > MAX_STRAGGLERS,
        }

    def stall_costs(
        self, window: str | None = None, cluster_id: str | None = None, job_id: str | None = None
    ) -> dict[str, Any]:
        found = self.find_stragglers(window, cluster_id, job_id=job_id)
        stalls = [
            {k: s[k] for k in ("cluster_id", "kind", "node_id", "rank", "imposed_gpu_s")} | s["cost"]
            for s in found["stragglers"]
        ]
        return {
            "stalls": stalls,
            "stall_cost_total": round(sum(s["cost"] for s in stalls), 6),
            "stall_cost_per_day": round(sum(s["cost_per_day"] or 0.0 for s in stalls), 6),
        }

    def _cluster_rates(
        self, start_ns: int | None, end_ns: int | None, cluster_id: str | None, job_id: str | None
    ) -> dict[str, float]:
        """Per cluster, the hourly rate of its most-used GPU model (the GPUs that wait are of that kind)."""
        rows, _ = self._inv.records(
            self._inv.run_named("gpu_hours", start_ns=start_ns, end_ns=end_ns, cluster_id=cluster_id,
                                job_id=job_id)
        )
        best: dict[str, tuple[float, str | None]] = {}
        for row in rows:
            if row["gpu_model"] is None and row["cluster_id"] in best:
                continue
            if row["cluster_id"] not in best or row["gpu_hours"] > best[row["cluster_id"]][0]:
                best[row["cluster_id"]] = (row["gpu_hours"], row["gpu_model"])
        return {cluster: self._inv.rates.rate_for(model)[0] for cluster, (_, model) in best.items()}


def _cluster(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "cluster_id": row["cluster_id"],
        "ranks": row["cluster_ranks"],
        "steps": row["steps"],
        "step_ms": _round(row["step_ns"] / 1e6 if row["step_ns"] is not None else None),
        "step_ms_mean": _round(row["step_ms_actual"]),
        "noise": {
            "median_ms": _round(_ms(row["noise_median_ns"])),
            "sigma_ms": _round(_ms(row["noise_sigma_ns"])),
            "threshold_ms": _round(_ms(row["threshold_ns"])),
        },
        "window_ms": _round(row["window_ms"]),
        "reference_node": row["reference_node"],
    }


def _straggler(
    row: dict[str, Any], cluster: dict[str, Any], rate: float | None, currency: str
) -> dict[str, Any]:
    entry = {
        "cluster_id": row["cluster_id"],
        "kind": row["kind"],
        "node_id": row["node_id"],
        "rank": row["rank"],
        "ranks": row["ranks"],
        "side": row["side"],
    } | episode_fields(row) | {
        "cause": {
            "class": row["cause"],
            "counts": row["causes"] or {},
            "evidence_ms": {"rank": _ns_to_ms(row["spent_ns"]), "peers_median": _ns_to_ms(row["peers_ns"])},
            "stack": None,  # filled by find_stragglers from the agents' call stacks (docs/stacks.md)
            "leading_frames": None,
        },
    } | cost_fields(row, row["window_ms"], rate, currency) | {
        "what_if": {"step_ms_actual": _round(row["step_ms_actual"]),
                    "step_ms_if_on_time": _round(row["step_ms_if_on_time"]),
                    "slowdown": _round(row["slowdown"], 4)},
    }  # fmt: skip
    episodes = entry["episodes"]
    latest = episodes[-1] if episodes else {}
    entry["next_step"] = next_step(
        row["cause"], row["kind"], row["node_id"],
        row["rank"] if row["rank"] is not None else (latest.get("ranks") or [None])[0],
        latest.get("causal_chain_id"),
    )  # fmt: skip
    entry["summary"] = _summary(entry, cluster)
    return entry


def _who(s: dict[str, Any]) -> str:
    if s["kind"] == "link":
        return link_who(s)
    if s["kind"] == "node":
        return f"node {s['node_id']} (ranks {', '.join(map(str, s['ranks']))})"
    return f"rank {s['rank']} on {s['node_id']}"


def _summary(s: dict[str, Any], cluster: dict[str, Any]) -> str:
    period = s["period"]
    how_often = (
        "irregularly" if not period else
        ("at every step" if period["steps"] == 1 else f"every {period['steps']} steps")
        + f", period confidence {period['confidence']:.2f}"
    )  # fmt: skip
    cause = s["cause"]["class"]
    ev = s["cause"]["evidence_ms"]
    spent = (ev["rank"] or {}).get(cause)
    peers = (ev["peers_median"] or {}).get(cause)
    evidence = (
        f" ({spent:.0f} ms vs the peers' {peers:.0f} ms)" if spent is not None and peers is not None else ""
    )
    wi = s["what_if"]
    what_if = (
        f"; without it the mean step would take {wi['step_ms_if_on_time']:.1f} ms instead of "
        f"{wi['step_ms_actual']:.1f} ms"
        f" (x{wi['slowdown']:.3f})"
        if wi["step_ms_if_on_time"] and wi["step_ms_actual"] and wi["slowdown"] else ""
    )  # fmt: skip
    side = "its GPU reached" if s["side"] == "gpu" else "it entered"
    lead = s["cause"].get("leading_frames")
    where = f", at {lead}" if lead else ""
    return (
        f"{_who(s)}: {side} the collective a median {s['late_ms']['median']:.1f} ms late at "
        f"{s['episodes_total']} of {cluster['steps']} steps ({how_often}); before each it was mostly "
        f"{CAUSE_TEXT.get(cause, cause)}{evidence}{where}. The other ranks waited "
        f"{s['imposed_gpu_s']:.2f} GPU-s "
        f"({s['cost']['cost']:.4f} {s['cost']['currency']}){what_if}. Next: {s['next_step']}."
    )


def _ns_to_ms(value: Any) -> dict[str, float | None] | None:
    if not isinstance(value, dict):
        return None
    return {k: (round(v / 1e6, 3) if v is not None else None) for k, v in value.items()}


def _ms(ns: float | None) -> float | None:
    return ns / 1e6 if ns is not None else None


def _round(value: float | None, digits: int = 3) -> float | None:
    return round(float(value), digits) if value is not None else None
