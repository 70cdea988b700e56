"""OTLP metrics -> rows: one row per gauge/sum data point; histograms and summaries summarised.

Gauge and sum points keep their value (``as_double`` -> value_double, ``as_int`` -> value_int).
Histogram, exponential-histogram and summary points store sum in value_double and count in value_int,
with min/max/buckets/quantiles in ``attrs_json`` under the ``rankecho.histogram.*`` keys.
A NaN/Inf value is stored as NULL with the sent value named in ``rankecho.nonfinite_value``.
The metric's unit, description, metadata, temporality and monotonicity, and each point's start time,
flags and exemplars go into ``attrs_json`` too (``echo/ingest/keys.py``); a gauge's start time is the
one field left out, because the OTLP data model says it is ignored for gauges.
"""

from __future__ import annotations

import math
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from rankecho.echo.ingest import keys as c
from rankecho.echo.ingest.rows import MIN_TIMESTAMP_NS, AttrResolver, RowBatch, content_id
from rankecho.echo.ingest.values import Scoped, nonfinite_name, pairs, point_pairs, walk

SIGNAL = "metric"
TEMPORALITY = {1: "delta", 2: "cumulative"}


def _safe(x: float) -> float | str:
    return x if math.isfinite(x) else nonfinite_name(x)


def metric_context(metric: Any, kind: str) -> list[tuple[str, Any]]:
    """Echo keys that hold for every point of ``metric``: kind, unit, description, metadata, temporality."""
    extra: list[tuple[str, Any]] = [] if kind == "gauge" else [(c.METRIC_KIND, kind)]
    if metric.unit:
        extra.append((c.METRIC_UNIT, metric.unit))
    if metric.description:
        extra.append((c.METRIC_DESCRIPTION, metric.description))
    if metric.metadata:
        extra.append((c.METRIC_METADATA, dict(pairs(metric.metadata))))
    data = getattr(metric, kind)
    temporality = TEMPORALITY.get(getattr(data, "aggregation_temporality", 0))
    if temporality:
        extra.append((c.METRIC_TEMPORALITY, temporality))
    if kind == "sum":
        extra.append((c.METRIC_MONOTONIC, data.is_monotonic))
    return extra


def _exemplars(dp: Any) -> list[tuple[str, Any]]:
    if not dp.exemplars:
        return []
    out = []
    for e in dp.exemplars:
        value = e.as_int if e.WhichOneof("value") == "as_int" else _safe(e.as_double)
        item = {"time_ns": e.time_unix_nano, "value": value, "attributes": dict(pairs(e.filtered_attributes))}
        if e.trace_id:
            item["trace_id"], item["span_id"] = e.trace_id.hex(), e.span_id.hex()
        out.append(item)
    return [(c.METRIC_EXEMPLARS, tuple(out))]


def _point_extra(kind: str, dp: Any) -> list[tuple[str, Any]]:
    """Per-point fields besides the value: start time (not for gauges), flags, exemplars."""
    extra: list[tuple[str, Any]] = []
    if kind != "gauge" and dp.start_time_unix_nano:
        extra.append((c.METRIC_START_NS, dp.start_time_unix_nano))
    if dp.flags:
        extra.append((c.METRIC_FLAGS, dp.flags))
    return extra + _exemplars(dp)


def _buckets(b: Any) -> dict[str, Any]:
    return {"offset": b.offset, "bucket_counts": tuple(b.bucket_counts)}


