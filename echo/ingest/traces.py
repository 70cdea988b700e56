"""OTLP spans -> rows: name as metric_name, start as timestamp, duration in ms as value_double.

Trace/span ids go into ``attrs_json`` as lowercase hex (``trace_id``, ``span_id``, ``parent_span_id``),
with the span kind, status code and end time. Span events and links are not stored.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from echo.ingest import keys as c
from echo.ingest.rows import AttrResolver, RowBatch, content_id
from echo.ingest.values import point_pairs, walk

SIGNAL = "span"


def _span_extra(span: Any) -> list[tuple[str, Any]]:
    extra: list[tuple[str, Any]] = [(c.TRACE_ID, span.trace_id.hex()), (c.SPAN_ID, span.span_id.hex())]
    if span.parent_span_id:
        extra.append((c.PARENT_SPAN_ID, span.parent_span_id.hex()))
    extra.append((c.SPAN_KIND, span.kind))
    if span.status.code:
        extra.append((c.SPAN_STATUS, span.status.code))
    extra.append((c.SPAN_END_NS, span.end_time_unix_nano))
    return extra


def decode_traces(req: ExportTraceServiceRequest, resolver: AttrResolver, batch: RowBatch) -> None:
    """Append every span of ``req`` to ``batch`` (bad spans are counted in ``batch.rejected``)."""
    for origin, span in walk(req.resource_spans, "scope_spans", "spans"):
        start = span.start_time_unix_nano
        if not span.name:
            batch.rejected.add("empty_span", "span without a name: set Span.name")
            continue
        if not batch.check_timestamp(start, f"span {span.name!r} start"):
            continue
        end = span.end_time_unix_nano
        duration_ms = (end - start) / 1e6 if end >= start else None
        point, event_id = point_pairs(span.attributes)
        resolved = resolver.resolve(origin.resource_key, origin.resource, point + _span_extra(span))
        event_id = event_id or content_id(origin.prefix, span.SerializeToString())
        batch.add(resolved, event_id, start, SIGNAL, span.name, duration_ms, None)
