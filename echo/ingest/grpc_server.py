"""OTLP/gRPC receiver: the Metrics, Trace and Logs ``Export`` RPCs as thin adapters over :class:`Ingest`.

Requests arrive as raw bytes (no gRPC-side deserializer), so malformed protobuf is answered with
INVALID_ARGUMENT and a reason instead of an opaque INTERNAL. "Queue full" is RESOURCE_EXHAUSTED with Echo's
delay as a ``google.rpc.RetryInfo`` in both trailers clients read (see :mod:`shared.retryinfo`); without
the ``google.rpc.retryinfo-bin`` one the OpenTelemetry exporter would back off 1, 2, 4... s instead.
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Any

import grpc

from rankecho.echo.ingest.auth import UNAUTHENTICATED_MESSAGE, TokenCheck
from rankecho.echo.ingest.service import (
    BUSY,
    INVALID,
    SIGNALS,
    TOO_LARGE,
    UNAVAILABLE,
    Ingest,
    IngestError,
    Signal,
)
from rankecho.echo.settings import HostPort
from rankecho.shared.retryinfo import retry_trailers

log = logging.getLogger(__name__)

SERVICES = {
    "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService",
    "traces": "opentelemetry.proto.collector.trace.v1.TraceService",
    "logs": "opentelemetry.proto.collector.logs.v1.LogsService",
}
_CODES = {
    INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    BUSY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}


def _handler(ingest: Ingest, auth: TokenCheck, signal: Signal) -> Any:
    def export(body: bytes, context: grpc.ServicerContext) -> bytes:
        if auth.enabled:
            header = next((v for k, v in context.invocation_metadata() if k == "authorization"), None)
            if not auth.allows(header):
                ingest.reject_request("unauthenticated")
                context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
        try:
            request = ingest.parse(signal, body)
            return ingest.export(signal, request).SerializeToString()
        except IngestError as exc:
            code = _CODES.get(exc.kind, grpc.StatusCode.INTERNAL)
            if exc.retry_after_s is not None:
                context.set_trailing_metadata(retry_trailers(code, str(exc), exc.retry_after_s))
            context.abort(code, str(exc))
        raise AssertionError("unreachable: context.abort raises")

    return grpc.unary_unary_rpc_method_handler(export)


def start_grpc(
    ingest: Ingest, auth: TokenCheck, where: HostPort, tls: tuple[bytes, bytes] | None, workers: int
) -> tuple[grpc.Server, int]:
    """Start the server; returns it and the bound port (``where.port`` may be 0)."""
    limit = ingest.settings.max_message_bytes * 2  # past our own counted check, gRPC refuses by itself
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
        options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)],
    )
    for name, service in SERVICES.items():
        handlers = {"Export": _handler(ingest, auth, SIGNALS[name])}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    address = str(where)
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, grpc.ssl_server_credentials([(tls[1], tls[0])]))
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {address}: port in use, or not a local address: "
                      "stop the process holding it or choose another --otlp-grpc")  # fmt: skip
    server.start()
    return server, port
