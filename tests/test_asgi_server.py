"""The HTTP server under both of Echo's HTTP listeners (uvicorn in a thread, :mod:`echo.ingest.asgi_server`):
its connection cap and its idle timeout, on a real socket."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from rankecho.echo.ingest.asgi_server import AsgiServer, Limits
from rankecho.echo.settings import HostPort


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def serve(limits: Limits) -> Iterator[str]:
    server = AsgiServer("test", Starlette(routes=[Route("/", hello)]), limits)
    port = server.start(HostPort("127.0.0.1", 0))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def capped_server() -> Iterator[str]:
    """A server allowing 2 connections (idle ones kept 30 s); yields ``host:port``."""
    yield from serve(Limits(max_connections=2, idle_timeout_s=30))


@pytest.fixture
def small_server() -> Iterator[str]:
    """A server closing connections idle for 1 s; yields ``host:port``."""
    yield from serve(Limits(max_connections=2, idle_timeout_s=1))


def get(address: str) -> int:
    try:
        return httpx.get(f"http://{address}/", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def test_connections_past_the_cap_get_503_and_slots_come_back(capped_server: str) -> None:
    host, port = capped_server.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port))) for _ in range(2)]
    deadline = time.monotonic() + 5
    while get(capped_server) != 503:  # until the server has accepted both idle connections
        assert time.monotonic() < deadline, "the third connection was never refused"
        time.sleep(0.02)
    response = httpx.get(f"http://{capped_server}/", timeout=5)
    assert response.status_code == 503 and response.headers["connection"] == "close"
    idle[0].close()
    deadline = time.monotonic() + 5
    while get(capped_server) != 200:
        assert time.monotonic() < deadline, "the slot of a closed connection did not come back"
        time.sleep(0.02)
    idle[1].close()


def test_a_connection_that_never_speaks_is_closed_after_the_idle_timeout(small_server: str) -> None:
    host, port = small_server.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as silent:
        silent.settimeout(5)
        started = time.monotonic()
        assert silent.recv(1) == b""  # closed by the server
        assert 0.5 < time.monotonic() - started < 4


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout(small_server: str) -> None:
    host, port = small_server.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as conn:
        conn.settimeout(5)
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        assert b"hello" in conn.recv(4096)
        assert conn.recv(1) == b""  # then closed when idle


def test_a_busy_port_names_the_listener_and_the_address() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = HostPort("127.0.0.1", busy.getsockname()[1])
        with pytest.raises(OSError, match=f"cannot listen for test on {address}"):
            AsgiServer("test", Starlette()).start(address)
