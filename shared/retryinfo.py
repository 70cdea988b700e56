"""``google.rpc.RetryInfo`` on the gRPC wire, both directions in one place: the trailers Echo sends with
"retry later" and the delay a producer reads back from them.

Clients differ in where they look: ``grpc_status``-style clients unpack the rich status in
``grpc-status-details-bin``, while the OpenTelemetry Python exporter reads only the
``google.rpc.retryinfo-bin`` trailer. Echo sends both, so every OTLP exporter waits as long as Echo asks.

Usage::

    context.set_trailing_metadata(retry_trailers(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", 1.0))
    retry_delay_from(error.trailing_metadata())   # -> 1.0
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

RETRY_INFO_KEY = "google.rpc.retryinfo-bin"
STATUS_DETAILS_KEY = "grpc-status-details-bin"


def retry_trailers(code: grpc.StatusCode, message: str, seconds: float) -> list[tuple[str, bytes]]:
    """Trailing metadata asking the producer to retry after ``seconds``, under both keys clients read."""
    delay = duration_pb2.Duration(seconds=int(seconds), nanos=min(round((seconds % 1) * 1e9), 999_999_999))
    info = error_details_pb2.RetryInfo(retry_delay=delay)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    return [(STATUS_DETAILS_KEY, status.SerializeToString()), (RETRY_INFO_KEY, info.SerializeToString())]


def retry_delay_from(trailing_metadata: Iterable[tuple[str, str | bytes]] | None) -> float | None:
    """The delay a server asked for, from ``google.rpc.retryinfo-bin`` or a RetryInfo inside
    ``grpc-status-details-bin``; None when it gave none or it cannot be parsed."""
    for key, value in trailing_metadata or ():
        if not isinstance(value, bytes):
            continue
        try:
            if key == RETRY_INFO_KEY:
                return _seconds(error_details_pb2.RetryInfo.FromString(value))
            if key == STATUS_DETAILS_KEY:
                for detail in status_pb2.Status.FromString(value).details:
                    info = error_details_pb2.RetryInfo()
                    if detail.Unpack(info):
                        return _seconds(info)
        except Exception:  # a malformed hint must not stop the retry itself
            return None
    return None


def _seconds(info: error_details_pb2.RetryInfo) -> float:
    return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
