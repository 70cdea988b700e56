"""Transports for the stress producers: ``raw`` (prebuilt bytes through :mod:`rankecho.shared.transport`, the
client the agent uses too) and ``sdk`` (OpenTelemetry's ``OTLPMetricExporter``). Each ``send`` makes one
attempt and reports the outcome; the retry loop lives in :mod:`rankecho.stress.runner`, the retry decision
in :mod:`rankecho.shared.retry`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol, cast

import grpc

from rankecho.shared.retry import RETRYABLE
from rankecho.shared.transport import CHANNEL_OPTIONS, MetricsClient, Outcome, Target
from rankecho.stress import encode
from rankecho.stress.planting import StressEvent, StressPlan

__all__ = ["Outcome", "RawSender", "SdkSender", "Sender", "Target", "make_sender"]


class Sender(Protocol):
    def encode(self, plan: StressPlan, producer: int, events: Sequence[StressEvent]) -> object: ...

    def send(self, payload: object, timeout_s: float) -> Outcome: ...

    def close(self) -> None: ...


class RawSender:
    """Sends already-serialized ``ExportMetricsServiceRequest`` bytes through rankecho's one OTLP client
    (:class:`rankecho.shared.transport.MetricsClient`): no per-send encoding cost."""

    def __init__(self, target: Target) -> None:
        self._client = MetricsClient(target)

    def encode(self, plan: StressPlan, producer: int, events: Sequence[StressEvent]) -> object:
        return encode.raw_request(plan, producer, events)

    def send(self, payload: object, timeout_s: float) -> Outcome:
        return self._client.export(cast(bytes, payload), timeout_s)

    def close(self) -> None:
        self._client.close()


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
