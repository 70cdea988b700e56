"""The one ingest path both edges call: parse -> decode -> enqueue -> wait for COMMIT -> response.

The gRPC servicer and the HTTP route only adapt transport details (status codes, headers, content
types) around :meth:`Ingest.export`. Failures raise :class:`IngestError`, whose ``kind`` each edge maps
to its own status and whose message says what to fix.

Usage::

    ingest = Ingest(settings, writer, stats)
    response = ingest.export("metrics", request_proto)   # returns after the rows are committed
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_svc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_svc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_svc

from rankecho.echo.ingest.logs import decode_logs
from rankecho.echo.ingest.metrics import decode_metrics
from rankecho.echo.ingest.rows import AttrResolver, RowBatch
from rankecho.echo.ingest.traces import decode_traces
from rankecho.echo.ops import Stats
from rankecho.echo.settings import Settings
from rankecho.echo.store.writer import DATA_ERRORS, QueueFullError, StoreError, Writer, WriterClosedError

# Edge-independent failure kinds (each edge maps them to a status code).
INVALID = "invalid"
TOO_LARGE = "too_large"
UNSUPPORTED = "unsupported"
BUSY = "busy"
UNAVAILABLE = "unavailable"
UNAUTHENTICATED = "unauthenticated"


class IngestError(Exception):
    def __init__(self, kind: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Signal:
    """One OTLP signal: its request/response types, decoder and partial-success field."""

    name: str
    row_signal: str
    request: type[Message]
    response: type[Message]
    decode: Callable[[Any, AttrResolver, RowBatch], None]
    rejected_field: str


SIGNALS: dict[str, Signal] = {
    "metrics": Signal(
        "metrics", "metric", metrics_svc.ExportMetricsServiceRequest,
        metrics_svc.ExportMetricsServiceResponse, decode_metrics, "rejected_data_points",
    ),
    "traces": Signal(
        "traces", "span", trace_svc.ExportTraceServiceRequest,
        trace_svc.ExportTraceServiceResponse, decode_traces, "rejected_spans",
    ),
    "logs": Signal(
        "logs", "log", logs_svc.ExportLogsServiceRequest,
        logs_svc.ExportLogsServiceResponse, decode_logs, "rejected_log_records",
    ),
}  # fmt: skip


class Ingest:
    """Shared by every receiver thread; holds no per-request state."""

    def __init__(self, settings: Settings, writer: Writer, stats: Stats) -> None:
        self.settings = settings
        self.writer = writer
        self.stats = stats
        self.resolver = AttrResolver(settings.max_attributes)
        self._decoding = threading.BoundedSemaphore(settings.decode_threads)
        """At most ``decode_threads`` requests decode at once (see :attr:`Settings.decode_threads`)."""

    def check_size(self, n_bytes: int) -> None:
        if n_bytes > self.settings.max_message_bytes:
            self.reject_request("too_large")
            raise IngestError(
                TOO_LARGE,
                f"request of {n_bytes} bytes exceeds Echo's limit of {self.settings.max_message_bytes} "
                "bytes: send smaller batches (or raise --max-message-bytes)",
            )

    def parse(self, signal: Signal, body: bytes) -> Message:
        """Protobuf bytes -> request message; malformed input (incl. invalid UTF-8) -> IngestError."""
        self.check_size(len(body))
        request = signal.request()
        try:
            request.ParseFromString(body)
        except (DecodeError, RecursionError, ValueError) as exc:
            self.reject_request("malformed")
            raise IngestError(INVALID, f"malformed OTLP {signal.name} protobuf ({exc}): send a valid "
                              f"{signal.request.DESCRIPTOR.full_name}") from None  # fmt: skip
        return request

    def reject_request(self, reason: str) -> None:
        """Count a whole request refused for ``reason`` (its events were never decoded or stored)."""
        self.stats.rejected(reason, what="request")
        self.stats.request(reason)

    def export(self, signal: Signal, request: Message) -> Message:
        """Decode, commit, and build the OTLP response (with partial success for refused points)."""
        now = time.time_ns()
        batch = RowBatch(now)
        batch.max_timestamp_ns = now + int(self.settings.max_future_skew_s * 1e9)
        try:
            with self._decoding:
                signal.decode(request, self.resolver, batch)
        except RecursionError:
            self.reject_request("too_deep")
            raise IngestError(INVALID, "attribute values nested too deeply: flatten them") from None
        self.stats.received(signal.row_signal, len(batch) + batch.rejected.total)
        for reason, n in batch.rejected.counts.items():
            self.stats.rejected(reason, n)
        self.stats.stored_with_fix(batch.stored_with_fix)
        self.stats.attribute_conflicts(batch.conflicts)
        self._commit(batch)
        response = signal.response()
        if batch.rejected.total:
            partial = response.partial_success  # type: ignore[attr-defined]
            setattr(partial, signal.rejected_field, batch.rejected.total)
            partial.error_message = batch.rejected.summary()
        self.stats.request("ok")
        return response

    def _commit(self, batch: RowBatch) -> None:
        try:
            future = self.writer.submit(batch.to_arrow())
        except QueueFullError as exc:
            self.reject_request("queue_full")
            raise IngestError(BUSY, str(exc), exc.retry_after_s) from None
        except WriterClosedError as exc:
            self.reject_request("shutting_down")
            raise IngestError(UNAVAILABLE, str(exc), self.settings.retry_after_s) from None
        try:
            future.result(timeout=self.settings.ack_timeout_s)
        except concurrent.futures.TimeoutError:
            self.reject_request("commit_timeout")
            raise IngestError(
                UNAVAILABLE,
                f"not committed within {self.settings.ack_timeout_s:g} s: retry (a resend is not duplicated)",
                self.settings.retry_after_s,
            ) from None
        except DATA_ERRORS as exc:  # this request's rows themselves: resending them cannot help
            self.reject_request("invalid_rows")
            raise IngestError(
                INVALID, f"rows refused by the store ({exc}): fix the data, do not resend"
            ) from None
        except StoreError as exc:  # the store's own trouble (disk full...): retryable, with the cause
            self.reject_request("store_failing")
            raise IngestError(
                UNAVAILABLE,
                f"Echo's store cannot commit ({exc}): retry later (a resend is not duplicated)",
                self.settings.retry_after_s,
            ) from None
        except Exception as exc:
            self.reject_request("commit_failed")
            raise IngestError(UNAVAILABLE, f"commit failed ({exc}): retry; if it persists check Echo's log",
                              self.settings.retry_after_s) from None  # fmt: skip
