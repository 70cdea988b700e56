"""MCP over streamable HTTP at ``/mcp``, as a :class:`echo.app.Service` that runs beside the receivers.

It serves the same tools on the running Echo's reader (the store's own DuckDB instance), on the same
HTTP stack as OTLP/HTTP (:class:`echo.ingest.asgi_server.AsgiServer`: uvicorn + Starlette), on its own
port (``--mcp-http``, default 8000) so that AI agents and producers can be reached, firewalled and
tokened separately. It requires a static bearer token (``--mcp-token-file``/``$RANKECHO_MCP_TOKEN`` when
set, else Echo's OTLP token; none only with ``--insecure-no-auth`` and no MCP token), checked by
:class:`BearerGate` before fastmcp sees the request, and speaks HTTPS with Echo's
``--tls-cert``/``--tls-key``.

A missing or wrong token gets 401 with a message that says which header to send and how common clients
send it; nothing in the answer points a client at an authorization server, so clients do not start an
OAuth flow that Echo cannot complete.

Usage::

    echo = Echo(settings, services=[McpHttpService(settings.mcp_http)])
    echo.start(); echo.listening()["listening"]["mcp_http"]   # "127.0.0.1:PORT"; URL .../mcp
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rankecho.echo.app import Echo, connect_address
from rankecho.echo.ingest.asgi_server import AsgiServer, Limits
from rankecho.echo.ingest.auth import TokenCheck
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.server import build_server
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.settings import HostPort

log = logging.getLogger(__name__)
MCP_PATH = "/mcp"
UNAUTHORIZED_MESSAGE = (
    "missing or wrong bearer token: Echo's MCP endpoint takes one static bearer token, sent as the HTTP "
    "header 'Authorization: Bearer <token>' (the token is Echo's --mcp-token-file / RANKECHO_MCP_TOKEN, "
    "else its OTLP token). MCP Inspector: --header \"Authorization: Bearer <token>\"; fastmcp: "
    "Client(url, auth=\"<token>\"); other clients: set that header in their HTTP headers setting"
)


class BearerGate:
    """ASGI middleware: HTTP requests without the right ``Authorization: Bearer`` header get 401 with
    :data:`UNAUTHORIZED_MESSAGE` (as JSON ``error_description`` and in ``WWW-Authenticate``)."""

    def __init__(self, app: Any, check: TokenCheck) -> None:
        self.app = app
        self.check = check
        answer = {"error": "invalid_token", "error_description": UNAUTHORIZED_MESSAGE}
        self._body = json.dumps(answer).encode()
        challenge = 'Bearer realm="rankecho-mcp", error="invalid_token", error_description="{}"'.format(
            UNAUTHORIZED_MESSAGE.replace('"', "'")
        )
        self._headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self._body)).encode()),
            (b"www-authenticate", challenge.encode()),
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.check.enabled:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if not self.check.allows(header):
                await send({"type": "http.response.start", "status": 401, "headers": self._headers})
                await send({"type": "http.response.body", "body": self._body})
                return
        await self.app(scope, receive, send)


class McpHttpService:
    name = "mcp_http"

    def __init__(self, bind: HostPort, rates_path: Path | None = None, start_timeout_s: float = 15.0) -> None:
        self._bind = bind
        self._rates = load_rates(rates_path)  # a bad rates file fails at startup, not on a tool call
        self._start_timeout_s = start_timeout_s
        self._server: AsgiServer | None = None

    def start(self, echo: Echo) -> str | None:
        token = echo.settings.mcp_bearer
        if token is None:
            log.warning("MCP over HTTP has NO AUTHENTICATION (--insecure-no-auth): anyone can query Echo")
        inv = Investigation(echo.reader, self._rates, analysis=echo.analysis)
        mcp_app = build_server(inv).http_app(path=MCP_PATH)
        gated = BearerGate(mcp_app, TokenCheck(token))
        s = echo.settings  # a short grace: open event streams would otherwise hold the stop
        limits = Limits(s.http_max_connections, s.http_idle_timeout_s, graceful_shutdown_s=2)
        self._server = AsgiServer("MCP/HTTP", gated, limits, start_timeout_s=self._start_timeout_s)
        port = self._server.start(self._bind, s.tls_files())
        return connect_address(self._bind.host, port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
