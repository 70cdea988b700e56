"""A flood of idle OTLP/HTTP connections must not fail the health probes.

Found (issue 9): 260 idle connections to the OTLP/HTTP port made ``/healthz`` answer 503 for the 60 s
idle timeout, because the probes shared the 256-connection cap; a kubelet would have restarted a
healthy Echo. Here the cap is 8 and the flood 20 connections.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from rankecho.echo.app import Echo
from rankecho.echo.settings import HostPort, Settings
from tests.echo_helpers import TEST_TOKEN, http_post, node_request

CAP = 8


def test_health_endpoints_answer_past_the_connection_cap(tmp_path: Path) -> None:
    settings = Settings(
        db_path=tmp_path / "e.db",
        token=TEST_TOKEN,
        otlp_grpc=None,
        otlp_http=HostPort("127.0.0.1", 0),
        mcp_http=None,
        http_max_connections=CAP,
    )
    with Echo(settings) as echo:
        address = echo.http_address or ""
        host, port = address.rsplit(":", 1)
        flood = [socket.create_connection((host, int(port))) for _ in range(CAP + 12)]
        try:
            body = node_request("n0", 5).SerializeToString()
            deadline = time.monotonic() + 5
            while http_post(address, "metrics", body, TEST_TOKEN).status_code != 503:
                assert time.monotonic() < deadline, "the flood never reached the cap"
                time.sleep(0.05)
            for path in ("/healthz", "/readyz", "/metrics"):
                response = httpx.get(f"http://{address}{path}", timeout=5)
                assert response.status_code == 200, (path, response.status_code, response.text)
        finally:
            for conn in flood:
                conn.close()
        deadline = time.monotonic() + 5
        while http_post(address, "metrics", body, TEST_TOKEN).status_code != 200:
            assert time.monotonic() < deadline, "OTLP did not come back after the flood"
            time.sleep(0.05)
