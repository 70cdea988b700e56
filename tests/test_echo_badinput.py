"""Hostile and broken input: each class is refused or stored safely, counted by reason, explained, and
never costs Echo or the other producers anything (a good request still lands afterwards)."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import local_settings
from echo_helpers import TEST_TOKEN, count, grpc_export, http_post, node_request
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList

from rankecho.echo.app import Echo
from rankecho.echo.ingest import keys
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request

METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
SMALL_LIMIT = 64 * 1024


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[Echo]:
    with Echo(local_settings(tmp_path / "echo.db", max_message_bytes=SMALL_LIMIT)) as started:
        yield started


def raw_grpc(echo: Echo, body: bytes) -> grpc.RpcError:
    with grpc.insecure_channel(echo.grpc_address or "") as channel:
        call = channel.unary_unary(METRICS_EXPORT)
        with pytest.raises(grpc.RpcError) as info:
            call(body, metadata=[("authorization", f"Bearer {TEST_TOKEN}")], timeout=10)
    return info.value


def still_serves(echo: Echo) -> None:
    before = count(echo)
    grpc_export(echo.grpc_address or "", node_request("good", 10), TEST_TOKEN)
    assert count(echo) == before + 10


def invalid_utf8_request() -> bytes:
    body = node_request("node-\x01", 3).SerializeToString()
    return body.replace(b"node-\x01", b"node-\xff")


@pytest.mark.parametrize(
    ("body", "reason"),
    [(b"\xff\xff\xff\xff", "malformed"), (invalid_utf8_request(), "malformed"), (b"\x0a" * 10, "malformed")],
)
def test_grpc_malformed_protobuf_is_invalid_argument(echo: Echo, body: bytes, reason: str) -> None:
    error = raw_grpc(echo, body)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed OTLP metrics protobuf" in (error.details() or "")
    assert echo.stats.snapshot().rejected[reason] == 1
    still_serves(echo)


def test_http_malformed_bodies_are_400_with_the_reason(echo: Echo) -> None:
    address = echo.http_address or ""
    cases = [
        (b"\xff\xff\xff", "application/x-protobuf", "malformed OTLP"),
        (invalid_utf8_request(), "application/x-protobuf", "malformed OTLP"),
        (b"{not json", "application/json", "not JSON"),
        (b'{"resourceMetrics": "\xff"}', "application/json", "UTF-8"),
        (b'{"resourceMetrics": [{"bogus": 1, "scopeMetrics": 3}]}', "application/json", "not an OTLP/JSON"),
        (b"[1]", "application/json", "JSON object"),
    ]
    for body, ctype, why in cases:
        response = http_post(address, "metrics", body, TEST_TOKEN, content_type=ctype)
        assert response.status_code == 400, (body, response.text)
        assert why in (response.json()["message"] if ctype == "application/json" else response.text)
    assert http_post(address, "metrics", b"x", TEST_TOKEN, content_type="text/plain").status_code == 415
    assert echo.stats.snapshot().rejected["malformed"] == len(cases)
    still_serves(echo)


def test_oversized_requests_are_refused_on_both_listeners(echo: Echo) -> None:
    big = node_request("n1", 5000)
    assert big.ByteSize() > SMALL_LIMIT
    with pytest.raises(grpc.RpcError) as info:
        grpc_export(echo.grpc_address or "", big, TEST_TOKEN)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-message-bytes" in (info.value.details() or "")
    address = echo.http_address or ""
    assert http_post(address, "metrics", big.SerializeToString(), TEST_TOKEN).status_code == 413
    bomb = gzip.compress(b"\x00" * (SMALL_LIMIT * 4))  # small on the wire, large once inflated
    response = http_post(address, "metrics", bomb, TEST_TOKEN, **{"Content-Encoding": "gzip"})
    assert response.status_code == 413
    assert echo.stats.snapshot().rejected["too_large"] == 3
    assert count(echo) == 0
    still_serves(echo)


def test_gzip_bodies_are_accepted(echo: Echo) -> None:
    body = gzip.compress(node_request("n1", 20).SerializeToString())
    response = http_post(echo.http_address or "", "metrics", body, TEST_TOKEN, **{"Content-Encoding": "gzip"})
    assert response.status_code == 200
    assert count(echo) == 20


def test_nan_and_inf_are_stored_as_null_with_the_sent_value_named(echo: Echo) -> None:
    now = time.time_ns()
    values = [float("nan"), float("inf"), float("-inf"), 0.5]
    points = [Point(c.M_HEALTH, now + i, v, {"label": v}) for i, v in enumerate(values)]
    grpc_export(echo.grpc_address or "", metrics_request({"node_id": "n"}, points), TEST_TOKEN)
    got = echo.reader.query("SELECT value_double, attrs_json FROM events ORDER BY timestamp_ns").rows
    assert [r[0] for r in got] == [None, None, None, 0.5]
    attrs = [json.loads(str(r[1])) for r in got]
    assert [a.get(keys.NONFINITE_VALUE) for a in attrs] == ["NaN", "Infinity", "-Infinity", None]
    assert [a["label"] for a in attrs] == ["NaN", "Infinity", "-Infinity", 0.5]  # valid JSON throughout
    assert echo.stats.snapshot().stored_with_fix["nonfinite_value"] == 3


def test_bad_timestamps_are_rejected_per_point_and_the_rest_stored(echo: Echo) -> None:
    now = time.time_ns()
    stamps = [0, int(time.time()), now + 10 * 86_400 * 10**9, now, now + 1]
    points = [Point(c.M_HEALTH, ts, 0.5) for ts in stamps]
    response = grpc_export(echo.grpc_address or "", metrics_request({"node_id": "n"}, points), TEST_TOKEN)
    assert response.partial_success.rejected_data_points == 3
    message = response.partial_success.error_message
    assert "nanoseconds" in message and "clock" in message
    assert count(echo) == 2
    rejected = echo.stats.snapshot().rejected
    assert (rejected["timestamp_zero"], rejected["timestamp_too_old"], rejected["timestamp_future"]) == (
        1,
        1,
        1,
    )


def test_thousands_of_attributes_are_capped_and_the_drop_recorded(echo: Echo) -> None:
    attrs = {f"k{i}": i for i in range(3000)}
    request = metrics_request({"node_id": "n"}, [Point(c.M_HEALTH, time.time_ns(), 0.5, attrs)])
    grpc_export(echo.grpc_address or "", request, TEST_TOKEN)
    stored = json.loads(str(echo.reader.query("SELECT attrs_json FROM events").rows[0][0]))
    kept = echo.settings.max_attributes
    assert stored[keys.DROPPED_ATTRIBUTES] == 3000 - kept
    sent = [key for key in stored if key not in keys.ECHO_KEYS]  # Echo's own keys are never dropped
    assert len(sent) == kept and stored["k0"] == 0 and stored[keys.SCOPE_NAME] == "rankecho"
    assert echo.stats.snapshot().stored_with_fix["too_many_attributes"] == 1


def nested(depth: int) -> AnyValue:
    value = AnyValue(string_value="leaf")
    for _ in range(depth):
        value = AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="d", value=value)]))
    return value


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field, encoded by hand (the library refuses to build a bomb)."""
    size, varint = len(payload), b""
    while True:
        byte, size = size & 0x7F, size >> 7
        varint += bytes([byte | (0x80 if size else 0)])
        if not size:
            break
    return bytes([number << 3 | 2]) + varint + payload


def nesting_bomb(depth: int) -> bytes:
    """A metrics request whose resource attribute nests ``depth`` kvlists (past the parser's limit)."""
    value = field(1, b"leaf")  # AnyValue.string_value
    for _ in range(depth):
        value = field(6, field(1, field(1, b"d") + field(2, value)))  # AnyValue.kvlist_value
    attribute = field(1, b"deep") + field(2, value)
    return field(1, field(1, field(1, attribute)))  # request.resource_metrics.resource.attributes


def test_deep_nesting_is_cut_and_protobuf_bombs_are_refused(echo: Echo) -> None:
    request = metrics_request({"node_id": "n"}, [Point(c.M_HEALTH, time.time_ns(), 0.5)])
    dp = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    dp.attributes.append(KeyValue(key="deep", value=nested(30)))
    grpc_export(echo.grpc_address or "", request, TEST_TOKEN)
    stored = str(echo.reader.query("SELECT attrs_json FROM events").rows[0][0])
    assert "nested deeper than" in stored and json.loads(stored)["deep"]["d"]
    error = raw_grpc(echo, nesting_bomb(1000))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    still_serves(echo)