def _summarised_value(kind: str, dp: Any, extra: list[tuple[str, Any]]) -> tuple[float | None, int | None]:
    """(sum, count) for histogram-like points; the distribution goes into ``extra``."""
    if kind == "summary":
        extra.append(
            (c.SUMMARY_QUANTILES, tuple((repr(q.quantile), _safe(q.value)) for q in dp.quantile_values))
        )
    else:
        if dp.HasField("min"):
            extra.append((c.HIST_MIN, _safe(dp.min)))
        if dp.HasField("max"):
            extra.append((c.HIST_MAX, _safe(dp.max)))
        if kind == "histogram":
            extra.append((c.HIST_BOUNDS, tuple(_safe(b) for b in dp.explicit_bounds)))
            extra.append((c.HIST_BUCKET_COUNTS, tuple(dp.bucket_counts)))
        else:
            extra.append((c.HIST_SCALE, dp.scale))
            extra.append((c.HIST_ZERO_COUNT, dp.zero_count))
            if dp.zero_threshold:
                extra.append((c.HIST_ZERO_THRESHOLD, _safe(dp.zero_threshold)))
            extra.append((c.HIST_POSITIVE, _buckets(dp.positive)))
            extra.append((c.HIST_NEGATIVE, _buckets(dp.negative)))
    total = dp.sum if kind == "summary" or dp.HasField("sum") else math.nan
    if not math.isfinite(total):
        return None, dp.count
    return total, dp.count


def decode_metrics(req: ExportMetricsServiceRequest, resolver: AttrResolver, batch: RowBatch) -> None:
    """Append every data point of ``req`` to ``batch`` (bad points are counted in ``batch.rejected``)."""
    for origin, metric in walk(req.resource_metrics, "scope_metrics", "metrics"):
        name = metric.name
        kind = metric.WhichOneof("data")
        if not name or kind is None:
            batch.rejected.add("empty_metric", "metric without a name or data: set Metric.name and its data")
            continue
        context = metric_context(metric, kind)
        scoped = origin.extended(repr(context).encode(), context) if context else origin
        if kind == "gauge" or kind == "sum":
            _decode_numbers(scoped, name, kind, getattr(metric, kind).data_points, resolver, batch)
        else:
            _decode_summarised(scoped, name, kind, getattr(metric, kind).data_points, resolver, batch)


def _decode_numbers(
    origin: Scoped, name: str, kind: str, points: Any, resolver: AttrResolver, batch: RowBatch
) -> None:
    """The hot path (gauge/sum): kept flat because it runs once per data point."""
    prefix = origin.prefix + name.encode()
    resource_key, resource = origin.resource_key, origin.resource
    lowest, highest = MIN_TIMESTAMP_NS, batch.max_timestamp_ns
    append, note, resolve = batch.rows.append, batch.note, resolver.resolve
    for dp in points:
        ts = dp.time_unix_nano
        if ts < lowest or ts > highest:
            batch.check_timestamp(ts, f"metric {name!r} point")
            continue
        point, event_id = point_pairs(dp.attributes)
        if dp.flags or dp.exemplars or (kind == "sum" and dp.start_time_unix_nano):
            point += _point_extra(kind, dp)
        if dp.HasField("as_int"):  # ~2x cheaper than WhichOneof on upb
            vd, vi = None, dp.as_int
        else:
            vd, vi = dp.as_double, None
            if not math.isfinite(vd):
                point.append((c.NONFINITE_VALUE, nonfinite_name(vd)))
                batch.stored_with_fix["nonfinite_value"] += 1
                vd = None
        resolved = resolve(resource_key, resource, point)
        append((resolved, event_id or content_id(prefix, dp.SerializeToString()), ts, SIGNAL, name, vd, vi))
        if resolved.noteworthy:
            note(resolved)


def _decode_summarised(
    origin: Scoped, name: str, kind: str, points: Any, resolver: AttrResolver, batch: RowBatch
) -> None:
    prefix = origin.prefix + name.encode()
    for dp in points:
        ts = dp.time_unix_nano
        if not batch.check_timestamp(ts, f"metric {name!r} point"):
            continue
        extra: list[tuple[str, Any]] = _point_extra(kind, dp)
        vd, vi = _summarised_value(kind, dp, extra)
        point, event_id = point_pairs(dp.attributes)
        resolved = resolver.resolve(origin.resource_key, origin.resource, point + extra)
        batch.add(resolved, event_id or content_id(prefix, dp.SerializeToString()), ts, SIGNAL, name, vd, vi)
