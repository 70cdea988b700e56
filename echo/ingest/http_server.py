"""OTLP/HTTP receiver (``/v1/metrics``, ``/v1/traces``, ``/v1/logs``; protobuf or JSON, optional gzip)
plus the ops endpoints (``/healthz``, ``/readyz``, ``/metrics``) on the same listener.

A stdlib threading server: each request parses, calls :meth:`Ingest.export` (which returns after the
commit), and formats. Errors follow the OTLP/HTTP spec: a ``google.rpc.Status`` body in the request's
content type, 429/503 with ``Retry-After``. The ops endpoints need no token (probes and scrapers).
"""

from __future__ import annotations

import json
import logging
import math
import ssl
import sys
import threading
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import Message
from google.rpc import status_pb2

from echo.ingest.auth import UNAUTHENTICATED_MESSAGE, TokenCheck
from echo.ingest.otlp_json import JsonBodyError, parse_json, to_json
from echo.ingest.service import (
    BUSY,
    INVALID,
    SIGNALS,
    TOO_LARGE,
    UNAVAILABLE,
    UNSUPPORTED,
    Ingest,
    IngestError,
)  # fmt: skip
from echo.settings import HostPort

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
ROUTES = {f"/v1/{name}": signal for name, signal in SIGNALS.items()}
_STATUS = {INVALID: 400, TOO_LARGE: 413, UNSUPPORTED: 415, BUSY: 429, UNAVAILABLE: 503}
_GRPC_CODE = {400: 3, 401: 16, 411: 3, 413: 8, 415: 3, 404: 5, 429: 8, 503: 14}

MAX_CONNECTIONS = 256
IDLE_TIMEOUT_S = 60.0
"""Seconds an idle kept-alive connection may hold its thread."""
OpsRoute = Callable[[], tuple[int, str, bytes]]
"""() -> (status, content type, body) for one GET path."""


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most :data:`MAX_CONNECTIONS` at once (more are closed at once)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], ingest: Ingest, auth: TokenCheck, ops: dict[str, OpsRoute]):
        super().__init__(address, _Handler)
        self.ingest = ingest
        self.auth = auth
        self.ops = ops
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning("http: %d connections open, refusing %s", MAX_CONNECTIONS, client_address[0])
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that broke the connection (or the TLS handshake) costs one log line, not a traceback."""
        log.info("http connection from %s dropped: %s", client_address[0], sys.exc_info()[1])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S  # an idle kept-alive connection gives its thread back
    server: _Server
    body_pending = False
    """True from the start of a POST until its body has been read."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s " + format, self.client_address[0], *args)

    def _send(
        self, status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, as_json: bool, retry_after: float | None = None) -> None:
        code = _GRPC_CODE.get(status, 2)
        if as_json:
            body, ctype = json.dumps({"code": code, "message": message}).encode(), JSON
        else:
            body, ctype = status_pb2.Status(code=code, message=message).SerializeToString(), PROTOBUF
        headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else {}
        if self.body_pending:  # the unread body would be parsed as the next request: hang up instead
            headers["Connection"] = "close"
            self.close_connection = True
        self._send(status, ctype, body, headers)

    def do_GET(self) -> None:
        route = self.server.ops.get(self.path.split("?", 1)[0])
        if route is None:
            self._send(404, "text/plain", b"not found: try /healthz, /readyz, /metrics or POST /v1/metrics\n")
            return
        self._send(*route())

    def do_POST(self) -> None:
        self.body_pending = True
        ingest = self.server.ingest
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        as_json = ctype == JSON
        signal = ROUTES.get(self.path.split("?", 1)[0])
        if signal is None:
            self._error(404, f"no route {self.path}: POST to /v1/metrics, /v1/traces or /v1/logs", as_json)
            return
        if not self.server.auth.allows(self.headers.get("Authorization")):
            ingest.reject_request("unauthenticated")
            self._error(401, UNAUTHENTICATED_MESSAGE, as_json)
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            ingest.reject_request("malformed")
            self._error(411, "send a Content-Length header (chunked bodies are not accepted)", as_json)
            return
        try:
            ingest.check_size(int(length))
            raw = self.rfile.read(int(length))
            self.body_pending = False
            body = self._decompress(raw, ingest)
            request = self._parse(signal, ctype, body)
            response = ingest.export(signal, request)
        except IngestError as exc:
            self._error(_STATUS.get(exc.kind, 500), str(exc), as_json, exc.retry_after_s)
            return
        if as_json:
            self._send(200, JSON, to_json(response))
        else:
            self._send(200, PROTOBUF, response.SerializeToString())

    def _decompress(self, body: bytes, ingest: Ingest) -> bytes:
        encoding = (self.headers.get("Content-Encoding") or "identity").lower()
        if encoding == "identity":
            return body
        if encoding != "gzip":
            ingest.reject_request("malformed")
            raise IngestError(INVALID, f"Content-Encoding {encoding!r} is not supported: use gzip or none")
        limit = ingest.settings.max_message_bytes
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            ingest.reject_request("malformed")
            raise IngestError(INVALID, f"body is not valid gzip ({exc})") from None
        ingest.check_size(len(out) if len(out) <= limit else limit + 1)
        return out

    def _parse(self, signal: Any, ctype: str, body: bytes) -> Message:
        ingest = self.server.ingest
        if ctype == PROTOBUF:
            return ingest.parse(signal, body)
        if ctype != JSON:
            ingest.reject_request("unsupported_media_type")
            raise IngestError(
                UNSUPPORTED, f"Content-Type {ctype!r} is not supported: use {PROTOBUF} or {JSON}"
            )
        try:
            return parse_json(body, signal.request())
        except JsonBodyError as exc:
            ingest.reject_request("malformed")
            raise IngestError(INVALID, str(exc)) from None


def start_http(
    ingest: Ingest,
    auth: TokenCheck,
    where: HostPort,
    ops: dict[str, OpsRoute],
    tls_files: tuple[str, str] | None,
) -> tuple[ThreadingHTTPServer, int, threading.Thread]:
    """Start serving in a thread; returns the server, the bound port and the thread."""
    try:
        server = _Server((where.host, where.port), ingest, auth, ops)
    except OSError as exc:
        raise OSError(f"cannot listen for OTLP/HTTP on {where}: {exc.strerror}") from None
    if tls_files is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls_files)
        # handshake on first read, in the connection's own thread, so a slow client cannot stall accept()
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, name="otlp-http", daemon=True)
    thread.start()
    return server, server.server_address[1], thread
