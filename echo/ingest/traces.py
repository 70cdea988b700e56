"""OTLP spans -> rows: name as metric_name, start as timestamp, duration in ms as value_double.

Trace/span ids go into ``attrs_json`` as lowercase hex (``trace_id``, ``span_id``, ``parent_span_id``),
with the span kind, status code and message, end time, trace state, flags, the producer's dropped counts,
and the span's events and links as JSON arrays (``rankecho.span.events``, ``rankecho.span.links``).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from rankecho.echo.ingest import keys as c
from rankecho.echo.ingest.rows import AttrResolver, RowBatch, content_id
from rankecho.echo.ingest.values import pairs, point_pairs, walk

SIGNAL = "span"


def _event(e: Any) -> dict[str, Any]:
    item = {"time_ns": e.time_unix_nano, "name": e.name, "attributes": dict(pairs(e.attributes))}
    if e.dropped_attributes_count:
        item["dropped_attributes_count"] = e.dropped_attributes_count
    return item


def _link(link: Any) -> dict[str, Any]:
    item = {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex(),
            "attributes": dict(pairs(link.attributes))}  # fmt: skip
    for name in ("trace_state", "flags", "dropped_attributes_count"):
        if value := getattr(link, name):
            item[name] = value
    return item


def _span_extra(span: Any) -> list[tuple[str, Any]]:
    extra: list[tuple[str, Any]] = [(c.TRACE_ID, span.trace_id.hex()), (c.SPAN_ID, span.span_id.hex())]
    if span.parent_span_id:
        extra.append((c.PARENT_SPAN_ID, span.parent_span_id.hex()))
    extra.append((c.SPAN_KIND, span.kind))
    if span.status.code:
        extra.append((c.SPAN_STATUS, span.status.code))
    if span.status.message:
        extra.append((c.SPAN_STATUS_MESSAGE, span.status.message))
    extra.append((c.SPAN_END_NS, span.end_time_unix_nano))
    optional = (
        (c.SPAN_TRACE_STATE, span.trace_state),
        (c.SPAN_FLAGS, span.flags),
        (c.SPAN_EVENTS, tuple(_event(e) for e in span.events)),
        (c.SPAN_LINKS, tuple(_link(link) for link in span.links)),
        (c.SPAN_DROPPED_ATTRIBUTES, span.dropped_attributes_count),
        (c.SPAN_DROPPED_EVENTS, span.dropped_events_count),
        (c.SPAN_DROPPED_LINKS, span.dropped_links_count),
    )
    extra += [(key, value) for key, value in optional if value]
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
