"""Exports one known set of metrics, one span and one log record with the OpenTelemetry Python SDK,
configured only by the standard environment variables, as an application would be (the Python twin of
``otlp_export.mjs``):

    OTEL_EXPORTER_OTLP_PROTOCOL  grpc | http/protobuf   (picks the exporter package)
    OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_COMPRESSION,
    OTEL_EXPORTER_OTLP_INSECURE                          (read by the exporters themselves)

``INTEROP_NODE`` names the node and ``INTEROP_T0_MS`` the span/log time, so that
``tests/test_interop_otel.py`` can check the stored rows value by value. Exits 1 if an export fails.
"""

from __future__ import annotations

import importlib
import os
import sys

from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExportResult, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

PACKAGES = {"grpc": "grpc", "http/protobuf": "http"}
SCOPE = ("interop-py", "1.0.0")


def exporters() -> tuple[object, object, object]:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    base = f"opentelemetry.exporter.otlp.proto.{PACKAGES[protocol]}"
    metric = importlib.import_module(f"{base}.metric_exporter").OTLPMetricExporter()
    trace = importlib.import_module(f"{base}.trace_exporter").OTLPSpanExporter()
    logs = importlib.import_module(f"{base}._log_exporter").OTLPLogExporter()
    return metric, trace, logs


class Checked:
    """Wraps an exporter and remembers whether any export failed (the SDK only logs it)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.failed = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def export(self, *args: object, **kwargs: object) -> object:
        result = self.inner.export(*args, **kwargs)
        ok = (MetricExportResult.SUCCESS, SpanExportResult.SUCCESS, LogRecordExportResult.SUCCESS)
        if result not in ok:
            self.failed = True
        return result


def main() -> int:
    t0_ns = int(os.environ["INTEROP_T0_MS"]) * 10**6
    resource = Resource.create(
        {"k8s.cluster.name": "interop", "k8s.node.name": os.environ["INTEROP_NODE"],
         "rankecho.rank": 3, "rankecho.nranks": 8}
    )  # fmt: skip
    metric_exporter, span_exporter, log_exporter = (Checked(e) for e in exporters())

    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=600_000)
    size_view = View(instrument_name="interop.size", aggregation=ExponentialBucketHistogramAggregation())
    meters = MeterProvider(metric_readers=[reader], resource=resource, views=[size_view])
    meter = meters.get_meter(*SCOPE)
    requests = meter.create_counter("interop.requests", unit="{request}", description="requests served")
    requests.add(5, {"route": "a"})
    latency = meter.create_histogram("interop.latency", unit="ms", description="step latency")
    for v in (2, 8, 30):
        latency.record(v)
    size = meter.create_histogram("interop.size", unit="By")
    for v in (1, 2, 4):
        size.record(v)
    meter.create_gauge("interop.temperature", unit="Cel").set(41.5, {"gpu": 0})

    tracers = TracerProvider(resource=resource)
    tracers.add_span_processor(SimpleSpanProcessor(span_exporter))
    linked = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True, TraceFlags(1))
    span = tracers.get_tracer(*SCOPE).start_span(
        "interop.step", start_time=t0_ns, attributes={"step": 7}, links=[Link(linked, {"why": "retry"})]
    )
    span.add_event("enqueued", {"queue": 2}, timestamp=t0_ns + 10**6)
    span.set_status(Status(StatusCode.ERROR, "peer 5 timed out"))
    span.end(end_time=t0_ns + 3 * 10**6)

    loggers = LoggerProvider(resource=resource)
    loggers.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    loggers.get_logger(*SCOPE).emit(
        LogRecord(timestamp=t0_ns + 5 * 10**6, severity_number=SeverityNumber.WARN, severity_text="WARN",
                  body="rank 99 is late", attributes={"rank": 99})
    )  # fmt: skip

    meters.shutdown()  # collects and exports the metrics once
    tracers.shutdown()
    loggers.shutdown()
    failed = [name for name, e in (("metrics", metric_exporter), ("traces", span_exporter),
                                   ("logs", log_exporter)) if e.failed]  # fmt: skip
    if failed:
        print(f"export failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
