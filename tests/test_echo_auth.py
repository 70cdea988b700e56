"""Bearer-token auth on both OTLP listeners (real gRPC and HTTP servers on 127.0.0.1)."""

from __future__ import annotations

import grpc
import httpx
import pytest
from echo_helpers import TEST_TOKEN, grpc_export, http_post, node_request

from rankecho.echo.app import Echo
from rankecho.echo.ingest.auth import TokenCheck


@pytest.mark.parametrize("token", [None, "wrong-token", TEST_TOKEN + "x", TEST_TOKEN[:-1]])
def test_grpc_refuses_missing_or_wrong_token(echo_inproc: Echo, token: str | None) -> None:
    with pytest.raises(grpc.RpcError) as info:
        grpc_export(echo_inproc.grpc_address or "", node_request("n1", 5), token)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "Bearer" in (info.value.details() or "")
    assert echo_inproc.reader.query("SELECT count(*) FROM events").rows == [(0,)]


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_http_refuses_missing_or_wrong_token(echo_inproc: Echo, token: str | None) -> None:
    response = http_post(
        echo_inproc.http_address or "", "metrics", node_request("n1", 5).SerializeToString(), token
    )
    assert response.status_code == 401
    assert echo_inproc.reader.query("SELECT count(*) FROM events").rows == [(0,)]
    assert echo_inproc.stats.snapshot().rejected["unauthenticated"] == 1


def test_right_token_is_accepted_on_both_listeners(echo_inproc: Echo) -> None:
    grpc_export(echo_inproc.grpc_address or "", node_request("n1", 5), TEST_TOKEN)
    body = node_request("n2", 7).SerializeToString()
    assert http_post(echo_inproc.http_address or "", "metrics", body, TEST_TOKEN).status_code == 200
    assert echo_inproc.reader.query("SELECT count(*) FROM events").rows == [(12,)]


def test_token_check_rules() -> None:
    check = TokenCheck("s3cret")
    assert check.allows("Bearer s3cret") and check.allows("bearer s3cret") and check.allows(b"Bearer s3cret")
    for header in (None, "", "s3cret", "Basic s3cret", "Bearer s3cre", "Bearer s3cret2", "Bearer \xff"):
        assert not check.allows(header)
    assert TokenCheck(None).allows(None) and not TokenCheck(None).enabled


def test_refusal_before_the_body_is_read_closes_the_connection(echo_inproc: Echo) -> None:
    """Otherwise the unread body would be parsed as the next request on a kept-alive connection."""
    body = node_request("n1", 5).SerializeToString()
    url = f"http://{echo_inproc.http_address}/v1/metrics"
    ctype = {"Content-Type": "application/x-protobuf"}
    with httpx.Client() as client:
        refused = client.post(url, content=body, headers=ctype)
        assert (refused.status_code, refused.headers.get("connection")) == (401, "close")
        for _ in range(2):  # read bodies keep the connection open
            ok = client.post(url, content=body, headers={**ctype, "Authorization": f"Bearer {TEST_TOKEN}"})
            assert ok.status_code == 200 and ok.headers.get("connection") != "close"
    assert echo_inproc.reader.query("SELECT count(*) FROM events").rows == [(5,)]
