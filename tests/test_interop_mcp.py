"""MCP Inspector (an MCP client this project did not write) in CLI mode against a real ``rankecho serve``:
it lists the tools, reads the ``rankecho://schema`` resource and calls every tool, passing the token the
way docs/mcp.md says (``--header "Authorization: Bearer <token>"``). Answers are checked against the
events that were sent. A wrong token gets Echo's own explanation (with ``--stored-auth-only``, which keeps
the Inspector from starting an OAuth flow in a non-interactive run)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from echo_helpers import TEST_TOKEN, grpc_export
from interop_clients import inspector_command, run_client
from test_mcp_tools import TOOLS

from rankecho.echo.ingest.rows import ARROW_SCHEMA
from rankecho.echo.mcp.http import UNAUTHORIZED_MESSAGE
from rankecho.launch.echo import EchoProcess
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request

START_NS = 1_796_221_800_000_000_000  # 2026-12-02T14:30:00Z
STEP_NS = 10**9
POINTS = 10
RANKS = {"node-a": (0, 1), "node-b": (2, 3)}
SLOW_RANK = 3
"""Its first 4 health points are 0.2 (stragglers); every other point is 0.9."""
GPU = "NVIDIA H100 80GB HBM3"


def health(rank: int, i: int) -> float:
    return 0.2 if rank == SLOW_RANK and i < 4 else 0.9


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoProcess]:
    with EchoProcess(tmp_path_factory.mktemp("inspector") / "echo.db", token=TEST_TOKEN) as running:
        for node, ranks in RANKS.items():
            for rank in ranks:
                resource = {c.CLUSTER_NAME: "mcp-interop", c.NODE_NAME: node, c.RANK: rank, c.NRANKS: 4,
                            c.GPU_MODEL: GPU}  # fmt: skip
                points = [Point(c.M_HEALTH, START_NS + i * STEP_NS, health(rank, i)) for i in range(POINTS)]
                grpc_export(running.otlp_grpc, metrics_request(resource, points), TEST_TOKEN)
        yield running


def inspector(echo: EchoProcess, *args: str, token: str = TEST_TOKEN) -> tuple[int, Any]:
    """Run ``inspector --cli URL --header ... ARGS``; returns (exit code, its JSON answer: the result on
    stdout, or the error envelope it prints on stderr)."""
    url = f"http://{echo.listening['mcp_http']}/mcp"
    done = run_client([*inspector_command(), url, "--header", f"Authorization: Bearer {token}", *args], {})
    try:
        return done.returncode, json.loads(done.stdout or done.stderr)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON (exit {done.returncode}): {done.stdout!r} {done.stderr!r}") from None


def call(echo: EchoProcess, tool: str, **arguments: object) -> dict[str, Any]:
    args = [f"{k}={v}" for k, v in arguments.items()]
    code, out = inspector(
        echo, "--method", "tools/call", "--tool-name", tool, *(["--tool-arg", *args] if args else [])
    )
    assert code == 0 and out["isError"] is False, out
    assert json.loads(out["content"][0]["text"]) == out["structuredContent"]
    return dict(out["structuredContent"])


def test_inspector_lists_the_tools(echo: EchoProcess) -> None:
    code, out = inspector(echo, "--method", "tools/list")
    assert code == 0
    tools = {t["name"]: t for t in out["tools"]}
    assert set(tools) == TOOLS
    assert all(t["annotations"]["readOnlyHint"] is True for t in tools.values())


def test_inspector_reads_the_schema_resource(echo: EchoProcess) -> None:
    code, out = inspector(echo, "--method", "resources/read", "--uri", "rankecho://schema")
    assert code == 0
    [content] = out["contents"]
    assert (content["uri"], content["mimeType"]) == ("rankecho://schema", "application/json")
    schema = json.loads(content["text"])
    events = next(table for table in schema["tables"] if table["name"] == "events")
    assert set(ARROW_SCHEMA.names) <= {col["name"] for col in events["columns"]}
    assert c.M_HEALTH in schema["metric_names"]
    assert {"per_node_events", "chains", "stragglers", "health_quantiles"} <= {
        e["name"] for e in schema["examples"]
    }


def test_inspector_calls_every_tool(echo: EchoProcess) -> None:
    summary = call(echo, "fleet.cluster.summary")
    assert summary["totals"]["events"] == 40
    assert (summary["totals"]["nodes"], summary["totals"]["ranks"]) == (2, 4)
    assert summary["totals"]["first_ns"] == START_NS
    assert {n["node_id"]: n["events"] for n in summary["nodes"]} == {"node-a": 20, "node-b": 20}

    history = call(echo, "fleet.cluster.event_history", node_id="node-b", rank=SLOW_RANK, limit=5)
    assert history["count"] == 5 and history["truncated"] is True
    assert [(e["timestamp_ns"], e["value"]) for e in history["events"]] == [
        (START_NS + i * STEP_NS, health(SLOW_RANK, i)) for i in range(5)
    ]

    outliers = call(echo, "fleet.cluster.find_outlier_nodes", metric=c.M_HEALTH, threshold=0.4)
    assert {n["node_id"]: n["below"] for n in outliers["nodes"]} == {"node-b": 4, "node-a": 0}
    assert outliers["outliers"] == ["node-b"]

    sql = (
        "SELECT node_id, rank, count(*) AS n, min(value_double) AS low FROM events GROUP BY ALL ORDER BY rank"
    )
    analysis = call(echo, "fleet.cluster.run_analysis", sql=sql)
    assert analysis["rows"] == [
        {"node_id": node, "rank": rank, "n": POINTS, "low": 0.2 if rank == SLOW_RANK else 0.9}
        for node, ranks in RANKS.items()
        for rank in ranks
    ]

    cost = call(echo, "fleet.cluster.get_cost")
    hours = (POINTS - 1) * STEP_NS / 3.6e12
    assert {r["node_id"]: (r["gpus"], r["rate_key"]) for r in cost["rows"]} == {
        "node-a": (2, "H100"),
        "node-b": (2, "H100"),
    }
    assert cost["total_gpu_hours"] == pytest.approx(4 * hours, rel=1e-6)
    assert cost["total_cost"] == pytest.approx(4 * hours * 3.0, rel=1e-6)


def test_a_wrong_token_gets_echos_explanation(echo: EchoProcess) -> None:
    code, out = inspector(echo, "--stored-auth-only", "--method", "tools/list", token="not-the-token")
    assert code != 0
    message = out["error"]["message"]
    assert "static bearer token" in message and "Authorization: Bearer <token>" in message
    assert "re-register" not in message and "OAuth" not in message


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic dXNlcjpwYXNz"])
def test_the_401_names_the_header_and_points_at_no_authorization_server(
    echo: EchoProcess, header: str | None
) -> None:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if header is not None:
        headers["Authorization"] = header
    url = f"http://{echo.listening['mcp_http']}/mcp"
    response = httpx.post(
        url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=10
    )
    assert response.status_code == 401
    assert response.json() == {"error": "invalid_token", "error_description": UNAUTHORIZED_MESSAGE}
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="rankecho-mcp"') and "resource_metadata" not in challenge
    metadata = f"http://{echo.listening['mcp_http']}/.well-known/oauth-protected-resource"
    assert httpx.get(metadata, headers={"Authorization": f"Bearer {TEST_TOKEN}"}).status_code == 404


CHECKED = {
    "fleet.cluster.summary",
    "fleet.cluster.event_history",
    "fleet.cluster.find_outlier_nodes",
    "fleet.cluster.run_analysis",
    "fleet.cluster.get_cost",
}
"""The tools whose answers test_inspector_calls_every_tool checks value by value."""


def test_inspector_reaches_every_other_listed_tool(echo: EchoProcess) -> None:
    """Tools added beside the five above answer the Inspector too: a result when they need no arguments,
    else the tool's own refusal naming what is missing (never a transport or auth failure)."""
    code, listed = inspector(echo, "--method", "tools/list")
    assert code == 0 and {t["name"] for t in listed["tools"]} >= CHECKED
    for tool in (t for t in listed["tools"] if t["name"] not in CHECKED):
        code, out = inspector(echo, "--method", "tools/call", "--tool-name", tool["name"])
        required = tool["inputSchema"].get("required", [])
        assert "content" in out or "error" in out, out
        text = json.dumps(out)
        if not required:
            assert code == 0 and out["isError"] is False, out
        else:
            assert any(name in text for name in required), out
        assert "auth_required" not in text and "unreachable" not in text
