"""A full write queue answers "retry later" (gRPC RESOURCE_EXHAUSTED + RetryInfo, HTTP 429 +
Retry-After) instead of growing memory, and a retry after the queue drains loses nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import local_settings
from echo_helpers import TEST_TOKEN, grpc_export, http_post, node_request
from google.rpc import error_details_pb2, status_pb2

from echo.app import Echo


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[Echo]:
    with Echo(local_settings(tmp_path / "echo.db", queue_rows=100, retry_after_s=2.0)) as started:
        yield started


def retry_delay_s(error: grpc.RpcError) -> float:
    trailer = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]  # type: ignore[attr-defined]
    status = status_pb2.Status.FromString(trailer)
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info)
    return info.retry_delay.seconds + info.retry_delay.nanos / 1e9


def test_full_queue_says_retry_later_and_nothing_is_lost(echo: Echo) -> None:
    first = node_request("first", 80)
    second = node_request("second", 80)
    acked: list[str] = []
    with echo.writer.hold():
        waiting = threading.Thread(
            target=lambda: (grpc_export(echo.grpc_address or "", first, TEST_TOKEN), acked.append("first"))
        )
        waiting.start()
        while echo.writer.queued_rows < 80:
            waiting.join(0.01)
        with pytest.raises(grpc.RpcError) as info:
            grpc_export(echo.grpc_address or "", second, TEST_TOKEN)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert retry_delay_s(info.value) == 2.0
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
