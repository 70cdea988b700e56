"""Ingest semantics through a real in-process Echo over gRPC: column mapping, the seed's four queries,
idempotence, spans, logs and summarised histograms."""

from __future__ import annotations

import json
import time

from echo_helpers import TEST_TOKEN, grpc_export, node_request, rows
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import Histogram, HistogramDataPoint, Metric
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from rankecho.echo.app import Echo
from rankecho.echo.ingest import keys
from rankecho.echo.queries import FANIN
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, any_value, key_values, metrics_request


def test_semconv_and_plain_keys_map_to_columns_resource_wins_and_conflicts_are_kept_and_counted(
    echo_inproc: Echo,
) -> None:
    now = time.time_ns()
    resource = {c.CLUSTER_NAME: "k8s-c", c.NODE_NAME: "node-r", c.RANK: 3, c.NRANKS: 8, c.HOST_NAME: "h1"}
    points = [
        Point(c.M_HEALTH, now, 0.5, {c.CAUSAL_CHAIN_ID: "comm:7", "extra": "x"}),
        Point(c.M_HEALTH, now + 1, 0.6, {"node_id": "node-p", "rank": "5"}),
        Point(c.M_HEALTH, now + 2, 0.7, {"rank": 3, "nranks": "not a number"}),
    ]
    grpc_export(echo_inproc.grpc_address or "", metrics_request(resource, points), TEST_TOKEN)
    columns = "cluster_id, node_id, rank, nranks, causal_chain_id, attrs_json"
    first, second, third = rows(echo_inproc, f"SELECT {columns} FROM events ORDER BY timestamp_ns")
    scope = {keys.SCOPE_NAME: "rankecho"}
    assert first[:5] == ("k8s-c", "node-r", 3, 8, "comm:7")
    assert json.loads(str(first[5])) == {
        c.HOST_NAME: "h1",
        **scope,
        c.CAUSAL_CHAIN_ID: "comm:7",
        "extra": "x",
    }
    # the resource names the process: its node and rank are kept; the point's other values stay as evidence
    assert second[:5] == ("k8s-c", "node-r", 3, 8, None)
    assert json.loads(str(second[5])) == {c.HOST_NAME: "h1", **scope, "node_id": "node-p", "rank": "5"}
    # agreeing with the resource is no conflict; a value that does not fit the column is no conflict either
    assert third[:5] == ("k8s-c", "node-r", 3, 8, None)
    assert json.loads(str(third[5])) == {c.HOST_NAME: "h1", **scope, "rank": 3, "nranks": "not a number"}
    assert echo_inproc.stats.snapshot().attribute_conflicts == {"node_id": 1, "rank": 1}


def test_point_attributes_fill_columns_the_resource_leaves_empty(echo_inproc: Echo) -> None:
    now = time.time_ns()
    points = [Point(c.M_HEALTH, now + r, 0.5, {"rank": r, "node_id": "n-point"}) for r in range(3)]
    grpc_export(echo_inproc.grpc_address or "", metrics_request({"cluster_id": "c"}, points), TEST_TOKEN)
    got = rows(echo_inproc, "SELECT cluster_id, node_id, rank, attrs_json FROM events ORDER BY rank")
    assert [r[:3] for r in got] == [("c", "n-point", 0), ("c", "n-point", 1), ("c", "n-point", 2)]
    assert all(json.loads(str(r[3])) == {keys.SCOPE_NAME: "rankecho"} for r in got)
    assert echo_inproc.stats.snapshot().attribute_conflicts == {}


def test_seed_queries_run_verbatim_and_count_exactly(echo_inproc: Echo) -> None:
    address = echo_inproc.grpc_address or ""
    for node in ("node-a100", "node-h100"):
        grpc_export(address, node_request(node, 100, cluster="demo-cluster"), TEST_TOKEN)
    chain_points = [
        Point(c.M_HEALTH, time.time_ns() + i, 0.9, {c.CAUSAL_CHAIN_ID: f"k{i % 4}"}) for i in range(8)
    ]
    grpc_export(
        address,
        metrics_request({"cluster_id": "demo-cluster", "node_id": "node-x"}, chain_points),
        TEST_TOKEN,
    )
    assert rows(echo_inproc, FANIN["per_node_events"].sql) == [
        ("demo-cluster", "node-a100", 100),
        ("demo-cluster", "node-h100", 100),
        ("demo-cluster", "node-x", 8),
    ]
    assert rows(echo_inproc, FANIN["chains"].sql) == [(4,)]
    assert sorted(rows(echo_inproc, FANIN["stragglers"].sql)) == [("node-a100", 25), ("node-h100", 25)]
    quantiles = dict((r[0], r[1:]) for r in rows(echo_inproc, FANIN["health_quantiles"].sql))
    assert quantiles["node-x"] == (0.9, 0.9)
    assert quantiles["node-a100"][0] == 0.9


