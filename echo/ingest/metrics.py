"""OTLP metrics -> rows: one row per gauge/sum data point; histograms and summaries summarised.

Gauge and sum points keep their value (``as_double`` -> value_double, ``as_int`` -> value_int).
Histogram, exponential-histogram and summary points store sum in value_double and count in value_int,
with min/max/buckets/quantiles in ``attrs_json`` under the ``rankecho.histogram.*`` keys.
A NaN/Inf value is stored as NULL with the sent value named in ``rankecho.nonfinite_value``.
"""

from __future__ import annotations

import math
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from echo.ingest import keys as c
from echo.ingest.rows import MIN_TIMESTAMP_NS, AttrResolver, RowBatch, content_id
from echo.ingest.values import Scoped, nonfinite_name, point_pairs, walk

SIGNAL = "metric"


def _safe(x: float) -> float | str:
    return x if math.isfinite(x) else nonfinite_name(x)


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
        if kind == "gauge" or kind == "sum":
            _decode_numbers(origin, name, kind, getattr(metric, kind).data_points, resolver, batch)
        else:
            _decode_summarised(origin, name, kind, getattr(metric, kind).data_points, resolver, batch)


def _decode_numbers(
    origin: Scoped, name: str, kind: str, points: Any, resolver: AttrResolver, batch: RowBatch
) -> None:
    """The hot path (gauge/sum): kept flat because it runs once per data point."""
    prefix = origin.prefix + name.encode()
    resource_key, resource = origin.resource_key, origin.resource
    lowest, highest = MIN_TIMESTAMP_NS, batch.max_timestamp_ns
    kind_attr = [(c.METRIC_KIND, kind)] if kind == "sum" else []
    add, resolve = batch.add, resolver.resolve
    for dp in points:
        ts = dp.time_unix_nano
        if ts < lowest or ts > highest:
            batch.check_timestamp(ts, f"metric {name!r} point")
            continue
        point, event_id = point_pairs(dp.attributes)
        if kind_attr:
            point += kind_attr
        if dp.WhichOneof("value") == "as_int":
            vd, vi = None, dp.as_int
        else:
            vd, vi = dp.as_double, None
            if not math.isfinite(vd):
                point.append((c.NONFINITE_VALUE, nonfinite_name(vd)))
                batch.stored_with_fix["nonfinite_value"] += 1
                vd = None
        resolved = resolve(resource_key, resource, point)
        add(resolved, event_id or content_id(prefix, dp.SerializeToString()), ts, SIGNAL, name, vd, vi)


def _decode_summarised(
    origin: Scoped, name: str, kind: str, points: Any, resolver: AttrResolver, batch: RowBatch
) -> None:
    prefix = origin.prefix + name.encode()
    for dp in points:
        ts = dp.time_unix_nano
        if not batch.check_timestamp(ts, f"metric {name!r} point"):
            continue
        extra: list[tuple[str, Any]] = [(c.METRIC_KIND, kind)]
        vd, vi = _summarised_value(kind, dp, extra)
        point, event_id = point_pairs(dp.attributes)
        resolved = resolver.resolve(origin.resource_key, origin.resource, point + extra)
        batch.add(resolved, event_id or content_id(prefix, dp.SerializeToString()), ts, SIGNAL, name, vd, vi)
