"""The straggler diagnosis, independent of MCP: named analysis queries in, bounded JSON-shaped dicts out.

``find_stragglers`` answers "which rank (or node) held the others back, by how much, how often, why,
and what did it cost" from the layered SQL in ``echo/queries/layers`` (see docs/analysis.md);
``explain_straggler`` shows one late call's pre-call timeline against its peers'; ``stall_costs`` prices
the imposed waits for ``get_cost``. The MCP tools, ``rankecho diagnose`` and the tests all call these.

Usage::

    d = Diagnosis(Investigation(reader, load_rates()))
    d.find_stragglers("last 10m")["stragglers"][0]["summary"]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankecho.echo.mcp.causes import CATEGORIES, CAUSE_TEXT, next_step
from rankecho.echo.mcp.coverage import held_back, held_back_note, no_data_message
from rankecho.echo.mcp.entries import cost_fields, episode_fields
from rankecho.echo.mcp.links import find_links
from rankecho.echo.mcp.links import who as link_who
from rankecho.echo.mcp.sanitize import MAX_ITEMS
from rankecho.echo.mcp.windows import Window, iso

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
MAX_PEERS = 16
"""Peers whose pre-call windows explain_straggler compares against."""
MAX_TIMELINE = 200
"""Intervals of the late rank's timeline returned by explain_straggler."""


class DiagnosisError(ValueError):
    """A request the diagnosis cannot answer as given; the message says what to change."""


class Diagnosis:
    """The diagnosis tools over one :class:`Investigation` (its reader, windows, limits and rates)."""

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
                {k: s[k] for k in ISOLATED_FIELDS} for s in noise
            ][:MAX_STRAGGLERS],
            "truncated": cut or links_cut or len(stragglers) > MAX_STRAGGLERS,
        }

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


def _ns_to_ms(value: Any) -> dict[str, float | None] | None:
    if not isinstance(value, dict):
        return None
    return {k: (round(v / 1e6, 3) if v is not None else None) for k, v in value.items()}


def _ms(ns: float | None) -> float | None:
    return ns / 1e6 if ns is not None else None


def _round(value: float | None, digits: int = 3) -> float | None:
    return round(float(value), digits) if value is not None else None
