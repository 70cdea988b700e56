"""TLS on both OTLP listeners (--tls-cert/--tls-key), with a throwaway self-signed certificate."""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc
import httpx
import pytest
from conftest import local_settings
from echo_helpers import TEST_TOKEN, node_request, self_signed
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

from rankecho.echo.app import Echo


def test_tls_on_grpc_and_http(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with Echo(local_settings(tmp_path / "echo.db", tls_cert=cert, tls_key=key)) as echo:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(echo.grpc_address or "", credentials) as channel:
            stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
            stub.Export(
                node_request("n1", 3), metadata=[("authorization", f"Bearer {TEST_TOKEN}")], timeout=10
            )
        context = ssl.create_default_context(cafile=str(cert))
        body = node_request("n2", 4).SerializeToString()
        headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TEST_TOKEN}"}
        response = httpx.post(
            f"https://{echo.http_address}/v1/metrics", content=body, headers=headers, verify=context
        )
        assert response.status_code == 200
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served on a TLS listener
            httpx.post(f"http://{echo.http_address}/v1/metrics", content=body, headers=headers, timeout=5)
        assert echo.reader.query("SELECT node_id, count(*) FROM events GROUP BY 1 ORDER BY 1").rows == [
            ("n1", 3),
            ("n2", 4),
        ]
