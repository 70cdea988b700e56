"""OTLP/HTTP receiver (``/v1/metrics``, ``/v1/traces``, ``/v1/logs``; protobuf or JSON, gzip or not,
Content-Length or chunked) plus the ops endpoints (``/healthz``, ``/readyz``, ``/metrics``), as a
Starlette app served by :class:`echo.ingest.asgi_server.AsgiServer` (uvicorn), the stack MCP runs on too.

The route is a thin async edge: check the token, read the body under the size cap, then hand the bytes
to :func:`export_reply` in a worker thread, which inflates, parses, calls :meth:`Ingest.export` (it
returns after the commit) and formats. Errors follow the OTLP/HTTP spec: a ``google.rpc.Status`` body
in the request's content type, 429/503 with ``Retry-After``. A refusal sent before the body was read
closes the connection (the unread rest cannot be mistaken for the next request). The ops endpoints
need no token (probes and scrapers).

Usage::

    server, port = start_http(ingest, auth, HostPort("127.0.0.1", 0), ops_routes, tls_files=None)
    server.stop()
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import anyio.to_thread
from anyio import CapacityLimiter
from google.rpc import status_pb2
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from rankecho.echo.ingest.asgi_server import DEFAULT_LIMITS, AsgiServer, Limits
from rankecho.echo.ingest.auth import UNAUTHENTICATED_MESSAGE, TokenCheck
from rankecho.echo.ingest.body import BodyError, inflate, read_capped, too_large
from rankecho.echo.ingest.otlp_json import JsonBodyError, parse_json, to_json
from rankecho.echo.ingest.service import (
    BUSY,
    INVALID,
    SIGNALS,
    TOO_LARGE,
    UNAVAILABLE,
    UNSUPPORTED,
    Ingest,
    IngestError,
    Signal,
)  # fmt: skip
from rankecho.echo.settings import HostPort

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_STATUS = {INVALID: 400, TOO_LARGE: 413, UNSUPPORTED: 415, BUSY: 429, UNAVAILABLE: 503}
_GRPC_CODE = {400: 3, 401: 16, 405: 12, 408: 4, 413: 8, 415: 3, 404: 5, 429: 8, 503: 14}
_BODY_STATUS = {"too_large": 413, "timeout": 408}
OPS_METHODS = ("GET", "HEAD")
OpsRoute = Callable[[], tuple[int, str, bytes]]
"""() -> (status, content type, body) for one GET path."""


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def response(self) -> Response:
        return Response(self.body, self.status, self.headers, self.content_type)


def error_reply(status: int, message: str, as_json: bool, retry_after_s: float | None = None) -> Reply:
    """An OTLP error: ``google.rpc.Status`` as protobuf or JSON, with ``Retry-After`` when given."""
    code = _GRPC_CODE.get(status, 2)
    if as_json:
        body, ctype = json.dumps({"code": code, "message": message}).encode(), JSON
    else:
        body, ctype = status_pb2.Status(code=code, message=message).SerializeToString(), PROTOBUF
    headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))} if retry_after_s is not None else {}
    return Reply(status, ctype, body, headers)


def export_reply(ingest: Ingest, signal: Signal, ctype: str, encoding: str | None, raw: bytes) -> Reply:
    """The synchronous core: inflate, parse, export (returns after COMMIT), format. Runs in a worker
    thread; every refusal is counted by reason and answered with the fix."""
    as_json = ctype == JSON
    try:
        try:
            body = inflate(raw, encoding, ingest.settings.max_message_bytes)
        except BodyError as exc:
            ingest.reject_request(exc.reason)
            kind = TOO_LARGE if exc.reason == "too_large" else INVALID
            raise IngestError(kind, str(exc)) from None
        if as_json:
            try:
                request = parse_json(body, signal.request())
            except JsonBodyError as exc:
                ingest.reject_request("malformed")
                raise IngestError(INVALID, str(exc)) from None
        else:
            request = ingest.parse(signal, body)
        response = ingest.export(signal, request)
    except IngestError as exc:
        return error_reply(_STATUS.get(exc.kind, 500), str(exc), as_json, exc.retry_after_s)
    if as_json:
        return Reply(200, JSON, to_json(response))
    return Reply(200, PROTOBUF, response.SerializeToString())


class OtlpRoutes:
    """The endpoints, bound to one :class:`Ingest`; each is an async adapter around a sync core."""

    def __init__(self, ingest: Ingest, auth: TokenCheck, ops: dict[str, OpsRoute], limits: Limits):
        self.ingest = ingest
        self.auth = auth
        self.ops = ops
        self.limits = limits
        self.threads: CapacityLimiter | None = None
        """Worker threads for exports (each waits for its commit): one per connection at most."""

    async def export(self, request: Request, signal: Signal) -> Response:
        ingest = self.ingest
        ctype = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        as_json = ctype == JSON
        if request.method != "POST":
            text = f"{request.method} is not allowed here: OTLP/HTTP exporters POST to {request.url.path}\n"
            return _unread(Reply(405, "text/plain", text.encode(), {"Allow": "POST"}))
        if not self.auth.allows(request.headers.get("authorization")):
            ingest.reject_request("unauthenticated")
            return _unread(error_reply(401, UNAUTHENTICATED_MESSAGE, as_json))
        if ctype not in (PROTOBUF, JSON):
            ingest.reject_request("unsupported_media_type")
            message = f"Content-Type {ctype!r} is not supported: use {PROTOBUF} or {JSON}"
            return _unread(error_reply(415, message, as_json))
        limit = ingest.settings.max_message_bytes
        declared = request.headers.get("content-length")
        try:
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise too_large(declared, limit)
            raw = await read_capped(request.stream(), limit, self.limits.idle_timeout_s)
        except BodyError as exc:
            ingest.reject_request(exc.reason)
            return _unread(error_reply(_BODY_STATUS.get(exc.reason, 400), str(exc), as_json))
        except ClientDisconnect:
            ingest.reject_request("disconnected")
            return Response(status_code=400)  # nobody is left to read it
        if self.threads is None:  # created inside the server's event loop
            self.threads = CapacityLimiter(self.limits.max_connections)
        encoding = request.headers.get("content-encoding")
        reply = await anyio.to_thread.run_sync(
            export_reply, ingest, signal, ctype, encoding, raw, limiter=self.threads
        )
        return reply.response()

    async def ops_route(self, request: Request) -> Response:
        route = self.ops[request.url.path]
        if request.method not in OPS_METHODS:
            text = f"use GET for {request.url.path}\n".encode()
            return Response(text, 405, {"Allow": ", ".join(OPS_METHODS)}, "text/plain")
        status, ctype, body = route()
        return Response(body, status, media_type=ctype)

    async def not_found(self, request: Request) -> Response:
        if request.method == "POST":
            as_json = (request.headers.get("content-type") or "").startswith(JSON)
            message = f"no route {request.url.path}: POST to /v1/metrics, /v1/traces or /v1/logs"
            return _unread(error_reply(404, message, as_json))
        text = b"not found: try /healthz, /readyz, /metrics or POST /v1/metrics\n"
        return Response(text, 404, media_type="text/plain")


def _unread(reply: Reply) -> Response:
    """A reply sent before the request body was read: the connection closes after it."""
    headers = {**reply.headers, "Connection": "close"}
    return Reply(reply.status, reply.content_type, reply.body, headers).response()


def otlp_app(
    ingest: Ingest, auth: TokenCheck, ops: dict[str, OpsRoute], limits: Limits = DEFAULT_LIMITS
) -> Starlette:
    """The Starlette app: the three OTLP paths (any method: non-POST gets 405), ops paths, a 404 that
    names the right paths."""
    routes = OtlpRoutes(ingest, auth, ops, limits)
    everything = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    table = [
        Route(f"/v1/{name}", partial(routes.export, signal=signal), methods=everything)
        for name, signal in SIGNALS.items()
    ]
    table += [Route(path, routes.ops_route, methods=everything) for path in ops]
    table.append(Route("/{rest:path}", routes.not_found, methods=everything))
    return Starlette(routes=table)


def start_http(
    ingest: Ingest,
    auth: TokenCheck,
    where: HostPort,
    ops: dict[str, OpsRoute],
    tls_files: tuple[str, str] | None,
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[AsgiServer, int]:
    """Start serving in a thread; returns the server (``.stop()`` it) and the bound port."""
    server = AsgiServer("OTLP/HTTP", otlp_app(ingest, auth, ops, limits), limits, exempt=tuple(ops))
    return server, server.start(where, tls_files)
