"""The diagnosis as Prometheus gauges on Echo's ``/metrics``: what a person alerts on and graphs.

Per cluster: stragglers named, their late episodes, the GPU-seconds they imposed and the cost rate, over
the last ``window`` (find_stragglers' own answer, so an alert and an MCP answer never disagree); hangs open
now, crashes and desyncs (find_hangs' answer); per node:
seconds since its newest event (a node whose agent stopped reporting stands out). The analysis runs in
a background thread every ``every_s`` seconds, never in a scrape: a scrape reads the last result, and
``rankecho_diagnosis_age_seconds`` says how old it is. The Grafana dashboard and alert rules shipped in
helm/rankecho/dashboards/ use exactly these names (tests/test_dashboards.py checks it).

Usage::

    service = DiagnosisMetricsService()        # one of Echo's services: started and stopped with it
    text = service.render()                     # appended to ops.render() at /metrics
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rankecho.echo.mcp.rates import load_rates

if TYPE_CHECKING:
    from rankecho.echo.app import Echo
    from rankecho.echo.mcp.tools import Investigation

log = logging.getLogger("rankecho.echo")

WINDOW = "last 15m"
"""The diagnosis window the gauges describe."""
EVERY_S = 30.0
"""Seconds between refreshes (a scrape never waits for the analysis)."""

METRICS = {
    "rankecho_stragglers": "Stragglers (ranks or nodes) find_stragglers names in the window.",
    "rankecho_straggler_late_episodes": "Late episodes of each named straggler in the window.",
    "rankecho_imposed_gpu_seconds": "GPU-seconds the other ranks waited for named stragglers in the window.",
    "rankecho_stall_cost_per_hour": "What the imposed waits cost per hour at the window's rate (GPU rates).",
    "rankecho_late_episodes": "Late episodes in the window, named stragglers' and isolated ones.",
    "rankecho_hangs": "Collective instances open past the hang threshold now (find_hangs: ranks stuck).",
    "rankecho_hang_open_seconds": "Seconds the oldest open hang of the cluster has waited (absent: none).",
    "rankecho_crashes": "Rank exits that took a job down in the window (find_hangs' crashes, first ones).",
    "rankecho_desyncs": "Instances whose ranks issued different collectives in the window (find_hangs).",
    "rankecho_node_last_event_age_seconds": "Seconds since the node's newest stored event (data freshness).",
    "rankecho_diagnosis_age_seconds": "Seconds since these gauges were computed.",
    "rankecho_diagnosis_duration_seconds": "How long the last refresh of these gauges took.",
    "rankecho_diagnosis_failures_total": "Refreshes that failed (the gauges keep their last values).",
}
"""Every metric name this module exports, with its help text (the dashboard test reads this)."""


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Gauges:
    samples: list[Sample] = field(default_factory=list)
    computed_at: float | None = None
    duration_s: float = 0.0


def compute(inv: Investigation, window: str, now_ns: int) -> list[Sample]:
    """The gauges of one refresh, from find_stragglers and the node freshness query."""
    found = inv.diagnosis.find_stragglers(window)
    out: list[Sample] = []
    for cluster in found["clusters"]:
        cid = str(cluster["cluster_id"])
        named = [s for s in found["stragglers"] if s["cluster_id"] == cluster["cluster_id"]]
        isolated = [s for s in found["isolated_late_episodes"] if s["cluster_id"] == cluster["cluster_id"]]
        out.append(Sample("rankecho_stragglers", {"cluster_id": cid}, len(named)))
        out.append(Sample("rankecho_imposed_gpu_seconds", {"cluster_id": cid},
                          sum(s["imposed_gpu_s"] or 0.0 for s in named)))  # fmt: skip
        currency = named[0]["cost"]["currency"] if named else inv.rates.currency
        out.append(Sample("rankecho_stall_cost_per_hour", {"cluster_id": cid, "currency": currency},
                          sum((s["cost"]["cost_per_day"] or 0.0) / 24 for s in named)))  # fmt: skip
        episodes = sum(s["episodes_total"] for s in named) + sum(s["episodes_total"] for s in isolated)
        out.append(Sample("rankecho_late_episodes", {"cluster_id": cid}, episodes))
        for s in named:
            rank = "" if s["rank"] is None else str(s["rank"])
            labels = {"cluster_id": cid, "kind": s["kind"], "node_id": str(s["node_id"]), "rank": rank,
                      "cause": str(s["cause"]["class"])}
            out.append(Sample("rankecho_straggler_late_episodes", labels, s["episodes_total"]))
    out += failure_samples(inv, window, {str(c["cluster_id"]) for c in found["clusters"]})
    nodes, _ = inv.records(inv.run_named("summary_nodes", now_ns=now_ns, start_ns=None, end_ns=None))
    for node in nodes:
        out.append(Sample("rankecho_node_last_event_age_seconds",
                          {"cluster_id": str(node["cluster_id"]), "node_id": str(node["node_id"])},
                          max(float(node["stale_s"]), 0.0)))  # fmt: skip
    return out


def failure_samples(inv: Investigation, window: str, clusters: set[str]) -> list[Sample]:
    """Hangs open now, crashes and desyncs in the window, per cluster (0 for a cluster with none, so an
    alert on them resolves): what stops a job rather than slows it, for a page rather than a ticket."""
    found = inv.failures.find_hangs(window)
    counts: dict[str, dict[str, int]] = {cid: {"hangs": 0, "crashes": 0, "desyncs": 0} for cid in clusters}
    oldest: dict[str, float] = {}
    for kind in ("hangs", "crashes", "desyncs"):
        for row in found[kind]:
            if kind == "crashes" and not row["first"]:
                continue  # its peers aborting after it: one crash
            cid = str(row["cluster_id"])
            counts.setdefault(cid, {"hangs": 0, "crashes": 0, "desyncs": 0})[kind] += 1
            if kind == "hangs":
                oldest[cid] = max(oldest.get(cid, 0.0), float(row["open_s"]))
    out = [Sample(f"rankecho_{kind}", {"cluster_id": cid}, n)
           for cid, kinds in sorted(counts.items()) for kind, n in kinds.items()]  # fmt: skip
    out += [Sample("rankecho_hang_open_seconds", {"cluster_id": cid}, s) for cid, s in sorted(oldest.items())]
    return out


def render(gauges: Gauges, failures: int, now: float) -> str:
    """Prometheus text exposition (0.0.4) of the gauges, every family with HELP and TYPE."""
    families: dict[str, list[Sample]] = {name: [] for name in METRICS}
    for s in gauges.samples:
        families[s.name].append(s)
    age = now - gauges.computed_at if gauges.computed_at is not None else float("nan")
    families["rankecho_diagnosis_age_seconds"].append(Sample("rankecho_diagnosis_age_seconds", {}, age))
    families["rankecho_diagnosis_duration_seconds"].append(
        Sample("rankecho_diagnosis_duration_seconds", {}, gauges.duration_s))
    families["rankecho_diagnosis_failures_total"].append(
        Sample("rankecho_diagnosis_failures_total", {}, failures))
    lines = []
    for name, samples in families.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        lines += [f"# HELP {name} {METRICS[name]}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{_labels(s.labels)} {s.value:g}" for s in samples]
    return "\n".join(lines) + "\n"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _escape(value: str) -> str:
    """A label value as the exposition format writes it (backslash, newline, double quote escaped)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class DiagnosisMetricsService:
    """An Echo service (started and stopped with it) that keeps the gauges fresh in a thread."""

    name = "diagnosis_metrics"

    def __init__(self, rates_path: Path | None = None, window: str = WINDOW,
                 every_s: float = EVERY_S) -> None:  # fmt: skip
        self._rates = load_rates(rates_path)
        self._window = window
        self._every_s = every_s
        self._gauges = Gauges()
        self._failures = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, echo: Echo) -> str | None:
        from rankecho.echo.mcp.tools import Investigation

        inv = Investigation(echo.reader, self._rates)
        echo.metric_sources.append(self.render)
        self._thread = threading.Thread(target=self._loop, args=(inv,), name="diagnosis-gauges", daemon=True)
        self._thread.start()
        return None

    def refresh(self, inv: Investigation) -> None:
        started = time.monotonic()
        try:
            samples = compute(inv, self._window, time.time_ns())
        except Exception as exc:  # the gauges keep their last values; the failure is counted and logged
            with self._lock:
                self._failures += 1
            log.warning("diagnosis metrics: refresh failed (%s); the gauges keep their last values", exc)
            return
        with self._lock:
            self._gauges = Gauges(samples, time.time(), time.monotonic() - started)

    def render(self) -> str:
        with self._lock:
            return render(self._gauges, self._failures, time.time())

    def _loop(self, inv: Investigation) -> None:
        while not self._stop.is_set():
            self.refresh(inv)
            self._stop.wait(self._every_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
