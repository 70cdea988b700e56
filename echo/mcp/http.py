"""MCP over streamable HTTP at ``/mcp``, as a :class:`echo.app.Service` that runs beside the receivers.

It serves the same tools on the running Echo's reader (the store's own DuckDB instance), requires a
bearer token (``--mcp-token-file``/``$RANKECHO_MCP_TOKEN`` when set, else Echo's OTLP token; none only
with ``--insecure-no-auth`` and no MCP token), and speaks HTTPS with Echo's
``--tls-cert``/``--tls-key`` when they are set. uvicorn runs in a daemon thread on a
socket bound before start, so port 0 works and the bound address is known at once.

Usage::

    echo = Echo(settings, services=[McpHttpService(settings.mcp_http)])
    echo.start(); echo.listening()["listening"]["mcp_http"]   # "127.0.0.1:PORT"; URL .../mcp
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import uvicorn

from echo.app import Echo, connect_address
from echo.mcp.rates import load_rates
from echo.mcp.server import build_server
from echo.mcp.tools import Investigation
from echo.settings import HostPort

log = logging.getLogger(__name__)
MCP_PATH = "/mcp"


class McpHttpService:
    name = "mcp_http"

    def __init__(self, bind: HostPort, rates_path: Path | None = None, start_timeout_s: float = 15.0) -> None:
        self._bind = bind
        self._rates = load_rates(rates_path)  # a bad rates file fails at startup, not on a tool call
        self._start_timeout_s = start_timeout_s
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, echo: Echo) -> str | None:
        token = echo.settings.mcp_bearer
        if token is None:
            log.warning("MCP over HTTP has NO AUTHENTICATION (--insecure-no-auth): anyone can query Echo")
        app = build_server(Investigation(echo.reader, self._rates), token=token).http_app(path=MCP_PATH)
        sock = _bound_socket(self._bind)
        s = echo.settings
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=2,
            ssl_certfile=str(s.tls_cert) if s.tls_cert else None,  # same certificate as the OTLP listeners
            ssl_keyfile=str(s.tls_key) if s.tls_key else None,
        )
        server = self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="echo-mcp-http")
        self._thread.daemon = True
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise OSError(f"MCP HTTP server did not start on {self._bind}")
            time.sleep(0.02)
        return connect_address(self._bind.host, sock.getsockname()[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(5.0)


def _bound_socket(bind: HostPort) -> socket.socket:
    family = socket.AF_INET6 if ":" in bind.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind.host, bind.port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
