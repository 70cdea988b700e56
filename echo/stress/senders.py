"""Transports for the stress producers: ``raw`` (prebuilt bytes on a grpc channel) and ``sdk``
(OpenTelemetry's ``OTLPMetricExporter``). Each ``send`` makes one attempt and reports the outcome;
the retry loop lives in :mod:`echo.stress.runner`, the retry decision in :mod:`echo.stress.retry`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from echo.retryinfo import retry_delay_from
from echo.stress import encode
from echo.stress.planting import StressEvent, StressPlan
from echo.stress.retry import RETRYABLE

EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Target:
    """Where and how to connect: ``host:port``, bearer token (None: send none), plaintext or TLS."""

    endpoint: str
    token: str | None = None
    insecure: bool = True
    ca_file: str | None = None

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials (system roots, or ``ca_file``); None for plaintext."""
        if self.insecure:
            return None
        root = Path(self.ca_file).read_bytes() if self.ca_file else None
        return grpc.ssl_channel_credentials(root)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        # gRPC metadata keys must be lower case: "Authorization" breaks the call.
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


@dataclass(frozen=True)
class Outcome:
    """One attempt's result. ``rejected`` counts points Echo refused for good (partial success)."""

    ok: bool
    rejected: int = 0
    code: grpc.StatusCode | None = None
    server_delay_s: float | None = None
    message: str = ""


class Sender(Protocol):
    def encode(self, plan: StressPlan, producer: int, events: Sequence[StressEvent]) -> object: ...

    def send(self, payload: object, timeout_s: float) -> Outcome: ...

    def close(self) -> None: ...


CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect within ~1 s of Echo coming back (gRPC's default backoff grows to minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def _channel(target: Target) -> grpc.Channel:
    options = list(CHANNEL_OPTIONS)
    credentials = target.credentials()
    if credentials is None:
        return grpc.insecure_channel(target.endpoint, options=options)
    return grpc.secure_channel(target.endpoint, credentials, options=options)


class RawSender:
    """Sends already-serialized ``ExportMetricsServiceRequest`` bytes: no per-send encoding cost."""

    def __init__(self, target: Target) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

        self._target = target
        self._channel = _channel(target)
        self._export = self._channel.unary_unary(
            EXPORT_METHOD,
            request_serializer=None,
            response_deserializer=ExportMetricsServiceResponse.FromString,
        )

    def encode(self, plan: StressPlan, producer: int, events: Sequence[StressEvent]) -> object:
        return encode.raw_request(plan, producer, events)

    def send(self, payload: object, timeout_s: float) -> Outcome:
        try:
            response = self._export(payload, timeout=timeout_s, metadata=self._target.metadata())
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else None
            trailing = err.trailing_metadata() if isinstance(err, grpc.Call) else None
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            return Outcome(False, code=code, server_delay_s=retry_delay_from(trailing), message=details or "")
        rejected = int(response.partial_success.rejected_data_points)
        return Outcome(True, rejected=rejected, message=response.partial_success.error_message)

    def close(self) -> None:
        self._channel.close()


class _LastCode(logging.Filter):
    """Captures the status code the OTel exporter logs when it gives up (export() returns only
    SUCCESS/FAILURE), per thread, and keeps the exporter's own retry chatter off stderr.

    It must be the logger's first filter: the exporter adds a ``DuplicateFilter`` that drops a record
    identical to the previous one within 20 s, so a second batch refused for the same reason would
    reach no later filter, its code would read as unknown, and a final refusal (UNAUTHENTICATED)
    would be resent. :func:`_capture_exporter_codes` puts it first after the exporter is imported."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        for arg in record.args if isinstance(record.args, tuple) else ():
            if isinstance(arg, grpc.StatusCode):
                self.local.code = arg
        return False


EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.grpc.exporter"
_EXPORTER_LOG = _LastCode()
_FILTERS_LOCK = threading.Lock()


def _capture_exporter_codes() -> None:
    """Make :data:`_EXPORTER_LOG` the exporter logger's first filter (whatever was imported first)."""
    logger = logging.getLogger(EXPORTER_LOGGER)
    with _FILTERS_LOCK:
        if logger.filters[:1] != [_EXPORTER_LOG]:
            logger.removeFilter(_EXPORTER_LOG)
            logger.filters.insert(0, _EXPORTER_LOG)


class SdkSender:
    """Sends through ``OTLPMetricExporter.export()``: the exporter's own channel, auth header,
    retry of transient codes and RetryInfo handling, within ``exporter_timeout_s`` per call."""

    def __init__(self, target: Target, exporter_timeout_s: float = 5.0) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        _capture_exporter_codes()  # the import above may just have added the exporter's own filter
        self._exporter = OTLPMetricExporter(
            endpoint=target.endpoint,
            insecure=target.insecure,
            credentials=target.credentials(),
            headers=dict(target.metadata()),
            timeout=exporter_timeout_s,
            channel_options=CHANNEL_OPTIONS,  # type: ignore[arg-type]
        )

    def encode(self, plan: StressPlan, producer: int, events: Sequence[StressEvent]) -> object:
        return encode.sdk_metrics(plan, producer, events)

    def send(self, payload: object, timeout_s: float) -> Outcome:
        from opentelemetry.sdk.metrics.export import MetricExportResult

        _EXPORTER_LOG.local.code = None
        result = self._exporter.export(payload, timeout_millis=timeout_s * 1000)  # type: ignore[arg-type]
        if result is MetricExportResult.SUCCESS:
            return Outcome(True)
        code = _EXPORTER_LOG.local.code
        message = f"exporter gave up ({code.name if code else 'no status'})"
        if code in RETRYABLE:  # it already retried a transient code until its timeout: resend later
            return Outcome(False, code=None, message=message)
        return Outcome(False, code=code, message=message)

    def close(self) -> None:
        self._exporter.shutdown(timeout_millis=1000)


def make_sender(client: str, target: Target) -> Sender:
    if client == "raw":
        return RawSender(target)
    if client == "sdk":
        return SdkSender(target)
    raise ValueError(f"unknown client {client!r}: use 'raw' or 'sdk'")
