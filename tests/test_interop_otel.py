"""OpenTelemetry SDKs this project did not write, configured only by the standard environment variables
(the ones docs/echo.md "Connect your client" gives), exporting to a real Echo: the JS SDK 2.x over gRPC,
HTTP/protobuf and HTTP/JSON (its HTTP exporters send chunked bodies), the Python SDK over gRPC and
HTTP/protobuf, each plain and gzip. Every stored row is checked value by value: metric values, units,
descriptions, temporality, histogram and exponential-histogram buckets, scope, the span's times,
event, link and status message, and the log record whose ``rank`` attribute contradicts its resource."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
from echo_helpers import TEST_TOKEN
from interop_clients import JS_EXPORT, PYTHON_EXPORT, run_client, system_node

from rankecho.echo.app import Echo
from rankecho.echo.ingest import keys

CASES = [
    ("js", "grpc", "none"), ("js", "grpc", "gzip"),
    ("js", "http/protobuf", "none"), ("js", "http/protobuf", "gzip"),
    ("js", "http/json", "none"), ("js", "http/json", "gzip"),
    ("py", "grpc", "none"), ("py", "grpc", "gzip"),
    ("py", "http/protobuf", "none"), ("py", "http/protobuf", "gzip"),
]  # fmt: skip
LATENCY_BOUNDS = [0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0,
                  7500.0, 10000.0]  # fmt: skip
"""The explicit-bucket histogram's default boundaries, the same in both SDKs."""


