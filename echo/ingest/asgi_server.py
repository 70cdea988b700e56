"""The one HTTP server Echo runs: an ASGI app under uvicorn, in a daemon thread, on a socket bound first.

Echo's OTLP/HTTP listener (with ``/healthz``, ``/readyz``, ``/metrics``) and its MCP listener both use
:class:`AsgiServer`, so every HTTP request Echo answers goes through the same stack: uvicorn (HTTP/1.1
parsing, keep-alive, chunked and Content-Length bodies, TLS) and Starlette. Binding the socket before
uvicorn starts means port 0 works, the bound address is known at once, and a busy port fails in
:meth:`AsgiServer.start` with the address in the message.

Limits: past ``max_connections`` open connections a request is answered 503 (which OTLP clients retry)
and its connection closed, except on the ``exempt`` paths (the health probes): uvicorn's own
``limit_concurrency`` would refuse those too, so idle OTLP connections could fail the liveness probe
(found with 260 idle connections). ``timeout_keep_alive`` closes a connection idle that long.
uvicorn arms that idle timer only after a first response; :class:`_IdleFromConnect` arms it when the
connection opens too, so a client that connects and never speaks cannot hold a slot forever.

Usage::

    server = AsgiServer("otlp-http", app)
    port = server.start(HostPort("127.0.0.1", 0), tls_files=None)   # the bound port
    server.stop()                                                    # in-flight requests finish
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.h11_impl import H11Protocol

from rankecho.echo.settings import HostPort

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256
"""Open connections per listener; past it each request is answered 503 and the connection closed."""
IDLE_TIMEOUT_S = 60
"""Seconds a connection may stay open without sending a request (from connect, or after a response)."""


@dataclass(frozen=True)
class Limits:
    max_connections: int = MAX_CONNECTIONS
    idle_timeout_s: int = IDLE_TIMEOUT_S
    graceful_shutdown_s: int = 5
    """How long :meth:`AsgiServer.stop` lets in-flight requests finish (e.g. one waiting for a commit)."""


DEFAULT_LIMITS = Limits()


class _IdleFromConnect(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the keep-alive timer armed at connect: the first request must
    start within the idle timeout, as every later one must (uvicorn disarms it when data arrives)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )


class _Capped:
    """The ASGI app behind the connection cap: over it, 503 and close, except for ``exempt`` paths."""

    def __init__(self, app: Any, max_connections: int, exempt: frozenset[str]) -> None:
        self.app = app
        self.max_connections = max_connections
        self.exempt = exempt
        self.connections: set[Any] = set()
        """uvicorn's set of open connections (its server state), filled in by :meth:`AsgiServer.start`."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        over = len(self.connections) > self.max_connections
        if over and scope["type"] == "http" and scope["path"] not in self.exempt:
            log.warning("over %d open connections: answering 503", self.max_connections)
            await service_unavailable(scope, receive, send)
            return
        await self.app(scope, receive, send)


class AsgiServer:
    """One listener. ``name`` names its thread and its errors (``cannot listen for OTLP/HTTP on ...``);
    requests to ``exempt`` paths are served even past the connection cap."""

    def __init__(
        self, name: str, app: Any, limits: Limits = DEFAULT_LIMITS, start_timeout_s: float = 15.0,
        exempt: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        self.name = name
        self._app = _Capped(app, limits.max_connections, frozenset(exempt))
        self._limits = limits
        self._start_timeout_s = start_timeout_s
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, bind: HostPort, tls_files: tuple[str, str] | None = None) -> int:
        """Bind, start serving, wait until uvicorn is up; returns the bound port. Raises OSError."""
        sock = _bound_socket(bind, self.name)
        limits = self._limits
        config = uvicorn.Config(
            self._app,
            http=_IdleFromConnect,
            log_config=None,  # uvicorn's records go through Echo's own logging setup
            log_level="warning",
            access_log=False,
            lifespan="auto",
            limit_concurrency=None,  # _Capped applies the cap, sparing the exempt paths
            timeout_keep_alive=limits.idle_timeout_s,
            timeout_graceful_shutdown=limits.graceful_shutdown_s,
            server_header=False,
            ssl_certfile=tls_files[0] if tls_files else None,
            ssl_keyfile=tls_files[1] if tls_files else None,
        )
        server = self._server = uvicorn.Server(config)
        self._app.connections = server.server_state.connections
        thread = self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name=f"echo-{self.name}", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                raise OSError(f"the {self.name} server did not start on {bind} (see the log above)")
            time.sleep(0.01)
        return int(sock.getsockname()[1])

    def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (up to the graceful limit), end the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self._limits.graceful_shutdown_s + 5.0)


def check_can_listen(bind: HostPort, name: str, flag: str) -> None:
    """Bind ``bind`` and let go at once: raise OSError naming the port and ``flag`` when it is taken, so
    Echo refuses a busy port before it creates anything on disk (port 0 always binds)."""
    try:
        _bound_socket(bind, name).close()
    except OSError as exc:
        raise OSError(f"{exc}: stop the process that holds the port (ss -ltnp 'sport = :{bind.port}' names "
                      f"it) or choose another {flag}") from None  # fmt: skip


def _bound_socket(bind: HostPort, name: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in bind.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind.host, bind.port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen for {name} on {bind}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock
