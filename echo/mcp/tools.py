"""What each MCP tool computes, independent of MCP: named queries in, bounded JSON-shaped dicts out.

The tools' named queries go through the store's :class:`rankecho.echo.store.reader.Reader` (read-only
transaction, timeout that interrupts DuckDB, row/byte caps, the SQL guard). The caller's SQL in
:meth:`Investigation.run_analysis` is guarded here, at the boundary, then runs on ``analysis``: in
Echo and the CLIs an :class:`echo.sandbox.Sandbox` (a worker process with hard memory and time limits),
so no caller's query can grow the process that ingests. Errors a caller can fix
are :class:`InvestigationError` with a message that says how.

Usage::

    inv = Investigation(reader, load_rates())
    inv.summary("last 5m")["nodes"]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rankecho.echo.guard import Refused, check_sql, safe_message
from rankecho.echo.mcp.coverage import no_data_message
from rankecho.echo.mcp.diagnosis import Diagnosis
from rankecho.echo.mcp.explain import Explainer
from rankecho.echo.mcp.failures import Failures
from rankecho.echo.mcp.jobs import Jobs
from rankecho.echo.mcp.rates import Rates
from rankecho.echo.mcp.sanitize import cap_rows, clean_text, json_safe, parse_attrs
from rankecho.echo.mcp.stacks import Stacks
from rankecho.echo.mcp.timeline import Timeline
from rankecho.echo.mcp.windows import Anchor, Window, WindowError, iso, parse_window
from rankecho.echo.queries import QUERIES
from rankecho.echo.sandbox import Sandbox
from rankecho.echo.store.reader import QueryError, QueryResult, QueryTimeoutError, Reader

MAX_LIMIT = 10_000
"""No tool returns more rows than this, whatever ``limit`` asks for."""
EVIDENCE_EVENTS = 5
"""Lowest events below the cutoff listed per node by find_outlier_nodes."""


class InvestigationError(ValueError):
    """A request the tools cannot answer as given; the message says what to change."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 1_000_000
    """Largest JSON result (rows) a tool returns; past it rows are dropped and ``truncated`` is set."""
    timeout_s: float = 10.0
    """Per query; DuckDB is interrupted when it runs longer."""


class Investigation:
    """The tools' core. Thread-safe: the reader gives every query its own cursor."""

    def __init__(
        self,
        reader: Reader,
        rates: Rates,
        limits: Limits = Limits(),
        clock_ns: Callable[[], int] = time.time_ns,
        analysis: Reader | Sandbox | None = None,
    ) -> None:
        self.reader = reader
        self.analysis = analysis if analysis is not None else reader
        """Where run_analysis runs the caller's SQL; front ends pass a Sandbox."""
        self.rates = rates
        self._limits = limits
        self._clock_ns = clock_ns
        self.diagnosis = Diagnosis(self)
        """find_stragglers and the stall costs, on this investigation's reader."""
        self.explainer = Explainer(self)
        """explain_straggler: one late call against its peers'."""
        self.failures = Failures(self, clock_ns)
        """find_hangs: open hangs (at the clock's now), crashes and desyncs."""
        self.jobs = Jobs(self)
        """Which job a tool analyses (given, else the window's most recent) and fleet.cluster.jobs."""
        self.timeline = Timeline(self)
        """The cross-rank timeline and lateness heat map the report and fleet.cluster.timeline show."""
        self.stacks = Stacks(self)
        """Call stacks: a rank's top stacks (fleet.cluster.stacks), differential and leading frames."""

    # -- plumbing (also used by Diagnosis, Explainer and the other parts above) ---------------------------
    def run_named(self, name: str, max_rows: int = MAX_LIMIT, **params: Any) -> QueryResult:
        """Run the named query ``name`` (echo/queries) with ``params``; errors become InvestigationError."""
        query = QUERIES[name]
        if "max_rows" in query.params:
            params["max_rows"] = max_rows + 1  # one extra row tells us more exist
        try:
            return self.reader.query(
                query.sql,
                query.bind(**params),
                timeout_s=self._limits.timeout_s,
                max_rows=max_rows,
                max_bytes=self._limits.max_bytes,
            )
        except QueryTimeoutError:
            raise InvestigationError(
                f"the query ran past {self._limits.timeout_s:g} s: narrow the window or add filters"
            ) from None
        except (QueryError, Refused) as exc:
            raise InvestigationError(safe_message(exc)) from None

    def window(self, text: str | None) -> Window:
        """The window text resolved against the newest stored event."""
        try:
            if text is None or not text.strip():
                return Window(None, None)
            row = self.run_named("window_anchor").rows[0]
            return parse_window(text, Anchor(row[0], row[1]))
        except WindowError as exc:
            raise InvestigationError(str(exc)) from None

    def records(self, result: QueryResult) -> tuple[list[dict[str, Any]], bool]:
        """Rows as JSON-safe dicts within the byte budget, and whether anything was cut."""
        rows = [
            dict(zip(unique_names(result.columns), map(json_safe, row), strict=True)) for row in result.rows
        ]
        kept, cut = cap_rows(rows, self._limits.max_bytes)
        return kept, cut or result.truncated

    # -- tools ------------------------------------------------------------------------------------
    def summary(self, window: str | None = None, job_id: str | None = None) -> dict[str, Any]:
        """The window's data; its clock and alignment sections are one job's (``job_id``, else the most
        recent one, named in ``job_id``), the rest covers every job."""
        w = self.window(window)
        bounds: dict[str, Any] = {"start_ns": w.start_ns, "end_ns": w.end_ns}
        job = self.jobs.resolve(w, job_id, None)
        totals_row, _ = self.records(self.run_named("summary_totals", **bounds))
        totals = totals_row[0]
        totals["first"], totals["last"] = iso(totals["first_ns"]), iso(totals["last_ns"])
        nodes, nodes_cut = self.records(self.run_named("summary_nodes", now_ns=self._clock_ns(), **bounds))
        ranks, ranks_cut = self.records(self.run_named("summary_ranks", max_rows=1000, **bounds))
        metrics, metrics_cut = self.records(self.run_named("summary_metrics", **bounds))
        clock, clock_cut = self.records(self.run_named("clock_offsets", job_id=job, **bounds))
        alignment, alignment_cut = self.records(self.run_named("stream_alignment", job_id=job, **bounds))
        spools, spools_cut = self.records(self.run_named("summary_spools", **bounds))  # data still on nodes
        retention = self.retention()
        for spool in spools:
            spool["reported"] = iso(spool["reported_ns"])
        for node in nodes:
            node["last"] = iso(node["last_ns"])
        clusters: dict[str | None, dict[str, Any]] = {}
        for node in nodes:
            entry = clusters.setdefault(
                node["cluster_id"], {"cluster_id": node["cluster_id"], "nodes": 0, "events": 0}
            )
            entry["nodes"] += 1
            entry["events"] += node["events"]
        return {
            "window": w.describe(),
            "job_id": job,
            "no_data": None if totals["events"] else no_data_message(self, w, None),
            "totals": totals,
            "clusters": list(clusters.values()),
            "nodes": nodes,
            "ranks": ranks,
            "metrics": metrics,
            "clock": clock,
            "alignment": alignment,
            "spools": spools,
            "retention": retention,
            "truncated": nodes_cut or ranks_cut or metrics_cut or clock_cut or alignment_cut or spools_cut,
        }

    def retention(self) -> dict[str, Any] | None:
        """summary's ``retention``: the raw and rolled-up ranges stored and the limits in force."""
        found, _ = self.records(self.run_named("summary_retention"))
        if not found:
            return None
        state = found[0]
        for end in ("raw_from", "raw_to", "rollup_from", "rollup_to"):
            state[end] = iso(state[f"{end}_ns"])
        return state

    def event_history(
        self,
        cluster_id: str | None = None,
        node_id: str | None = None,
        rank: int | None = None,
        metric_name: str | None = None,
        window: str | None = None,
        limit: int = 1000,
    ) -> dict[str, Any]:
        w = self.window(window)
        limit = _bounded_limit(limit)
        result = self.run_named(
            "event_history",
            max_rows=limit,
            start_ns=w.start_ns,
            end_ns=w.end_ns,
            cluster_id=cluster_id,
            node_id=node_id,
            rank=rank,
            metric_name=metric_name,
        )
        events = []
        for row in result.rows:
            record = dict(zip(result.columns, row, strict=True))
            attrs, attrs_cut = parse_attrs(record.pop("attrs_json"))
            event = {k: json_safe(v) for k, v in record.items()}
            event["time"] = iso(record["timestamp_ns"])
            event["attrs"] = attrs
            if attrs_cut:
                event["attrs_truncated"] = True
            events.append(event)
        kept, cut = cap_rows(events, self._limits.max_bytes)
        return {
            "window": w.describe(),
            "filters": json_safe(
                {"cluster_id": cluster_id, "node_id": node_id, "rank": rank, "metric_name": metric_name}
            ),
            "events": kept,
            "count": len(kept),
            "truncated": cut or result.truncated,
        }

    def find_outlier_nodes(
        self,
        metric: str,
        window: str | None = None,
        threshold: float | None = None,
        method: Literal["threshold", "mad"] = "threshold",
        cluster_id: str | None = None,
    ) -> dict[str, Any]:
        if method not in ("threshold", "mad"):
            raise InvestigationError(
                "method must be 'threshold' (value cutoff) or 'mad' (peers' median - k*MAD)"
            )
        if method == "threshold" and threshold is None:
            method, threshold = "mad", 3.0
        k = 3.0 if threshold is None else float(threshold)
        w = self.window(window)
        result = self.run_named(
            "node_outliers",
            metric=metric,
            method=method,
            threshold=k,
            evidence=EVIDENCE_EVENTS,
            cluster_id=cluster_id,
            start_ns=w.start_ns,
            end_ns=w.end_ns,
        )
        nodes, cut = self.records(result)
        for node in nodes:
            node["below_fraction"] = node["below"] / node["events"] if node["events"] else 0.0
            node["outlier"] = _is_outlier(node, method)
            node["evidence"] = node["evidence"] or []
            for event in node["evidence"]:
                event["time"] = iso(event["timestamp_ns"])
        return {
            "window": w.describe(),
            "metric": clean_text(metric, 256),
            "method": method,
            "threshold" if method == "threshold" else "k": k,
            "outliers": [n["node_id"] for n in nodes if n["outlier"]],
            "nodes": nodes,
            "truncated": cut,
        }

    def run_analysis(self, sql: str, limit: int = 1000) -> dict[str, Any]:
        try:
            statement = check_sql(sql)
        except Refused as refused:
            raise InvestigationError(str(refused)) from None
        limit = _bounded_limit(limit)
        try:
            result = self.analysis.query(
                statement, timeout_s=self._limits.timeout_s, max_rows=limit, max_bytes=self._limits.max_bytes
            )
        except QueryTimeoutError:
            raise InvestigationError(
                f"the query ran past {self._limits.timeout_s:g} s and was stopped: add a WHERE on "
                "timestamp_ns, node_id or metric_name, or aggregate before returning rows"
            ) from None
        except (QueryError, Refused) as exc:
            raise InvestigationError(safe_message(exc)) from None
        rows, cut = self.records(result)
        return {
            "columns": unique_names(result.columns),
            "rows": rows,
            "row_count": len(rows),
            "truncated": cut,
            "elapsed_ms": round(result.elapsed_ms, 3),
        }

    def get_cost(
        self, window: str | None = None, cluster_id: str | None = None, job_id: str | None = None
    ) -> dict[str, Any]:
        """GPU time, its cost and the stalls' cost of one job (``job_id``, else the most recent one)."""
        w = self.window(window)
        job = self.jobs.resolve(w, job_id, cluster_id)
        result = self.run_named("gpu_hours", start_ns=w.start_ns, end_ns=w.end_ns, cluster_id=cluster_id,
                                job_id=job)
        rows, cut = self.records(result)
        total_hours = total_cost = 0.0
        for row in rows:
            rate, key = self.rates.rate_for(row["gpu_model"])
            row["rate_per_gpu_hour"], row["rate_key"] = rate, key
            row["cost"] = round(row["gpu_hours"] * rate, 6)
            total_hours += row["gpu_hours"]
            total_cost += row["cost"]
        return {
            "window": w.describe(),
            "job_id": job,
            "no_data": None if rows else no_data_message(self, w, cluster_id),
            "currency": self.rates.currency,
            "rates_source": self.rates.source,
            "default_rate_per_gpu_hour": self.rates.default_per_gpu_hour,
            "rows": rows,
            "total_gpu_hours": round(total_hours, 6),
            "total_cost": round(total_cost, 6),
            **self.diagnosis.stall_costs(window, cluster_id, job),
            "truncated": cut,
        }


def _is_outlier(node: dict[str, Any], method: str) -> bool:
    if method == "mad":
        return (
            node["median_value"] is not None
            and node["cutoff"] is not None
            and node["median_value"] < node["cutoff"]
        )
    return bool(node["below"])


def _bounded_limit(limit: int) -> int:
    if not isinstance(limit, int) or limit < 1:
        raise InvestigationError(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    return min(limit, MAX_LIMIT)


def unique_names(columns: Sequence[str]) -> list[str]:
    """Column names made unique (``x``, ``x_2``, ...) and cleaned, so rows can be JSON objects."""
    seen: dict[str, int] = {}
    names = []
    for column in columns:
        base = clean_text(str(column), 128) or "column"
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
    return names
