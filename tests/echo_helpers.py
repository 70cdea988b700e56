"""Small clients for Echo tests: send OTLP over gRPC or HTTP and read the store back."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request
from rankecho.shared.retryinfo import retry_trailers

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


def rows(echo: Any, sql: str) -> list[tuple[Any, ...]]:
    """Every row ``sql`` returns on a running Echo's reader (result caps lifted: tests read whole tables)."""
    return list(echo.reader.query(sql, max_rows=1_000_000, max_bytes=1 << 30, timeout_s=60).rows)


def row_dicts(echo: Any, sql: str) -> list[dict[str, Any]]:
    """:func:`rows` as {column: value} dicts."""
    result = echo.reader.query(sql, max_rows=1_000_000, max_bytes=1 << 30, timeout_s=60)
    return [dict(zip(result.columns, r, strict=True)) for r in result.rows]


def count(echo: Any, where: str = "true") -> int:
    """Rows of ``events`` matching ``where`` on a running Echo."""
    return int(rows(echo, f"SELECT count(*) FROM events WHERE {where}")[0][0])


def health_points(n: int, start_ns: int | None = None, **attrs: Any) -> list[Point]:
    """``n`` health-score points 1 us apart, every 4th a straggler (< 0.4)."""
    t0 = time.time_ns() if start_ns is None else start_ns
    return [Point(c.M_HEALTH, t0 + i * 1000, 0.2 if i % 4 == 0 else 0.9, dict(attrs)) for i in range(n)]


def node_request(node: str, n: int, cluster: str = "c1", **attrs: Any) -> Message:
    return metrics_request({"cluster_id": cluster, "node_id": node}, health_points(n, **attrs))


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A throwaway certificate for 127.0.0.1 / localhost, its own CA; returns (cert.pem, key.pem) in
    ``tmp_path``. Clients trust it by loading cert.pem as the root."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


class ScriptedCollector:
    """A stand-in OTLP metrics receiver for client tests (the agent's exporter, the stress tool): answers
    each Export with the next status in ``script`` (OK once it runs out), a failure carrying a RetryInfo
    of ``retry_after_s`` (None: no RetryInfo), and records what it was sent and what it accepted."""

    def __init__(self, script: Sequence[grpc.StatusCode] = (), retry_after_s: float | None = 0.05) -> None:
        self.script = list(script)
        self.retry_after_s = retry_after_s
        self.received: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.call_times: list[float] = []
        self.lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.metadata)

    @property
    def auth(self) -> list[str]:
        return [m.get("authorization", "") for m in self.metadata]

    @property
    def accepted(self) -> list[str]:
        """Event ids of every accepted point, in arrival order."""
        return self.event_ids()

    def export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self.lock:
            self.metadata.append(dict(context.invocation_metadata()))
            self.call_times.append(time.monotonic())
            code = self.script.pop(0) if self.script else grpc.StatusCode.OK
        if code is not grpc.StatusCode.OK:
            if self.retry_after_s is not None:
                context.set_trailing_metadata(retry_trailers(code, "scripted", self.retry_after_s))
            context.abort(code, f"scripted {code.name}")
        with self.lock:
            self.received.append(metrics_service_pb2.ExportMetricsServiceRequest.FromString(request))
        return metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()

    def event_ids(self) -> list[str]:
        with self.lock:
            return [kv.value.string_value for req in self.received for rm in req.resource_metrics
                    for sm in rm.scope_metrics for m in sm.metrics for dp in m.gauge.data_points
                    for kv in dp.attributes if kv.key == c.EVENT_ID]


@contextmanager
def scripted_collector(
    script: Sequence[grpc.StatusCode] = (), retry_after_s: float | None = 0.05
) -> Iterator[tuple[ScriptedCollector, str]]:
    """A :class:`ScriptedCollector` served on 127.0.0.1; yields it and its ``host:port``."""
    col = ScriptedCollector(script, retry_after_s)
    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.metrics.v1.MetricsService",
        {"Export": grpc.unary_unary_rpc_method_handler(col.export)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield col, f"127.0.0.1:{port}"
    finally:
        server.stop(0)


@contextmanager
def disk_filled(where: Path) -> Iterator[Path]:
    """Fill the volume (the ``small_disk`` tmpfs of conftest.py) to the last byte with one file;
    removing it frees the space again."""
    filler = where / "filler"
    with filler.open("wb", buffering=0) as f:
        chunk = b"\xff" * 65536
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\xff" * 512)
    try:
        yield filler
    finally:
        filler.unlink(missing_ok=True)


def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 30.0, poll_s: float = 0.02) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout_s`` (no wait without a deadline)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(poll_s)


class RestartableEcho:
    """Echo in this process on one fixed gRPC port and one store, stopped and started again like a
    restarted pod, so producers reconnect to the same address (fault tests)."""

    def __init__(self, db: Path) -> None:
        from rankecho.echo.settings import HostPort, Settings

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        self.settings = Settings(db_path=db, token=TEST_TOKEN, otlp_grpc=HostPort("127.0.0.1", port),
                                 otlp_http=None, mcp_http=None)  # fmt: skip
        self.echo: Any = None

    @property
    def address(self) -> str:
        return str(self.settings.otlp_grpc)

    def up(self) -> float:
        """Start; returns the monotonic time Echo was listening again."""
        from rankecho.echo.app import Echo

        self.echo = Echo(self.settings).start()
        return time.monotonic()

    def down(self) -> None:
        if self.echo is not None:
            self.echo.stop()
            self.echo = None

    def committed(self) -> int:
        """Events this run of Echo committed (0 while down)."""
        return int(self.echo.stats.snapshot().committed) if self.echo is not None else 0

    def stored(self) -> int:
        return int(self.echo.reader.query("SELECT count(*) FROM events").rows[0][0])


def run_serve(db: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``rankecho serve --db db`` on free loopback ports with ``TEST_TOKEN``, for runs that must be refused
    (a held store, a bad path): returns when it exits; ``timeout`` fails a run that starts instead."""
    command = [sys.executable, "-m", "rankecho", "serve", "--db", db, "--otlp-grpc", "127.0.0.1:0",
               "--otlp-http", "127.0.0.1:0", "--mcp-http", ""]  # fmt: skip
    env = {**os.environ, "RANKECHO_TOKEN": TEST_TOKEN}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)