def test_resent_batches_add_no_rows_with_and_without_producer_ids(echo_inproc: Echo) -> None:
    address = echo_inproc.grpc_address or ""
    hashed = node_request("n1", 50)
    with_ids = metrics_request(
        {"node_id": "n2"},
        [Point(c.M_HEALTH, time.time_ns() + i, 0.5, {c.EVENT_ID: f"n2-{i}"}) for i in range(30)],
    )
    for _ in range(3):
        grpc_export(address, hashed, TEST_TOKEN)
        grpc_export(address, with_ids, TEST_TOKEN)
    assert rows(
        echo_inproc, "SELECT node_id, count(*), count(DISTINCT event_id) FROM events GROUP BY 1 ORDER BY 1"
    ) == [
        ("n1", 50, 50),
        ("n2", 30, 30),
    ]
    assert rows(
        echo_inproc, "SELECT event_id FROM events WHERE node_id = 'n2' ORDER BY timestamp_ns LIMIT 1"
    ) == [("n2-0",)]
    assert echo_inproc.stats.snapshot().duplicates == 2 * 80


def test_spans_logs_and_histograms_become_rows(echo_inproc: Echo) -> None:
    address = echo_inproc.grpc_address or ""
    now = time.time_ns()
    traces = ExportTraceServiceRequest()
    rs = traces.resource_spans.add()
    rs.resource.attributes.extend(key_values({"node_id": "n1"}))
    span = Span(name="step", trace_id=bytes(range(16)), span_id=bytes(range(8)), start_time_unix_nano=now,
                end_time_unix_nano=now + 2_500_000)  # fmt: skip
    rs.scope_spans.add().spans.append(span)
    grpc_export(address, traces, TEST_TOKEN, signal="traces")

    logs = ExportLogsServiceRequest()
    rl = logs.resource_logs.add()
    record = LogRecord(observed_time_unix_nano=now, severity_text="WARN", body=any_value("rank 5 is late"))
    rl.scope_logs.add().log_records.append(record)
    grpc_export(address, logs, TEST_TOKEN, signal="logs")

    metrics = ExportMetricsServiceRequest()
    point = HistogramDataPoint(
        time_unix_nano=now, count=3, sum=6.0, min=1.0, max=3.0, explicit_bounds=[2.0], bucket_counts=[1, 2]
    )
    hist = Histogram(data_points=[point])
    metrics.resource_metrics.add().scope_metrics.add().metrics.append(Metric(name="lat", histogram=hist))
    grpc_export(address, metrics, TEST_TOKEN)

    got = {
        r[0]: r[1:]
        for r in rows(
            echo_inproc, "SELECT signal, metric_name, value_double, value_int, attrs_json FROM events"
        )
    }
    name, duration, _, attrs = got["span"]
    assert (name, duration) == ("step", 2.5)
    assert json.loads(str(attrs))[keys.TRACE_ID] == bytes(range(16)).hex()
    name, _, _, attrs = got["log"]
    assert name == "rank 5 is late" and json.loads(str(attrs))[keys.SEVERITY_TEXT] == "WARN"
    name, total, count, attrs = got["metric"]
    assert (name, total, count) == ("lat", 6.0, 3)
    assert json.loads(str(attrs))[keys.HIST_BUCKET_COUNTS] == [1, 2]


def test_values_that_python_calls_equal_keep_their_own_types(echo_inproc: Echo) -> None:
    now = time.time_ns()
    sent = [True, 1, 1.0, (True,), (1,)]
    points = [Point(c.M_HEALTH, now + i, 0.5) for i in range(len(sent))]
    request = metrics_request({"node_id": "n"}, points)
    for dp, value in zip(
        request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points, sent, strict=True
    ):
        if isinstance(value, tuple):
            kv = dp.attributes.add(key="flag")
            kv.value.array_value.values.append(any_value(value[0]))
        else:
            dp.attributes.append(key_values({"flag": value})[0])
    grpc_export(echo_inproc.grpc_address or "", request, TEST_TOKEN)
    got = rows(echo_inproc, "SELECT attrs_json FROM events ORDER BY timestamp_ns")
    scope = '{"otel.scope.name":"rankecho",'
    assert [r[0] for r in got] == [
        scope + '"flag":true}',
        scope + '"flag":1}',
        scope + '"flag":1.0}',
        scope + '"flag":[true]}',
        scope + '"flag":[1]}',
    ]


def test_unusable_column_values_stay_in_attrs(echo_inproc: Echo) -> None:
    resource = {"node_id": 17, "rank": "first", c.NRANKS: 2**40, c.HOST_NAME: "h"}
    request = metrics_request(resource, [Point(c.M_HEALTH, time.time_ns(), 0.5)])
    grpc_export(echo_inproc.grpc_address or "", request, TEST_TOKEN)
    got = rows(echo_inproc, "SELECT node_id, rank, nranks, attrs_json FROM events")
    assert got[0][:3] == ("h", None, None)  # the first key whose value fits wins
    assert json.loads(str(got[0][3])) == {
        "node_id": 17, "rank": "first", c.NRANKS: 2**40, keys.SCOPE_NAME: "rankecho"
    }  # fmt: skip
