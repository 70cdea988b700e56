"""End to end: a real ``rankecho serve`` filled by ``rankecho stress``, queried with the official MCP Python
client over streamable HTTP (bearer token) and, once Echo has stopped, over stdio (``rankecho mcp --db``).

Expected values come from the stress plan (which events are stragglers or chain markers is
deterministic), so every tool's answer is checked against what was sent, not against itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from echo_helpers import TEST_TOKEN, self_signed
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from test_mcp_tools import TOOLS

from rankecho.echo.queries import seed_examples
from rankecho.launch.echo import EchoProcess
from rankecho.launch.stress import StressProcess
from rankecho.stress.planting import StressPlan

START_NS = 1_796_221_800_000_000_000  # 2026-12-02T14:30:00Z
STEP_NS = 1_000_000  # the stress tool's default spacing: 1 ms
EVENTS = 1000
PLAN = StressPlan("demo-cluster", "node", producers=2, events_per_producer=EVENTS)
SEED_QUERIES = {q.name: q.sql for q in seed_examples()}  # the fan-in proof's four, verbatim


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoProcess]:
    with EchoProcess(tmp_path_factory.mktemp("e2e") / "echo.db", token=TEST_TOKEN) as running:
        stress = StressProcess(
            running.otlp_grpc,
            TEST_TOKEN,
            PLAN.cluster_id,
            PLAN.node_id,
            PLAN.producers,
            EVENTS,
            extra=("--start-ns", str(START_NS)),
        )
        summary = stress.start().finish()
        assert summary["exit_code"] == 0 and summary["acked"] == PLAN.total
        yield running


def mcp_url(echo: EchoProcess) -> str:
    return f"http://{echo.listening['mcp_http']}/mcp"


async def _session_calls(
    session: ClientSession, calls: list[tuple[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    await session.initialize()
    listed = await session.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    out = []
    for name, args in calls:
        result = await session.call_tool(name, args)
        assert not result.is_error, result.content
        assert result.structured_content is not None
        out.append(result.structured_content)
    return out


@contextlib.asynccontextmanager
async def http_session(echo: EchoProcess) -> AsyncIterator[ClientSession]:
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {TEST_TOKEN}"})
    async with (
        client,
        streamable_http_client(mcp_url(echo), http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        yield session


def over_http(echo: EchoProcess, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        async with http_session(echo) as session:
            return await _session_calls(session, calls)

    return asyncio.run(go())


def test_listening_line_reports_mcp_http(echo: EchoProcess) -> None:
    host, port = str(echo.listening["mcp_http"]).rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0


@pytest.mark.parametrize("token", [None, "wrong-token", TEST_TOKEN + "x"])
def test_missing_or_wrong_token_is_401(echo: EchoProcess, token: str | None) -> None:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    response = httpx.post(mcp_url(echo), headers=headers, json=body, timeout=10)
    assert response.status_code == 401
    good = httpx.post(
        mcp_url(echo), headers={**headers, "Authorization": f"Bearer {TEST_TOKEN}"}, json=body, timeout=10
    )
    assert good.status_code == 200


def test_every_tool_over_streamable_http(echo: EchoProcess) -> None:
    window = "14:30-14:35"
    summary, history, outliers, cost, *seed = over_http(
        echo,
        [
            ("fleet.cluster.summary", {"window": window}),
            ("fleet.cluster.event_history", {"node_id": "node-1", "window": window, "limit": 5}),
            (
                "fleet.cluster.find_outlier_nodes",
                {"window": window, "metric": "rankecho.health.score", "threshold": 0.4},
            ),
            ("fleet.cluster.get_cost", {"window": window}),
            *(("fleet.cluster.run_analysis", {"sql": sql}) for sql in SEED_QUERIES.values()),
        ],
    )
    assert summary["totals"]["events"] == PLAN.total and summary["totals"]["nodes"] == 2
    assert summary["totals"]["first_ns"] == START_NS
    assert [n["node_id"] for n in summary["nodes"]] == PLAN.node_ids()
    assert all(n["events"] == EVENTS for n in summary["nodes"])

    assert history["count"] == 5 and history["truncated"] is True
    assert [e["timestamp_ns"] for e in history["events"]] == [START_NS + i * STEP_NS for i in range(5)]
    assert all(
        e["node_id"] == "node-1" and e["metric_name"] == "rankecho.health.score" for e in history["events"]
    )

    per_node = PLAN.stragglers_per_node()
    assert {n["node_id"]: n["below"] for n in outliers["nodes"]} == per_node
    assert set(outliers["outliers"]) == {n for n, c in per_node.items() if c}
    assert [n["below"] for n in outliers["nodes"]] == sorted(per_node.values(), reverse=True)
    assert all(e["value"] < 0.4 for n in outliers["nodes"] for e in n["evidence"])

    hours = (EVENTS - 1) * STEP_NS / 3.6e12
    assert [r["gpus"] for r in cost["rows"]] == [1, 1]
    assert cost["total_gpu_hours"] == pytest.approx(2 * hours, rel=1e-3)
    assert cost["total_cost"] == pytest.approx(2 * hours * cost["default_rate_per_gpu_hour"], rel=1e-3)

    per_node_rows, chains, stragglers, quantiles = (r["rows"] for r in seed)
    assert per_node_rows == [
        {"cluster_id": "demo-cluster", "node_id": n, "events": EVENTS} for n in PLAN.node_ids()
    ]
    assert chains == [{"chains": PLAN.chain_count()}]
    assert {r["node_id"]: r["straggler_events"] for r in stragglers} == {
        n: c for n, c in per_node.items() if c
    }
    assert all(r["median_health"] >= 0.55 for r in quantiles)


def test_refusal_over_http_says_what_is_allowed(echo: EchoProcess) -> None:
    async def go() -> Any:
        async with http_session(echo) as session:
            await session.initialize()
            return await session.call_tool(
                "fleet.cluster.run_analysis", {"sql": "COPY events TO '/tmp/x.csv'"}
            )

    result = asyncio.run(go())
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert result.is_error and "Allowed: exactly one read-only SELECT" in text and "Traceback" not in text


def test_stdio_refuses_a_store_held_by_echo(echo: EchoProcess) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rankecho", "mcp", "--db", str(echo.db)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3 and "held by a running Echo" in done.stderr


def test_tools_over_stdio_after_echo_stops(echo: EchoProcess) -> None:
    echo.stop()

    async def go() -> list[dict[str, Any]]:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "rankecho", "mcp", "--db", str(echo.db)]
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            return await _session_calls(
                session,
                [
                    ("fleet.cluster.summary", {}),
                    ("fleet.cluster.run_analysis", {"sql": SEED_QUERIES["chains"]}),
                    (
                        "fleet.cluster.find_outlier_nodes",
                        {"metric": "rankecho.health.score", "threshold": 0.4},
                    ),
                ],
            )

    summary, chains, outliers = asyncio.run(go())
    assert summary["totals"]["events"] == PLAN.total
    assert chains["rows"] == [{"chains": PLAN.chain_count()}]
    assert {n["node_id"]: n["below"] for n in outliers["nodes"]} == PLAN.stragglers_per_node()
    json.dumps(summary)  # plain JSON all the way


def test_mcp_http_uses_echo_tls_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    extra = ("--tls-cert", str(cert), "--tls-key", str(key))
    with EchoProcess(tmp_path / "tls.db", token=TEST_TOKEN, extra_args=extra) as running:
        url = f"https://{running.listening['mcp_http']}/mcp"
        headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {TEST_TOKEN}"}
        body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        with pytest.raises(httpx.ConnectError):
            httpx.post(url, headers=headers, json=body, timeout=10)  # not trusted without the CA
        trust = ssl.create_default_context(cafile=str(cert))
        verified = httpx.post(url, headers=headers, json=body, timeout=10, verify=trust)
        assert verified.status_code != 401 and verified.status_code < 500
        plain = url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.post(plain, headers=headers, json=body, timeout=5)