def client_env(echo: Echo, protocol: str, compression: str, node: str, t0_ms: int) -> dict[str, str]:
    """Exactly what docs/echo.md tells a user to set."""
    address = echo.grpc_address if protocol == "grpc" else echo.http_address
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{address}",
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{TEST_TOKEN}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "INTEROP_NODE": node,
        "INTEROP_T0_MS": str(t0_ms),
    }
    if compression == "gzip":  # unset means none (the Python gRPC exporter refuses the word "none")
        env["OTEL_EXPORTER_OTLP_COMPRESSION"] = "gzip"
    if protocol == "grpc":
        env["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    return env


def rows(echo: Echo, node: str) -> dict[str, tuple[Any, ...]]:
    sql = (
        "SELECT metric_name, signal, cluster_id, rank, nranks, value_double, value_int, timestamp_ns, "
        f"attrs_json FROM events WHERE node_id = '{node}' ORDER BY metric_name"
    )
    got = echo.reader.query(sql).rows
    assert len({r[0] for r in got}) == len(got), f"each name once: {[r[0] for r in got]}"
    return {str(r[0]): (*r[1:8], json.loads(str(r[8]))) for r in got}


def exponential_counts(values: list[float], scale: int, offset: int, n: int) -> list[int]:
    """Bucket counts the OTLP exponential-histogram mapping gives ``values`` (index i covers
    (base^(offset+i), base^(offset+i+1)], base = 2^(2^-scale))."""
    counts = [0] * n
    for v in values:
        counts[math.ceil(math.log2(v) * 2**scale) - 1 - offset] += 1
    return counts


def check_stored(echo: Echo, client: str, node: str, t0_ns: int, started_ns: int) -> None:
    got = rows(echo, node)
    assert set(got) == {"interop.requests", "interop.latency", "interop.size", "interop.temperature",
                        "interop.step", "rank 99 is late"}  # fmt: skip
    scope = {keys.SCOPE_NAME: f"interop-{client}", keys.SCOPE_VERSION: "1.0.0"}
    for _signal, cluster, rank, nranks, *_, attrs in got.values():
        assert (cluster, rank, nranks) == ("interop", 3, 8)
        assert {k: attrs[k] for k in scope} == scope

    signal, *_, vd, vi, ts, attrs = got["interop.requests"]
    assert (signal, vd if vd is not None else vi) == ("metric", 5)
    assert started_ns <= ts <= time.time_ns() and 0 < attrs[keys.METRIC_START_NS] <= ts
    assert {k: attrs[k] for k in (keys.METRIC_KIND, keys.METRIC_UNIT, keys.METRIC_DESCRIPTION,
                                   keys.METRIC_TEMPORALITY, keys.METRIC_MONOTONIC, "route")} == {
        keys.METRIC_KIND: "sum", keys.METRIC_UNIT: "{request}", keys.METRIC_DESCRIPTION: "requests served",
        keys.METRIC_TEMPORALITY: "cumulative", keys.METRIC_MONOTONIC: True, "route": "a",
    }  # fmt: skip

    *_, vd, vi, _, attrs = got["interop.latency"]
    assert (vd, vi) == (40.0, 3)
    assert (attrs[keys.METRIC_KIND], attrs[keys.METRIC_UNIT], attrs[keys.METRIC_DESCRIPTION]) == (
        "histogram",
        "ms",
        "step latency",
    )
    assert attrs[keys.HIST_BOUNDS] == LATENCY_BOUNDS
    assert attrs[keys.HIST_BUCKET_COUNTS] == [0, 1, 1, 0, 1] + [0] * 11
    assert (attrs[keys.HIST_MIN], attrs[keys.HIST_MAX]) == (2.0, 30.0)

    *_, vd, vi, _, attrs = got["interop.size"]
    assert (vd, vi, attrs[keys.METRIC_KIND], attrs[keys.METRIC_UNIT]) == (
        7.0,
        3,
        "exponential_histogram",
        "By",
    )
    positive, scale = attrs[keys.HIST_POSITIVE], attrs[keys.HIST_SCALE]
    n = len(positive["bucket_counts"])
    assert positive["bucket_counts"] == exponential_counts([1, 2, 4], scale, positive["offset"], n)
    assert attrs[keys.HIST_ZERO_COUNT] == 0 and sum(attrs[keys.HIST_NEGATIVE].get("bucket_counts", [])) == 0

    *_, vd, vi, _, attrs = got["interop.temperature"]
    assert (vd, vi, attrs[keys.METRIC_UNIT], attrs["gpu"]) == (41.5, None, "Cel", 0)
    assert keys.METRIC_KIND not in attrs  # a gauge

    signal, *_, vd, _, ts, attrs = got["interop.step"]
    assert (signal, ts, vd) == ("span", t0_ns, 3.0)
    assert attrs[keys.SPAN_END_NS] == t0_ns + 3_000_000 and attrs["step"] == 7
    assert (attrs[keys.SPAN_STATUS], attrs[keys.SPAN_STATUS_MESSAGE]) == (2, "peer 5 timed out")
    assert attrs[keys.SPAN_EVENTS] == [
        {"time_ns": t0_ns + 1_000_000, "name": "enqueued", "attributes": {"queue": 2}}
    ]
    [link] = attrs[keys.SPAN_LINKS]
    assert (link["trace_id"], link["span_id"], link["attributes"]) == (
        "0af7651916cd43dd8448eb211c80319c",
        "b7ad6b7169203331",
        {"why": "retry"},
    )

    signal, _, rank, _, vd, vi, ts, attrs = got["rank 99 is late"]
    assert (signal, rank, ts, vd, vi) == ("log", 3, t0_ns + 5_000_000, None, None)  # the resource's rank
    assert (attrs["rank"], attrs[keys.LOG_BODY]) == (99, "rank 99 is late")  # the record's, kept
    assert (attrs[keys.SEVERITY_TEXT], attrs[keys.SEVERITY_NUMBER]) == ("WARN", 13)


@pytest.mark.parametrize(("client", "protocol", "compression"), CASES)
def test_sdk_exports_are_stored_exactly(
    echo_inproc: Echo, client: str, protocol: str, compression: str
) -> None:
    command = [system_node(), JS_EXPORT] if client == "js" else PYTHON_EXPORT
    node = f"{client}-{protocol.replace('/', '-')}-{compression}"
    t0_ms = time.time_ns() // 10**6 - 60_000
    started_ns = time.time_ns()
    done = run_client(command, client_env(echo_inproc, protocol, compression, node, t0_ms))
    assert done.returncode == 0, done.stderr
    check_stored(echo_inproc, client, node, t0_ms * 10**6, started_ns)
    snapshot = echo_inproc.stats.snapshot()
    assert snapshot.attribute_conflicts == {"rank": 1}
    assert set(snapshot.requests) == {"ok"} and not snapshot.rejected
