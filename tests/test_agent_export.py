"""Export and spool: a scripted in-process OTLP collector, real gRPC on 127.0.0.1, real files."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from echo_helpers import ScriptedCollector, scripted_collector
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from rankecho.agent.export import ExportConfig, Exporter, backoff_s, encode_batch, retryable
from rankecho.agent.spool import Spool
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point


@pytest.fixture
def collector() -> Iterator[tuple[ScriptedCollector, str]]:
    with scripted_collector() as served:
        yield served


def points(n: int, start: int = 0) -> list[tuple[Any, Point]]:
    return [((1, 2), Point(c.M_CUDA_SYNC, 10**18 + i, 1.5, {c.EVENT_ID: f"e{i}"}))
            for i in range(start, start + n)]


def batch(n: int, start: int = 0) -> Any:
    return encode_batch({(1, 2): {c.RANK: 3}}, points(n, start), {c.NODE_NAME: "n1"})


def wait_for(cond: Any, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_encode_batch_puts_each_process_in_its_own_resource() -> None:
    items = [*points(2), (None, Point(c.M_AGENT_DROPS, 1, 0))]
    enc = encode_batch({(1, 2): {c.RANK: 3}}, items, {c.NODE_NAME: "n1"})
    req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(enc.data)
    assert enc.points == 3 and len(req.resource_metrics) == 2
    keys = [{kv.key for kv in rm.resource.attributes} for rm in req.resource_metrics]
    assert keys == [{c.NODE_NAME, c.RANK}, {c.NODE_NAME}]


def test_backoff_and_retry_decisions() -> None:
    assert [backoff_s(a, 0.5, 5.0, rand=lambda: 0.5) for a in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff_s(0, 1.0, 5.0, rand=lambda: 0.0) == pytest.approx(0.8)
    assert backoff_s(0, 1.0, 5.0, rand=lambda: 1.0) == pytest.approx(1.2)
    # The OTLP spec's rules (shared.retry): auth and internal errors are final, RESOURCE_EXHAUSTED is
    # retried only when Echo says when.
    assert retryable(grpc.StatusCode.UNAVAILABLE) and retryable(None)
    finals = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL)
    for final in finals:
        assert not retryable(final)
    assert not retryable(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert retryable(grpc.StatusCode.RESOURCE_EXHAUSTED, 1.0)


def test_token_and_delivery(collector: tuple[ScriptedCollector, str], tmp_path: Path) -> None:
    col, address = collector
    exp = Exporter(ExportConfig(address, token="s3cret"), Spool(tmp_path))
    exp.start()
    exp.submit(batch(5))
    wait_for(lambda: len(col.received) == 1)
    exp.close(2)
    assert col.metadata[0]["authorization"] == "Bearer s3cret"
    assert col.event_ids() == [f"e{i}" for i in range(5)]


def test_unreachable_echo_spools_then_replays_everything(
    collector: tuple[ScriptedCollector, str], tmp_path: Path
) -> None:
    col, address = collector
    col.script = [grpc.StatusCode.UNAVAILABLE] * 3
    spool = Spool(tmp_path, max_bytes=1 << 20)
    exp = Exporter(ExportConfig(address, backoff_base_s=0.05, backoff_max_s=0.2), spool)
    exp.start()
    for i in range(4):
        exp.submit(batch(10, start=10 * i))
    wait_for(lambda: len(col.event_ids()) == 40)
    exp.close(2)
    assert sorted(col.event_ids()) == sorted(f"e{i}" for i in range(40))
    assert len(spool) == 0


def test_permanent_rejection_is_not_retried(collector: tuple[ScriptedCollector, str], tmp_path: Path) -> None:
    col, address = collector
    col.script = [grpc.StatusCode.INVALID_ARGUMENT]
    exp = Exporter(ExportConfig(address), Spool(tmp_path))
    exp.start()
    exp.submit(batch(3))
    exp.submit(batch(2, start=3))
    wait_for(lambda: len(col.received) == 1)
    exp.close(2)
    assert exp.rejected_points == 3 and col.event_ids() == ["e3", "e4"]


def test_wrong_token_is_final_and_says_the_fix(
    collector: tuple[ScriptedCollector, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    col, address = collector
    col.script = [grpc.StatusCode.UNAUTHENTICATED] * 2
    spool = Spool(tmp_path)
    exp = Exporter(ExportConfig(address, token="wrong", backoff_base_s=0.01), spool)
    exp.start()
    exp.submit(batch(3))
    exp.submit(batch(2, start=3))
    wait_for(lambda: exp.rejected_points == 5)
    exp.close(1)
    assert col.calls == 2 and col.event_ids() == [] and len(spool) == 0  # no resend, nothing spooled
    assert "RANKECHO_TOKEN or --token-file" in caplog.text


def test_echo_retry_info_delay_is_honoured(tmp_path: Path) -> None:
    # The policy alone would resend after ~10 ms; Echo asks for 400 ms and the agent waits that long.
    with scripted_collector([grpc.StatusCode.UNAVAILABLE], retry_after_s=0.4) as (col, address):
        exp = Exporter(ExportConfig(address, backoff_base_s=0.01, backoff_max_s=0.01), Spool(tmp_path))
        exp.start()
        exp.submit(batch(4))
        wait_for(lambda: len(col.event_ids()) == 4)
        exp.close(1)
    assert col.calls == 2
    assert col.call_times[1] - col.call_times[0] >= 0.4


def test_close_leaves_undeliverable_batches_in_the_spool_for_the_next_run(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    exp = Exporter(ExportConfig("127.0.0.1:1", timeout_s=0.5), spool)  # nothing listens there
    exp.start()
    exp.submit(batch(7))
    exp.close(1)
    assert spool.points == 7
    spool.close()
    nxt = Spool(tmp_path)  # a later run adopts what the previous one left
    assert nxt.points == 7 and len(list(tmp_path.iterdir())) == 1


def test_spool_bound_drops_oldest_and_counts_them(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=2500)
    for i in range(5):
        spool.put(bytes(1000), points=10 + i)
    assert spool.size_bytes <= 2500 and len(spool) == 2
    assert spool.dropped_points == 10 + 11 + 12
    oldest = spool.oldest()
    assert oldest is not None and oldest.points == 13
    spool.remove(oldest)
    assert spool.points == 14


def test_spool_of_a_live_run_is_not_adopted(tmp_path: Path) -> None:
    first = Spool(tmp_path)
    first.put(b"x", 1)
    second = Spool(tmp_path)
    assert len(second) == 0  # the first run still holds its lock
    first.close()
    assert second.adopt_orphans() == 1 and second.points == 1
    second.close()
