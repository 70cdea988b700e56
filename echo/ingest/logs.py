"""OTLP log records -> rows: ``event_name`` (else the body text) as metric_name.

The timestamp is ``time_unix_nano``, or ``observed_time_unix_nano`` when the producer left it 0 (as the
OTLP spec allows). A numeric body becomes value_double/value_int; any other body is kept in
``attrs_json`` under ``log.body``, with severity text/number, trace/span ids, flags, the producer's
dropped-attribute count, and the observed time when it differs from the stored timestamp.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from rankecho.echo.ingest import keys as c
from rankecho.echo.ingest.rows import AttrResolver, RowBatch, content_id
from rankecho.echo.ingest.values import point_pairs, to_python, walk

SIGNAL = "log"
MAX_NAME_CHARS = 200
"""A body used as metric_name is cut to this many characters; the full body stays in attrs_json."""


def _log_fields(record: Any, ts: int) -> tuple[str, float | None, int | None, list[tuple[str, Any]]]:
    body = to_python(record.body) if record.HasField("body") else None
    extra: list[tuple[str, Any]] = []
    vd: float | None = None
    vi: int | None = None
    if isinstance(body, float):
        vd = body
    elif isinstance(body, int) and not isinstance(body, bool):
        vi = body
    elif body is not None:
        extra.append((c.LOG_BODY, body))
    if record.severity_text:
        extra.append((c.SEVERITY_TEXT, record.severity_text))
    if record.severity_number:
        extra.append((c.SEVERITY_NUMBER, record.severity_number))
    if record.trace_id:
        extra.append((c.TRACE_ID, record.trace_id.hex()))
    if record.span_id:
        extra.append((c.SPAN_ID, record.span_id.hex()))
    if record.flags:
        extra.append((c.LOG_FLAGS, record.flags))
    if record.dropped_attributes_count:
        extra.append((c.LOG_DROPPED_ATTRIBUTES, record.dropped_attributes_count))
    if record.observed_time_unix_nano and record.observed_time_unix_nano != ts:
        extra.append((c.LOG_OBSERVED_NS, record.observed_time_unix_nano))
    name = record.event_name or (body[:MAX_NAME_CHARS] if isinstance(body, str) and body else "log")
    return name, vd, vi, extra


def decode_logs(req: ExportLogsServiceRequest, resolver: AttrResolver, batch: RowBatch) -> None:
    """Append every log record of ``req`` to ``batch`` (bad records are counted in ``batch.rejected``)."""
    for origin, record in walk(req.resource_logs, "scope_logs", "log_records"):
        ts = record.time_unix_nano or record.observed_time_unix_nano
        if not batch.check_timestamp(ts, "log record"):
            continue
        name, vd, vi, extra = _log_fields(record, ts)
        point, event_id = point_pairs(record.attributes)
        resolved = resolver.resolve(origin.resource_key, origin.resource, point + extra)
        event_id = event_id or content_id(origin.prefix, record.SerializeToString())
        batch.add(resolved, event_id, ts, SIGNAL, name, vd, vi)
