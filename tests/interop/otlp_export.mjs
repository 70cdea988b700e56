// Exports one known set of metrics, one span and one log record with the OpenTelemetry JS SDK, configured
// only by the standard environment variables, as an application would be:
//   OTEL_EXPORTER_OTLP_PROTOCOL  grpc | http/protobuf | http/json   (picks the exporter package)
//   OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_COMPRESSION,
//   OTEL_EXPORTER_OTLP_INSECURE                                      (read by the exporters themselves)
// INTEROP_NODE names the node (k8s.node.name) and INTEROP_T0_MS the span/log time, so that
// tests/test_interop_otel.py can check the stored rows value by value. Exits 1 if any export fails.
import { DiagConsoleLogger, DiagLogLevel, diag, metrics } from "@opentelemetry/api";
import { SeverityNumber } from "@opentelemetry/api-logs";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { AggregationType, MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { BasicTracerProvider, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { LoggerProvider, SimpleLogRecordProcessor } from "@opentelemetry/sdk-logs";

const protocol = process.env.OTEL_EXPORTER_OTLP_PROTOCOL ?? "http/protobuf";
const packages = {
  grpc: "otlp-grpc",
  "http/protobuf": "otlp-proto",
  "http/json": "otlp-http",
};
const flavour = packages[protocol];
if (!flavour) throw new Error(`unknown OTEL_EXPORTER_OTLP_PROTOCOL ${protocol}`);
const { OTLPMetricExporter } = await import(`@opentelemetry/exporter-metrics-${flavour}`);
const { OTLPTraceExporter } = await import(`@opentelemetry/exporter-trace-${flavour}`);
const { OTLPLogExporter } = await import(`@opentelemetry/exporter-logs-${flavour}`);

diag.setLogger(new DiagConsoleLogger(), DiagLogLevel.WARN); // export errors go to stderr
const t0 = Number(process.env.INTEROP_T0_MS);
const resource = resourceFromAttributes({
  "k8s.cluster.name": "interop",
  "k8s.node.name": process.env.INTEROP_NODE,
  "rankecho.rank": 3,
  "rankecho.nranks": 8,
});
const scope = ["interop-js", "1.0.0"];
let failed = false;
const failure = (what) => (error) => {
  console.error(`${what} export failed: ${error}`);
  failed = true;
};

// Metrics: a monotonic counter, an explicit-bucket histogram, an exponential histogram, a gauge.
const metricExporter = new OTLPMetricExporter();
const reader = new PeriodicExportingMetricReader({ exporter: metricExporter, exportIntervalMillis: 600000 });
const meterProvider = new MeterProvider({
  resource,
  readers: [reader],
  views: [{ instrumentName: "interop.size", aggregation: { type: AggregationType.EXPONENTIAL_HISTOGRAM } }],
});
const meter = meterProvider.getMeter(...scope);
meter.createCounter("interop.requests", { unit: "{request}", description: "requests served" }).add(5, { route: "a" });
const latency = meter.createHistogram("interop.latency", { unit: "ms", description: "step latency" });
for (const v of [2, 8, 30]) latency.record(v);
const size = meter.createHistogram("interop.size", { unit: "By" });
for (const v of [1, 2, 4]) size.record(v);
meter.createGauge("interop.temperature", { unit: "Cel" }).record(41.5, { gpu: 0 });
metrics.disable();

// One span with an event, a link and an error status, at fixed times.
const tracerProvider = new BasicTracerProvider({
  resource,
  spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter())],
});
const tracer = tracerProvider.getTracer(...scope);
const linked = { traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331", traceFlags: 1 };
const span = tracer.startSpan("interop.step", {
  startTime: t0,
  attributes: { step: 7 },
  links: [{ context: linked, attributes: { why: "retry" } }],
});
span.addEvent("enqueued", { queue: 2 }, t0 + 1);
span.setStatus({ code: 2, message: "peer 5 timed out" });
span.end(t0 + 3);

// One log record whose plain `rank` attribute contradicts the resource's rank.
const loggerProvider = new LoggerProvider({
  resource,
  processors: [new SimpleLogRecordProcessor({ exporter: new OTLPLogExporter() })],
});
loggerProvider.getLogger(...scope).emit({
  timestamp: t0 + 5,
  severityNumber: SeverityNumber.WARN,
  severityText: "WARN",
  body: "rank 99 is late",
  attributes: { rank: 99 },
});

// shutdown() collects and exports the metrics once more (here: once), and flushes spans and logs.
await meterProvider.shutdown().catch(failure("metrics"));
await tracerProvider.shutdown().catch(failure("traces"));
await loggerProvider.shutdown().catch(failure("logs"));
process.exit(failed ? 1 : 0);
