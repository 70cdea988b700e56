"""MCP over HTTP with its own token: ``rankecho serve --mcp-token-file`` (and ``--gpu-rates``) in a real
process, called with the official MCP Python client over streamable HTTP. Agents get the MCP token,
producers the OTLP one, and neither token opens the other door."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from echo_helpers import TEST_TOKEN, grpc_export, node_request
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from rankecho.launch.echo import EchoProcess

MCP_TOKEN = "mcp-only-token-9876543210"
RATES = "currency: EUR\ndefault_per_gpu_hour: 7.25\nper_gpu_hour: {H100: 9.5}\n"


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoProcess]:
    tmp = tmp_path_factory.mktemp("mcp-auth")
    (tmp / "mcp.token").write_text(f"  {MCP_TOKEN}\n")
    (tmp / "rates.yaml").write_text(RATES)
    extra = ("--mcp-token-file", str(tmp / "mcp.token"), "--gpu-rates", str(tmp / "rates.yaml"))
    with EchoProcess(tmp / "echo.db", token=TEST_TOKEN, extra_args=extra) as running:
        grpc_export(running.otlp_grpc, node_request("n1", 10), TEST_TOKEN)
        yield running


@contextlib.asynccontextmanager
async def session(echo: EchoProcess, token: str, statuses: list[int]) -> AsyncIterator[ClientSession]:
    """An initialized MCP session; every HTTP status the server answered is appended to ``statuses``."""
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})

    async def record(response: Any) -> None:
        statuses.append(response.status_code)

    client.event_hooks["response"].append(record)
    url = f"http://{echo.listening['mcp_http']}/mcp"
    async with (
        client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as opened,
    ):
        await opened.initialize()
        yield opened


def call(echo: EchoProcess, token: str, tool: str, statuses: list[int] | None = None) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with session(echo, token, [] if statuses is None else statuses) as opened:
            result = await opened.call_tool(tool, {})
            assert not result.is_error and result.structured_content is not None, result.content
            return result.structured_content

    return asyncio.run(go())


def test_the_mcp_token_works_and_the_rates_file_is_used(echo: EchoProcess) -> None:
    summary = call(echo, MCP_TOKEN, "fleet.cluster.summary")
    assert summary["totals"]["events"] == 10
    cost = call(echo, MCP_TOKEN, "fleet.cluster.get_cost")
    assert (cost["currency"], cost["default_rate_per_gpu_hour"], cost["rates_source"]) == (
        "EUR",
        7.25,
        "rates.yaml",
    )


def test_the_otlp_token_is_refused_by_mcp_when_a_separate_one_is_set(echo: EchoProcess) -> None:
    statuses: list[int] = []
    with pytest.raises(Exception, match="TaskGroup"):  # the client raises from its task group
        call(echo, TEST_TOKEN, "fleet.cluster.summary", statuses)
    assert statuses == [401]  # initialize refused; nothing was served
    accepted: list[int] = []
    call(echo, MCP_TOKEN, "fleet.cluster.summary", accepted)
    assert accepted and all(200 <= status < 300 for status in accepted)


def test_the_mcp_token_does_not_open_otlp(echo: EchoProcess) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        grpc_export(echo.otlp_grpc, node_request("n2", 1), MCP_TOKEN)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
