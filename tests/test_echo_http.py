"""OTLP/HTTP as HTTP/1.1 clients send it: chunked and Content-Length bodies, gzip (a bomb refused on its
inflated size, chunked or not), 405 with ``Allow`` for the wrong method, 404 naming the right paths,
a body that stalls answered 408; each refusal counted, and a good request still lands afterwards."""

from __future__ import annotations

import gzip
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import local_settings
from echo_helpers import TEST_TOKEN, node_request
from google.rpc import status_pb2

from rankecho.echo.app import Echo

SMALL_LIMIT = 64 * 1024
AUTH = {"Authorization": f"Bearer {TEST_TOKEN}", "Content-Type": "application/x-protobuf"}


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[Echo]:
    with Echo(local_settings(tmp_path / "echo.db", max_message_bytes=SMALL_LIMIT)) as started:
        yield started


def url(echo: Echo, path: str = "/v1/metrics") -> str:
    return f"http://{echo.http_address}{path}"


def chunks(body: bytes, size: int = 1000) -> Iterator[bytes]:
    """An iterator body: httpx sends it with ``Transfer-Encoding: chunked`` and no Content-Length."""
    for i in range(0, len(body), size):
        yield body[i : i + size]


def stored(echo: Echo) -> list[tuple[object, ...]]:
    return echo.reader.query("SELECT node_id, count(*) FROM events GROUP BY 1 ORDER BY 1").rows


def test_chunked_bodies_plain_and_gzip_are_stored(echo: Echo) -> None:
    plain = node_request("chunked", 30).SerializeToString()
    packed = gzip.compress(node_request("chunked-gzip", 40).SerializeToString())
    with httpx.Client() as client:
        for body, headers in ((plain, AUTH), (packed, {**AUTH, "Content-Encoding": "gzip"})):
            response = client.post(url(echo), content=chunks(body), headers=headers)
            assert response.status_code == 200, response.content
            assert response.request.headers["transfer-encoding"] == "chunked"
            assert "content-length" not in response.request.headers
    assert stored(echo) == [("chunked", 30), ("chunked-gzip", 40)]


def test_content_length_bodies_on_one_kept_alive_connection(echo: Echo) -> None:
    with httpx.Client() as client:
        for i in range(3):
            body = node_request(f"n{i}", 10).SerializeToString()
            response = client.post(url(echo), content=body, headers=AUTH)
            assert response.status_code == 200 and response.headers.get("connection") != "close"
    assert [r[1] for r in stored(echo)] == [10, 10, 10]


def test_size_limit_holds_for_chunked_gzip_and_multi_member_bodies(echo: Echo) -> None:
    big = node_request("big", 5000).SerializeToString()
    assert len(big) > SMALL_LIMIT
    bomb = gzip.compress(b"\x00" * (SMALL_LIMIT * 64))  # ~4 MiB inflated, a few KiB sent
    members = gzip.compress(b"\x00" * SMALL_LIMIT) + gzip.compress(b"\x00" * 10)  # limit + 10 inflated
    gz = {**AUTH, "Content-Encoding": "gzip"}
    cases = [(chunks(big, 8192), AUTH), (bomb, gz), (chunks(bomb), gz), (members, gz)]
    for body, headers in cases:
        response = httpx.post(url(echo), content=body, headers=headers, timeout=30)
        assert response.status_code == 413, response.content
        assert "--max-message-bytes" in status_pb2.Status.FromString(response.content).message
    assert echo.stats.snapshot().rejected["too_large"] == len(cases)
    ok = gzip.compress(node_request("a", 3).SerializeToString()) + gzip.compress(b"")
    assert httpx.post(url(echo), content=ok, headers=gz).status_code == 200
    assert stored(echo) == [("a", 3)]


def test_broken_gzip_is_400_with_the_reason(echo: Echo) -> None:
    whole = gzip.compress(node_request("n", 5).SerializeToString())
    gz = {**AUTH, "Content-Encoding": "gzip"}
    for body, why in ((whole[: len(whole) // 2], "cut short"), (b"not gzip at all", "not valid gzip")):
        response = httpx.post(url(echo), content=body, headers=gz)
        assert response.status_code == 400
        assert why in status_pb2.Status.FromString(response.content).message
    brotli = httpx.post(url(echo), content=whole, headers={**AUTH, "Content-Encoding": "br"})
    assert brotli.status_code == 400 and b"use gzip or none" in brotli.content
    assert echo.stats.snapshot().rejected["malformed"] == 3
    assert stored(echo) == []


@pytest.mark.parametrize("path", ["/v1/metrics", "/v1/traces", "/v1/logs"])
def test_get_on_an_otlp_path_is_405_allow_post(echo: Echo, path: str) -> None:
    response = httpx.get(url(echo, path))
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert b"POST" in response.content


def test_ops_paths_take_get_only_and_unknown_paths_name_the_right_ones(echo: Echo) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(url(echo, path)).status_code == 200
        assert httpx.head(url(echo, path)).status_code == 200
        refused = httpx.post(url(echo, path), content=b"x")
        assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"
    missing = httpx.get(url(echo, "/v1/metric"))
    assert missing.status_code == 404 and b"/v1/metrics" in missing.content
    posted = httpx.post(url(echo, "/v1/metric"), content=b"x", headers=AUTH)
    assert posted.status_code == 404
    assert "POST to /v1/metrics" in status_pb2.Status.FromString(posted.content).message


def test_a_stalled_body_is_408_and_the_connection_closed(tmp_path: Path) -> None:
    with Echo(local_settings(tmp_path / "echo.db", http_idle_timeout_s=1)) as echo:
        host, port = (echo.http_address or "").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as conn:
            conn.settimeout(10)
            head = (
                f"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TEST_TOKEN}\r\n"
                "Content-Type: application/x-protobuf\r\nContent-Length: 100\r\n\r\n"
            )
            conn.sendall(head.encode() + b"\x0a")  # 1 of 100 bytes, then nothing
            started = time.monotonic()
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer.lower()
            assert time.monotonic() - started < 8
        assert echo.stats.snapshot().rejected["timeout"] == 1
