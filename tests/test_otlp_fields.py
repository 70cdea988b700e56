"""Every field of the OTLP data model is stored or listed in docs/contract.md as not stored, with the
reason: the list is checked against the protobuf descriptors, and a request that sets every field is sent
through a real Echo and read back value by value."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
from echo_helpers import TEST_TOKEN, grpc_export
from google.protobuf.descriptor import Descriptor
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from rankecho.echo.app import Echo
from rankecho.echo.ingest import keys
from rankecho.shared.otlp import key_values

DOC = Path(__file__).resolve().parent.parent / "docs" / "contract.md"
REQUESTS = (ExportMetricsServiceRequest, ExportTraceServiceRequest, ExportLogsServiceRequest)


def otlp_fields() -> set[str]:
    """``Message.field`` for every field reachable from the three export requests."""
    found: set[str] = set()
    seen: set[str] = set()

    def walk(d: Descriptor) -> None:
        if d.full_name in seen:
            return
        seen.add(d.full_name)
        name = d.full_name.split(".v1.", 1)[1]
        for f in d.fields:
            found.add(f"{name}.{f.name}")
            if f.message_type is not None:
                walk(f.message_type)

    for request in REQUESTS:
        walk(request.DESCRIPTOR)
    return found


def documented() -> dict[str, str]:
    section = DOC.read_text().split("## Every OTLP field", 1)[1]
    rows = re.findall(r"^\| `([A-Za-z.]+\.[a-z_]+)` \| (.+) \|$", section, re.M)
    return dict(rows)


def test_every_otlp_field_has_a_row_saying_where_it_is_stored() -> None:
    rows = documented()
    missing = sorted(otlp_fields() - set(rows))
    assert not missing, "add rows to 'Every OTLP field' in docs/contract.md for: " + ", ".join(missing)
    stale = sorted(set(rows) - otlp_fields())
    assert not stale, f"rows for fields the OTLP protos do not have: {stale}"
    for field, where in rows.items():
        if where.startswith("not stored"):
            assert len(where) > 40 and ":" in where, f"{field}: say why it is not stored"


def now_ns() -> int:
    return time.time_ns() - 10**9


def resource() -> Resource:
    r = Resource(
        attributes=key_values({"k8s.node.name": "n1", "rankecho.rank": 0}), dropped_attributes_count=2
    )
    ref = r.entity_refs.add(type="host", schema_url="https://s/1", id_keys=["k8s.node.name"])
    ref.description_keys.append("host.name")
    return r


def scope() -> InstrumentationScope:
    return InstrumentationScope(
        name="my.meter", version="1.2.3", attributes=key_values({"lib": "x"}), dropped_attributes_count=1
    )


def scope_group(groups: Any, scopes_field: str) -> Any:
    """A new resource group (every resource-level field set) holding one scope group (every field set)."""
    group = groups.add(resource=resource(), schema_url=CONTEXT[keys.RESOURCE_SCHEMA_URL])
    return getattr(group, scopes_field).add(scope=scope(), schema_url=CONTEXT[keys.SCOPE_SCHEMA_URL])


def stored(echo: Echo, signal: str) -> list[tuple[Any, ...]]:
    sql = (
        f"SELECT metric_name, value_double, value_int, rank, attrs_json FROM events WHERE signal = '{signal}'"
    )
    return [(*r[:4], json.loads(str(r[4]))) for r in echo.reader.query(sql + " ORDER BY timestamp_ns").rows]


CONTEXT = {
    keys.RESOURCE_SCHEMA_URL: "https://opentelemetry.io/schemas/1.30.0",
    keys.RESOURCE_DROPPED_ATTRIBUTES: 2,
    keys.RESOURCE_ENTITY_REFS: [
        {
            "type": "host",
            "id_keys": ["k8s.node.name"],
            "description_keys": ["host.name"],
            "schema_url": "https://s/1",
        }
    ],
    keys.SCOPE_NAME: "my.meter",
    keys.SCOPE_VERSION: "1.2.3",
    keys.SCOPE_ATTRIBUTES: {"lib": "x"},
    keys.SCOPE_DROPPED_ATTRIBUTES: 1,
    keys.SCOPE_SCHEMA_URL: "https://opentelemetry.io/schemas/1.31.0",
}


def test_metric_fields_are_stored(echo_inproc: Echo) -> None:
    t = now_ns()
    request = ExportMetricsServiceRequest()
    sm = scope_group(request.resource_metrics, "scope_metrics")
    counter = Metric(name="requests", unit="{request}", description="requests served")
    counter.metadata.extend(key_values({"origin": "test"}))
    counter.sum.aggregation_temporality = 2
    counter.sum.is_monotonic = True
    counter.sum.data_points.add(time_unix_nano=t, start_time_unix_nano=t - 5, as_int=7, flags=1)
    gauge = Metric(name="temp", unit="Cel")
    dp = gauge.gauge.data_points.add(time_unix_nano=t + 1, start_time_unix_nano=t - 9, as_double=41.5)
    dp.exemplars.add(
        time_unix_nano=t,
        as_double=42.0,
        trace_id=bytes(range(16)),
        span_id=bytes(range(8)),
        filtered_attributes=key_values({"user": "u1"}),
    )
    expo = Metric(name="latency", unit="ms")
    expo.exponential_histogram.aggregation_temporality = 1
    xp = expo.exponential_histogram.data_points.add(
        time_unix_nano=t + 2, start_time_unix_nano=t - 1, count=6, sum=12.5, scale=2, zero_count=1,
        zero_threshold=0.001, min=0.0, max=5.0,
    )  # fmt: skip
    xp.positive.offset, xp.negative.offset = 3, -1
    xp.positive.bucket_counts.extend([1, 2, 1])
    xp.negative.bucket_counts.extend([1])
    sm.metrics.extend([counter, gauge, expo])
    response = grpc_export(echo_inproc.grpc_address or "", request, TEST_TOKEN)
    assert not response.partial_success.rejected_data_points
    (c_name, _, c_int, rank, c_attrs), (g_name, g_val, *_, g_attrs), (e_name, e_sum, e_count, _, e_attrs) = (
        stored(echo_inproc, "metric")
    )
    assert (c_name, c_int, rank, g_name, g_val, e_name, e_sum, e_count) == (
        "requests",
        7,
        0,
        "temp",
        41.5,
        "latency",
        12.5,
        6,
    )
    assert c_attrs == {
        **CONTEXT,
        keys.METRIC_KIND: "sum",
        keys.METRIC_UNIT: "{request}",
        keys.METRIC_DESCRIPTION: "requests served",
        keys.METRIC_METADATA: {"origin": "test"},
        keys.METRIC_TEMPORALITY: "cumulative",
        keys.METRIC_MONOTONIC: True,
        keys.METRIC_START_NS: t - 5,
        keys.METRIC_FLAGS: 1,
    }
    assert g_attrs == {
        **CONTEXT,
        keys.METRIC_UNIT: "Cel",
        keys.METRIC_EXEMPLARS: [
            {
                "time_ns": t,
                "value": 42.0,
                "attributes": {"user": "u1"},
                "trace_id": bytes(range(16)).hex(),
                "span_id": bytes(range(8)).hex(),
            }
        ],
    }
    assert e_attrs == {
        **CONTEXT,
        keys.METRIC_KIND: "exponential_histogram",
        keys.METRIC_UNIT: "ms",
        keys.METRIC_TEMPORALITY: "delta",
        keys.METRIC_START_NS: t - 1,
        keys.HIST_MIN: 0.0,
        keys.HIST_MAX: 5.0,
        keys.HIST_SCALE: 2,
        keys.HIST_ZERO_COUNT: 1,
        keys.HIST_ZERO_THRESHOLD: 0.001,
        keys.HIST_POSITIVE: {"offset": 3, "bucket_counts": [1, 2, 1]},
        keys.HIST_NEGATIVE: {"offset": -1, "bucket_counts": [1]},
    }


def test_span_fields_are_stored(echo_inproc: Echo) -> None:
    t = now_ns()
    request = ExportTraceServiceRequest()
    ss = scope_group(request.resource_spans, "scope_spans")
    span = Span(
        trace_id=b"\x01" * 16,
        span_id=b"\x02" * 8,
        parent_span_id=b"\x03" * 8,
        trace_state="k=v",
        flags=0x301,
        name="allreduce",
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=t,
        end_time_unix_nano=t + 3_000_000,
        dropped_attributes_count=1,
        dropped_events_count=2,
        dropped_links_count=3,
        status=Status(code=Status.STATUS_CODE_ERROR, message="peer 5 timed out"),
    )
    span.events.add(
        time_unix_nano=t + 1, name="enqueued", attributes=key_values({"q": 1}), dropped_attributes_count=4
    )
    span.links.add(
        trace_id=b"\x04" * 16,
        span_id=b"\x05" * 8,
        trace_state="a=b",
        flags=1,
        attributes=key_values({"why": "retry"}),
    )
    ss.spans.append(span)
    grpc_export(echo_inproc.grpc_address or "", request, TEST_TOKEN, signal="traces")
    [(name, duration, _, rank, attrs)] = stored(echo_inproc, "span")
    assert (name, duration, rank) == ("allreduce", 3.0, 0)
    assert attrs == {
        **CONTEXT,
        keys.TRACE_ID: "01" * 16,
        keys.SPAN_ID: "02" * 8,
        keys.PARENT_SPAN_ID: "03" * 8,
        keys.SPAN_KIND: 1,
        keys.SPAN_STATUS: 2,
        keys.SPAN_STATUS_MESSAGE: "peer 5 timed out",
        keys.SPAN_END_NS: t + 3_000_000,
        keys.SPAN_TRACE_STATE: "k=v",
        keys.SPAN_FLAGS: 0x301,
        keys.SPAN_EVENTS: [
            {"time_ns": t + 1, "name": "enqueued", "attributes": {"q": 1}, "dropped_attributes_count": 4}
        ],
        keys.SPAN_LINKS: [
            {
                "trace_id": "04" * 16,
                "span_id": "05" * 8,
                "attributes": {"why": "retry"},
                "trace_state": "a=b",
                "flags": 1,
            }
        ],
        keys.SPAN_DROPPED_ATTRIBUTES: 1,
        keys.SPAN_DROPPED_EVENTS: 2,
        keys.SPAN_DROPPED_LINKS: 3,
    }


def test_log_fields_are_stored_and_a_contradicting_rank_is_kept_and_counted(echo_inproc: Echo) -> None:
    t = now_ns()
    request = ExportLogsServiceRequest()
    sl = scope_group(request.resource_logs, "scope_logs")
    record = LogRecord(
        time_unix_nano=t,
        observed_time_unix_nano=t + 7,
        severity_number=13,
        severity_text="WARN",
        attributes=key_values({"rank": 99}),
        dropped_attributes_count=5,
        flags=1,
        trace_id=b"\x06" * 16,
        span_id=b"\x07" * 8,
        event_name="rank.late",
    )
    record.body.string_value = "rank 99 is late"
    sl.log_records.append(record)
    grpc_export(echo_inproc.grpc_address or "", request, TEST_TOKEN, signal="logs")
    [(name, _, _, rank, attrs)] = stored(echo_inproc, "log")
    assert (name, rank) == ("rank.late", 0)  # the resource's rank, not the record's
    assert attrs == {
        **CONTEXT,
        "rank": 99,
        keys.LOG_BODY: "rank 99 is late",
        keys.SEVERITY_TEXT: "WARN",
        keys.SEVERITY_NUMBER: 13,
        keys.TRACE_ID: "06" * 16,
        keys.SPAN_ID: "07" * 8,
        keys.LOG_FLAGS: 1,
        keys.LOG_DROPPED_ATTRIBUTES: 5,
        keys.LOG_OBSERVED_NS: t + 7,
    }
    assert echo_inproc.stats.snapshot().attribute_conflicts == {"rank": 1}
    scrape = httpx.get(f"http://{echo_inproc.http_address}/metrics").text
    assert 'rankecho_echo_attribute_conflicts_total{column="rank"} 1' in scrape.splitlines()
