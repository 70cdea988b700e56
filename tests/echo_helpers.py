"""Small clients for Echo tests: send OTLP over gRPC or HTTP and read the store back."""

from __future__ import annotations

import time
from typing import Any

import grpc
import httpx
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from shared import contract as c
from shared.otlp import Point, metrics_request

TEST_TOKEN = "test-token-0123456789"

_STUBS = {
    "metrics": metrics_service_pb2_grpc.MetricsServiceStub,
    "traces": trace_service_pb2_grpc.TraceServiceStub,
    "logs": logs_service_pb2_grpc.LogsServiceStub,
}


def grpc_export(address: str, request: Message, token: str | None, signal: str = "metrics") -> Any:
    """One Export RPC; returns the response or raises ``grpc.RpcError``."""
    metadata = [("authorization", f"Bearer {token}")] if token is not None else []
    with grpc.insecure_channel(address) as channel:
        stub = _STUBS[signal](channel)
        return stub.Export(request, metadata=metadata, timeout=30)


def http_post(
    address: str, signal: str, body: bytes, token: str | None, content_type: str = "application/x-protobuf",
    **headers: str,
) -> httpx.Response:  # fmt: skip
    all_headers = {"Content-Type": content_type, **headers}
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    return httpx.post(f"http://{address}/v1/{signal}", content=body, headers=all_headers, timeout=30)


def health_points(n: int, start_ns: int | None = None, **attrs: Any) -> list[Point]:
    """``n`` health-score points 1 us apart, every 4th a straggler (< 0.4)."""
    t0 = time.time_ns() if start_ns is None else start_ns
    return [Point(c.M_HEALTH, t0 + i * 1000, 0.2 if i % 4 == 0 else 0.9, dict(attrs)) for i in range(n)]


def node_request(node: str, n: int, cluster: str = "c1", **attrs: Any) -> Message:
    return metrics_request({"cluster_id": cluster, "node_id": node}, health_points(n, **attrs))
