"""The one OTLP/gRPC metrics client of rankecho's own producers: the agent's exporter and the
``rankecho stress`` raw client send through it (the stress tool's ``sdk`` client is the OpenTelemetry
SDK exporter on purpose: it checks Echo against a client that is not ours).

:class:`Target` says where and how (``host:port``, bearer token, TLS or plaintext with an optional client
certificate, gzip); :class:`MetricsClient` makes one Export attempt with already-encoded request bytes
(the agent's spool replays exact bytes) and reports an :class:`Outcome`, including the ``RetryInfo`` delay
Echo asked for. Whether and when to resend is :mod:`rankecho.shared.retry`'s decision. The channel reconnects
100 ms to 1 s after a failure (gRPC's default backoff grows to minutes), so a restarted Echo is found
within about a second. Usage::

    client = MetricsClient(Target("echo:4317", token="t", insecure=False, ca_file="ca.pem"))
    outcome = client.export(request_bytes, timeout_s=5)
    delay = retry_delay(policy, outcome.code, attempt, elapsed, outcome.server_delay_s)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from rankecho.shared.retryinfo import retry_delay_from

EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect within ~1 s of Echo coming back: gRPC's default backoff (1 s growing to 120 s) made the
    # agent's first send after a 30 s outage come 9-15 s after Echo was back, 0.3-0.5 s with these.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


@dataclass(frozen=True)
class Target:
    """Where and how to connect: ``host:port`` (an ``http://``-style scheme is ignored), bearer token
    (None or empty: send none), plaintext or TLS (system roots, or ``ca_file``; ``cert_file`` +
    ``key_file`` for mutual TLS), gzip-compressed requests."""

    endpoint: str
    token: str | None = None
    insecure: bool = True
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    gzip: bool = False

    @property
    def address(self) -> str:
        return self.endpoint.split("://", 1)[-1]

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials; None for plaintext."""
        if self.insecure:
            return None

        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(read(self.ca_file), read(self.key_file), read(self.cert_file))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        # gRPC metadata keys must be lower case: "Authorization" breaks the call.
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def channel(self) -> grpc.Channel:
        options = list(CHANNEL_OPTIONS)
        compression = grpc.Compression.Gzip if self.gzip else None
        credentials = self.credentials()
        if credentials is None:
            return grpc.insecure_channel(self.address, options, compression)
        return grpc.secure_channel(self.address, credentials, options, compression)


def tls_mismatch_hint(details: str, insecure: bool) -> str:
    """``details`` of a failed call, with the flag to use when client and Echo disagree on TLS: a TLS
    client gets ``WRONG_VERSION_NUMBER`` from a plaintext Echo; a plaintext client's connection to a TLS
    Echo is just closed (``Socket closed``)."""
    if not insecure and "WRONG_VERSION_NUMBER" in details:
        return (f"{details} (Echo answers in plaintext: drop --tls/--ca-file, or start Echo with "
                "--tls-cert and --tls-key)")  # fmt: skip
    if insecure and "Socket closed" in details:
        return f"{details} (if Echo serves TLS (--tls-cert), pass --tls, or --ca-file FILE for a private CA)"
    return details


@dataclass(frozen=True)
class Outcome:
    """One attempt's result. ``rejected`` counts points Echo refused for good (partial success);
    ``code`` is None on success or when the failure carried no status."""

    ok: bool
    rejected: int = 0
    code: grpc.StatusCode | None = None
    server_delay_s: float | None = None
    message: str = ""


class MetricsClient:
    """One channel to Echo's OTLP metrics service; :meth:`export` sends serialized
    ``ExportMetricsServiceRequest`` bytes (no per-send encoding) and never raises for an RPC failure."""

    def __init__(self, target: Target) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

        self.target = target
        self._metadata = target.metadata()
        self._channel = target.channel()
        self._export = self._channel.unary_unary(
            EXPORT_METHOD,
            request_serializer=None,
            response_deserializer=ExportMetricsServiceResponse.FromString,
        )

    def export(self, data: bytes, timeout_s: float, wait_for_ready: bool = False) -> Outcome:
        """One attempt. ``wait_for_ready``: while the channel is reconnecting, wait for it (up to
        ``timeout_s``) instead of failing at once, so the request goes out the moment Echo is back."""
        try:
            response = self._export(
                data, timeout=timeout_s, metadata=self._metadata, wait_for_ready=wait_for_ready
            )
        except grpc.RpcError as err:
            call = err if isinstance(err, grpc.Call) else None
            code = call.code() if call else None
            delay = retry_delay_from(call.trailing_metadata()) if call else None
            details = tls_mismatch_hint((call.details() if call else None) or str(err), self.target.insecure)
            return Outcome(False, code=code, server_delay_s=delay, message=details)
        rejected = int(response.partial_success.rejected_data_points)
        return Outcome(True, rejected=rejected, message=response.partial_success.error_message)

    def close(self) -> None:
        self._channel.close()
