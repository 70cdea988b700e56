"""A full write queue answers "retry later" (gRPC RESOURCE_EXHAUSTED + RetryInfo, HTTP 429 +
Retry-After) instead of growing memory, and a retry after the queue drains loses nothing. The
OpenTelemetry SDK's own gRPC exporter waits as long as Echo asks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import local_settings
from echo_helpers import TEST_TOKEN, grpc_export, http_post, node_request, wait_until
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import MetricExportResult
from test_echo_interop import sdk_metrics

from rankecho.echo.app import Echo
from rankecho.shared.retryinfo import RETRY_INFO_KEY, STATUS_DETAILS_KEY, retry_delay_from


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[Echo]:
    with Echo(local_settings(tmp_path / "echo.db", queue_rows=100, retry_after_s=2.0)) as started:
        yield started


def retry_delays_s(error: grpc.RpcError) -> dict[str, float | None]:
    """The delay under each trailer key clients read (both must be there)."""
    trailers = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
    return {
        key: retry_delay_from([(key, trailers.get(key, b""))]) for key in (STATUS_DETAILS_KEY, RETRY_INFO_KEY)
    }


def test_full_queue_says_retry_later_and_nothing_is_lost(echo: Echo) -> None:
    first = node_request("first", 80)
    second = node_request("second", 80)
    acked: list[str] = []
    with echo.writer.hold():
        waiting = threading.Thread(
            target=lambda: (grpc_export(echo.grpc_address or "", first, TEST_TOKEN), acked.append("first"))
        )
        waiting.start()
        wait_until(lambda: echo.writer.queued_rows >= 80, "the first request to be queued", timeout_s=10)
        with pytest.raises(grpc.RpcError) as info:
            grpc_export(echo.grpc_address or "", second, TEST_TOKEN)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert retry_delays_s(info.value) == {STATUS_DETAILS_KEY: 2.0, RETRY_INFO_KEY: 2.0}
        response = http_post(echo.http_address or "", "metrics", second.SerializeToString(), TEST_TOKEN)
        assert response.status_code == 429 and response.headers["Retry-After"] == "2"
        assert acked == []  # not acknowledged while not committed
    waiting.join(10)
    assert acked == ["first"]
    grpc_export(echo.grpc_address or "", second, TEST_TOKEN)  # the producer's retry
    rows = echo.reader.query("SELECT node_id, count(*) FROM events GROUP BY 1 ORDER BY 1").rows
    assert rows == [("first", 80), ("second", 80)]
    snapshot = echo.stats.snapshot()
    assert snapshot.rejected["queue_full"] == 2 and snapshot.queue_rows == 0


def test_otel_sdk_exporter_waits_as_long_as_echo_asks(tmp_path: Path) -> None:
    """The SDK exporter reads the delay only from ``google.rpc.retryinfo-bin``; its own backoff would be
    0.8-1.2 s, then 1.6-2.4 s (so its third attempt comes 2.4 s or more after the first). With Echo's
    0.4 s the third attempt comes after ~0.8 s; the hold then ends and the next retry is stored."""
    delay = 0.4
    with Echo(local_settings(tmp_path / "echo.db", queue_rows=100, retry_after_s=delay)) as echo:
        exporter = OTLPMetricExporter(
            endpoint=echo.grpc_address, insecure=True, headers={"authorization": f"Bearer {TEST_TOKEN}"},
            timeout=20,
        )  # fmt: skip
        stamps = [time.time_ns() - 1000 * k for k in range(40)]
        results: list[MetricExportResult] = []
        rejected = lambda: echo.stats.snapshot().rejected.get("queue_full", 0)  # noqa: E731
        try:
            with echo.writer.hold():
                filler = threading.Thread(
                    target=grpc_export, args=(echo.grpc_address or "", node_request("first", 80), TEST_TOKEN)
                )
                filler.start()
                wait_until(lambda: echo.writer.queued_rows >= 80, "the filler to be queued", timeout_s=10)
                started = time.monotonic()
                sending = threading.Thread(
                    target=lambda: results.append(exporter.export(sdk_metrics("sdk", stamps)))
                )
                sending.start()
                while rejected() < 3:  # 80 queued + 40 > 100: refused until the hold ends
                    assert time.monotonic() - started < 10, "the exporter stopped retrying"
                    time.sleep(0.005)
                third_attempt_s = time.monotonic() - started
            sending.join(20)
            filler.join(10)
        finally:
            exporter.shutdown()
        assert 2 * delay <= third_attempt_s < 2.4, third_attempt_s
        assert results == [MetricExportResult.SUCCESS]
        rows = echo.reader.query("SELECT node_id, count(*) FROM events GROUP BY 1 ORDER BY 1").rows
        assert rows == [("first", 80), ("sdk", 40)]
        got = echo.reader.query("SELECT timestamp_ns FROM events WHERE node_id = 'sdk'").rows
        assert sorted(r[0] for r in got) == sorted(stamps)
