"""Clients this project did not write: the OpenTelemetry Python SDK's gRPC metric exporter (explicit
per-point timestamps, gzip) and OTLP/HTTP JSON posted with a plain HTTP client (hex trace ids)."""

from __future__ import annotations

import json
import time

from echo_helpers import TEST_TOKEN, http_post
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import Compression
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from rankecho.echo.app import Echo
from rankecho.echo.ingest import keys
from rankecho.echo.queries import FANIN
from rankecho.shared import contract as c


def sdk_metrics(node: str, stamps: list[int]) -> MetricsData:
    points = [
        NumberDataPoint({c.CAUSAL_CHAIN_ID: f"chain-{i}"}, 0, ts, 0.3 if i == 0 else 0.95)
        for i, ts in enumerate(stamps)
    ]
    metric = Metric(c.M_HEALTH, "rank health", "1", Gauge(points))
    scope = ScopeMetrics(InstrumentationScope("interop-test"), [metric], "")
    resource = Resource({c.CLUSTER_NAME: "sdk-cluster", c.NODE_NAME: node, c.RANK: 1, c.NRANKS: 2})
    return MetricsData([ResourceMetrics(resource, [scope], "")])


def test_otel_sdk_grpc_exporter_keeps_explicit_timestamps(echo_inproc: Echo) -> None:
    exporter = OTLPMetricExporter(
        endpoint=echo_inproc.grpc_address, insecure=True, headers={"authorization": f"Bearer {TEST_TOKEN}"},
        compression=Compression.Gzip, timeout=10,
    )  # fmt: skip
    stamps = [time.time_ns() - 10**9 * k for k in range(5)]
    try:
        assert exporter.export(sdk_metrics("sdk-node", stamps)) == MetricExportResult.SUCCESS
        assert exporter.export(sdk_metrics("sdk-node", stamps)) == MetricExportResult.SUCCESS  # a resend
    finally:
        exporter.shutdown()
    got = echo_inproc.reader.query("SELECT timestamp_ns, cluster_id, node_id, rank, nranks FROM events").rows
    assert sorted(r[0] for r in got) == sorted(stamps)
    assert {r[1:] for r in got} == {("sdk-cluster", "sdk-node", 1, 2)}
    assert echo_inproc.reader.query(FANIN["chains"].sql).rows == [(5,)]
    assert echo_inproc.reader.query(FANIN["stragglers"].sql).rows == [("sdk-node", 1)]


def test_otlp_http_json_metrics_and_traces_from_a_plain_client(echo_inproc: Echo) -> None:
    now = time.time_ns()
    resource = {"attributes": [{"key": "cluster_id", "value": {"stringValue": "json-c"}},
                               {"key": "node_id", "value": {"stringValue": "json-n"}}]}  # fmt: skip
    metrics = {"resourceMetrics": [{"resource": resource, "scopeMetrics": [{"metrics": [{
        "name": c.M_HEALTH,
        "gauge": {"dataPoints": [
            {"timeUnixNano": str(now), "asDouble": 0.25, "attributes": [
                {"key": c.CAUSAL_CHAIN_ID, "value": {"stringValue": "comm:1"}}]},
            {"timeUnixNano": str(now + 1), "asInt": "42", "unknownField": True},
        ]},
    }]}]}]}  # fmt: skip
    trace_id, span_id = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
    traces = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [{
        "traceId": trace_id, "spanId": span_id, "name": "allreduce", "kind": 1,
        "startTimeUnixNano": str(now), "endTimeUnixNano": str(now + 1_000_000),
    }]}]}]}  # fmt: skip
    address = echo_inproc.http_address or ""
    for signal, body in (("metrics", metrics), ("traces", traces)):
        response = http_post(
            address, signal, json.dumps(body).encode(), TEST_TOKEN, content_type="application/json"
        )
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"] == "application/json"
        assert "partialSuccess" not in response.json()
    columns = "signal, node_id, value_double, value_int, causal_chain_id, attrs_json"
    got = echo_inproc.reader.query(f"SELECT {columns} FROM events ORDER BY timestamp_ns, signal").rows
    assert [r[:5] for r in got] == [
        ("metric", "json-n", 0.25, None, "comm:1"),
        ("span", "json-n", 1.0, None, None),
        ("metric", "json-n", None, 42, None),
    ]
    span_attrs = json.loads(str(got[1][5]))
    assert (span_attrs[keys.TRACE_ID], span_attrs[keys.SPAN_ID]) == (trace_id, span_id)
