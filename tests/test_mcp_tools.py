"""The five fleet.cluster.* tools through fastmcp's in-memory client, on a real DuckDB store whose
content is known exactly (tests/guard_corpus/corpus.py): names, annotations, result shapes and values,
window forms, outlier methods, cost, caps, and hostile strings from the wire."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from guard_corpus.corpus import ROWS, START_NS, STEP_NS, build_store

from rankecho.echo.guard.instance import seal
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.sanitize import MAX_TEXT
from rankecho.echo.mcp.server import build_server
from rankecho.echo.mcp.tools import Investigation, Limits
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.reader import Reader

TOOLS = {
    "fleet.cluster.summary",
    "fleet.cluster.event_history",
    "fleet.cluster.find_outlier_nodes",
    "fleet.cluster.run_analysis",
    "fleet.cluster.get_cost",
    "fleet.cluster.find_stragglers",
    "fleet.cluster.explain_straggler",
    "fleet.cluster.timeline",
    "fleet.cluster.find_hangs",
    "fleet.cluster.jobs",
    "fleet.cluster.stacks",
}
LAST_NS = START_NS + (ROWS - 1) * STEP_NS
NOW_NS = LAST_NS + 30 * 10**9


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = build_store(tmp_path_factory.mktemp("mcp") / "echo.db")
    yield connection
    connection.close()


def call(
    con: duckdb.DuckDBPyConnection, tool: str, args: dict[str, Any], **inv_kwargs: Any
) -> dict[str, Any]:
    inv = Investigation(
        Reader(con), inv_kwargs.pop("rates", load_rates()), clock_ns=lambda: NOW_NS, **inv_kwargs
    )

    async def go() -> dict[str, Any]:
        async with Client(build_server(inv)) as client:
            result = await client.call_tool(tool, args)
            assert result.structured_content is not None
            return result.structured_content

    return asyncio.run(go())


def test_tools_are_listed_read_only_with_descriptions(con: duckdb.DuckDBPyConnection) -> None:
    async def go() -> list[Any]:
        async with Client(build_server(Investigation(Reader(con), load_rates()))) as client:
            return await client.list_tools()

    tools = asyncio.run(go())
    assert {t.name for t in tools} == TOOLS
    for tool in tools:
        assert tool.annotations is not None and tool.annotations.read_only_hint is True
        assert tool.annotations.destructive_hint is False
        assert tool.description and len(tool.description) > 100
    history = next(t for t in tools if t.name == "fleet.cluster.event_history")
    assert set(history.input_schema["properties"]) == {
        "cluster_id",
        "node_id",
        "rank",
        "metric_name",
        "window",
        "limit",
    }


def test_summary_counts_and_staleness(con: duckdb.DuckDBPyConnection) -> None:
    out = call(con, "fleet.cluster.summary", {})
    assert out["totals"]["events"] == ROWS and out["totals"]["nodes"] == 2 and out["totals"]["ranks"] == 8
    assert out["totals"]["first_ns"] == START_NS and out["totals"]["last_ns"] == LAST_NS
    assert out["clusters"] == [{"cluster_id": "demo-cluster", "nodes": 2, "events": ROWS}]
    nodes = {n["node_id"]: n for n in out["nodes"]}
    assert nodes["node-a"]["ranks"] == [0, 1, 2, 3] and nodes["node-b"]["ranks"] == [4, 5, 6, 7]
    assert nodes["node-b"]["last_ns"] == LAST_NS and nodes["node-b"]["stale_s"] == pytest.approx(30.0)
    assert nodes["node-a"]["behind_newest_s"] == pytest.approx(4 * STEP_NS / 1e9)
    assert [(r["node_id"], r["rank"]) for r in out["ranks"]][:2] == [("node-a", 0), ("node-a", 1)]
    assert len(out["ranks"]) == 8 and all(r["events"] == ROWS // 8 for r in out["ranks"])
    assert out["ranks"][0]["behind_newest_s"] == pytest.approx(7 * STEP_NS / 1e9)
    assert out["ranks"][-1] == {**out["ranks"][-1], "rank": 7, "last_ns": LAST_NS, "behind_newest_s": 0.0}
    assert out["metrics"][0]["metric_name"] == "rankecho.health.score" and out["metrics"][0]["events"] == ROWS
    assert out["truncated"] is False


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (None, 500),
        ("last 100s", 50),  # 100 s ending at the newest event: ranks step every 2 s (8 events x 0.25 s)
        ("2026-12-02T14:00:00Z/2026-12-02T14:01:00Z", 30),
        ("14:00-14:01", 30),
        ("14:00:00-14:00:30", 15),
        ("2026-12-02T14:00:00/2026-12-02T14:00:30", 15),
    ],
)
def test_event_history_filters_and_windows(
    con: duckdb.DuckDBPyConnection, window: str | None, expected: int
) -> None:
    args: dict[str, Any] = {"node_id": "node-b", "rank": 5, "limit": 10_000}
    if window is not None:
        args["window"] = window
    out = call(con, "fleet.cluster.event_history", args)
    assert out["count"] == expected and out["truncated"] is False
    times = [e["timestamp_ns"] for e in out["events"]]
    assert times == sorted(times)
    first = out["events"][0]
    assert (
        first["node_id"] == "node-b"
        and first["rank"] == 5
        and first["metric_name"] == "rankecho.health.score"
    )
    assert first["attrs"]["rankecho.gpu.model"] == "NVIDIA H100 80GB HBM3"
    assert first["time"].startswith("2026-12-02T14:")


def test_event_history_limit_sets_truncated(con: duckdb.DuckDBPyConnection) -> None:
    out = call(con, "fleet.cluster.event_history", {"limit": 7})
    assert out["count"] == 7 and out["truncated"] is True


@pytest.mark.parametrize(
    "window", ["yesterday", "last 5 parsecs", "14:35-14:30", "2026-13-45/2026-12-02", "x" * 500]
)
def test_bad_window_lists_accepted_forms(con: duckdb.DuckDBPyConnection, window: str) -> None:
    with pytest.raises(ToolError, match="accepted window forms") as err:
        call(con, "fleet.cluster.event_history", {"window": window})
    assert "last 5m" in str(err.value) and "14:30-14:35" in str(err.value)


def test_outliers_by_threshold(con: duckdb.DuckDBPyConnection) -> None:
    out = call(con, "fleet.cluster.find_outlier_nodes", {"metric": "rankecho.health.score", "threshold": 0.4})
    assert out["method"] == "threshold" and out["outliers"] == ["node-b"]
    worst, healthy = out["nodes"]
    assert worst["node_id"] == "node-b" and worst["below"] == 100 and worst["events"] == 2000
    assert worst["below_fraction"] == pytest.approx(0.05) and worst["min_value"] == pytest.approx(0.2)
    assert len(worst["evidence"]) == 5 and {e["rank"] for e in worst["evidence"]} == {5}
    assert all(e["value"] < 0.4 for e in worst["evidence"])
    assert healthy["below"] == 0 and healthy["evidence"] == [] and healthy["outlier"] is False


def test_outliers_by_mad_flags_the_node_below_its_peers(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "mad.db"))
    migrate(con)
    con.execute(
        """INSERT INTO events_generic
           SELECT 'e' || i, i, i, 'metric', 'c', 'node-' || (i % 4), 'rankecho.health.score', i % 4, 4,
                  CASE WHEN i % 4 = 2 THEN 0.5 + (i % 3) / 100 ELSE 0.9 + (i % 5) / 100 END, NULL, NULL, '{}'
           FROM range(400) t(i)"""
    )
    seal(con)
    out = call(con, "fleet.cluster.find_outlier_nodes", {"metric": "rankecho.health.score", "method": "mad"})
    assert out["method"] == "mad" and out["k"] == 3.0 and out["outliers"] == ["node-2"]
    node2 = out["nodes"][0]
    assert node2["node_id"] == "node-2" and node2["below"] == 100 and node2["robust_z"] > 3
    assert node2["cutoff"] == pytest.approx(node2["peer_median"] - 3 * node2["peer_mad"] * 1.4826)
    # Omitting the threshold with the default method compares against peers the same way.
    assert call(con, "fleet.cluster.find_outlier_nodes", {"metric": "rankecho.health.score"})["outliers"] == [
        "node-2"
    ]
    con.close()


def test_get_cost_uses_the_gpu_model_rates(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    out = call(con, "fleet.cluster.get_cost", {})
    hours_per_gpu = (ROWS - 8) * STEP_NS / 3.6e12
    rows = {r["node_id"]: r for r in out["rows"]}
    assert rows["node-a"]["rate_key"] == "A100 80GB" and rows["node-b"]["rate_key"] == "H100"
    assert rows["node-a"]["gpus"] == 4 and rows["node-a"]["gpu_hours"] == pytest.approx(4 * hours_per_gpu)
    expected = 4 * hours_per_gpu * (1.80 + 3.00)
    assert out["total_cost"] == pytest.approx(expected, rel=1e-6) and out["currency"] == "USD"
    custom = tmp_path / "rates.yaml"
    custom.write_text("currency: EUR\ndefault_per_gpu_hour: 1.0\nper_gpu_hour:\n  H100: 10.0\n")
    out = call(con, "fleet.cluster.get_cost", {"cluster_id": "demo-cluster"}, rates=load_rates(custom))
    assert out["currency"] == "EUR" and out["rates_source"] == "rates.yaml"
    assert out["total_cost"] == pytest.approx(4 * hours_per_gpu * (1.0 + 10.0), rel=1e-6)


def test_get_cost_counts_ranks_not_the_agents_own_points(tmp_path: Path) -> None:
    """The agent's own points (rank NULL, here over a longer span than the job and carrying the GPU
    model) are no GPU: 4-rank nodes stay 4 GPUs and the GPU-hours are the ranks' alone."""
    con = build_store(tmp_path / "agent.db")
    for node, model in (("node-a", "NVIDIA A100-SXM4-80GB"), ("node-b", "NVIDIA H100 80GB HBM3")):
        con.execute(
            "INSERT INTO events_generic SELECT printf('agent-%s-%d', ?, i), ? + i * ?, ? + i * ?, 'metric', "
            "'demo-cluster', ?, 'rankecho.agent.spool_bytes', NULL, NULL, 0.0, NULL, NULL, "
            "json_object('rankecho.gpu.model', ?) FROM range(3) t(i)",
            [node, START_NS - 3600 * 10**9, 3 * 3600 * 10**9, START_NS, 3600 * 10**9, node, model],
        )
    out = call(con, "fleet.cluster.get_cost", {})
    hours_per_gpu = (ROWS - 8) * STEP_NS / 3.6e12
    assert {r["node_id"]: r["gpus"] for r in out["rows"]} == {"node-a": 4, "node-b": 4}
    assert out["total_gpu_hours"] == pytest.approx(8 * hours_per_gpu, abs=1e-6)
    assert out["total_cost"] == pytest.approx(4 * hours_per_gpu * (1.80 + 3.00), rel=1e-6)
    con.close()


def timed_call(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[dict[str, Any], float]:
    """run_analysis and the wall-clock ms the whole tool call took around it."""
    started = time.perf_counter()
    out = call(con, "fleet.cluster.run_analysis", {"sql": sql})
    return out, (time.perf_counter() - started) * 1000


def test_run_analysis_shape_and_refusal(con: duckdb.DuckDBPyConnection) -> None:
    out, wall_ms = timed_call(con, "SELECT node_id, count(*) AS n FROM events GROUP BY 1 ORDER BY 1")
    assert out["columns"] == ["node_id", "n"] and out["rows"] == [
        {"node_id": "node-a", "n": 2000},
        {"node_id": "node-b", "n": 2000},
    ]
    assert out["truncated"] is False and out["row_count"] == 2 and 0 < out["elapsed_ms"] <= wall_ms
    # 160M products take well over 10 ms on any CPU: elapsed_ms measures the query, in milliseconds.
    heavy, heavy_wall_ms = timed_call(
        con, "SELECT sum(a.value_double * b.value_double) AS s FROM events a, events b, "
        "(SELECT 1 FROM events LIMIT 10) c"
    )
    assert heavy["row_count"] == 1 and 10 <= heavy["elapsed_ms"] <= heavy_wall_ms
    dup = call(con, "fleet.cluster.run_analysis", {"sql": "SELECT 1 AS x, 2 AS x"})
    assert dup["columns"] == ["x", "x_2"] and dup["rows"] == [{"x": 1, "x_2": 2}]
    with pytest.raises(ToolError, match="Allowed: exactly one read-only SELECT"):
        call(con, "fleet.cluster.run_analysis", {"sql": "SELECT * FROM read_csv('/etc/passwd')"})
    with pytest.raises(ToolError, match="Binder Error"):
        call(con, "fleet.cluster.run_analysis", {"sql": "SELECT no_such_column FROM events"})


def test_schema_resource_documents_columns_and_examples(con: duckdb.DuckDBPyConnection) -> None:
    async def go() -> str:
        async with Client(build_server(Investigation(Reader(con), load_rates()))) as client:
            contents = await client.read_resource("rankecho://schema")
            return str(getattr(contents[0], "text", ""))

    doc = json.loads(asyncio.run(go()))
    assert [t["name"] for t in doc["tables"]] == ["events", "collectives", "host_activity", "stacks"]
    typed = {c["name"] for c in doc["tables"][1]["columns"]}
    assert {"comm_id", "seq", "enter_ns", "complete_ns", "rank", "node_id"} <= typed
    layers = {layer["name"]: layer for layer in doc["analysis_layers"]}
    assert {"rk_stragglers", "rk_instances", "rk_clock_offsets", "rk_episodes"} <= set(layers)
    assert layers["rk_clock_offsets"]["parameters"] == ["start_ns", "end_ns", "cluster", "job := NULL"]
    assert all(layer["purpose"] for layer in layers.values())
    parameters = {p["name"]: p for p in doc["analysis_parameters"]}  # the tuning table, name, value, why
    assert parameters["noise_sigmas"]["value"] == 6 and all(p["why"] for p in parameters.values())
    columns = {c["name"]: c for c in doc["tables"][0]["columns"]}
    assert columns["timestamp_ns"]["unit"].startswith("ns") and columns["timestamp_ns"]["type"] == "BIGINT"
    assert all(c["meaning"] for c in columns.values())
    names = [e["name"] for e in doc["examples"]]
    assert names[:4] == ["per_node_events", "chains", "stragglers", "health_quantiles"]
    for example in doc["examples"]:  # every example runs through the guarded tool as written
        call(con, "fleet.cluster.run_analysis", {"sql": example["sql"]})


def test_hostile_wire_strings_are_bounded_and_cleaned(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "hostile.db"))
    migrate(con)
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    huge = json.dumps({"k": "x" * 5_000_000})
    nasty = "node\u202e-evil\x1b[31m\u200b" + "y" * 5000
    rows = [
        ("e1", nasty, '{"process.name": "py\\u202ethon\\u0000", "note": "ok"}'),
        ("e2", "node-deep", deep),
        ("e3", "node-huge", huge),
        ("e4", "node-list", "[" * 8000 + "]" * 8000),
    ]
    for i, (event_id, node, attrs) in enumerate(rows):
        con.execute(
            "INSERT INTO events_generic VALUES (?, ?, 0, 'metric', 'c', ?, 'm', 0, 1, 0.5, NULL, NULL, ?)",
            [event_id, START_NS + i, node, attrs],
        )
    seal(con)
    started = time.perf_counter()
    out = call(con, "fleet.cluster.event_history", {})
    assert time.perf_counter() - started < 10
    events = {e["timestamp_ns"] - START_NS: e for e in out["events"]}
    node = events[0]["node_id"]
    assert len(node) <= MAX_TEXT and "\u202e" not in node and "\x1b" not in node and "\u200b" not in node
    assert events[0]["attrs"] == {"process.name": "python", "note": "ok"}
    assert events[1]["attrs_truncated"] is True and events[2]["attrs_truncated"] is True
    assert events[3]["attrs_truncated"] is True
    assert len(json.dumps(out)) < 100_000
    raw = call(
        con,
        "fleet.cluster.run_analysis",
        {"sql": "SELECT attrs_json, node_id FROM events ORDER BY timestamp_ns"},
    )
    assert all(len(r["attrs_json"]) <= MAX_TEXT for r in raw["rows"])
    for tool in ("fleet.cluster.summary", "fleet.cluster.get_cost"):
        assert "\u202e" not in json.dumps(call(con, tool, {}), ensure_ascii=False)
    con.close()


def test_byte_cap_truncates(con: duckdb.DuckDBPyConnection) -> None:
    out = call(con, "fleet.cluster.event_history", {"limit": 10_000}, limits=Limits(max_bytes=50_000))
    assert 0 < out["count"] < ROWS and out["truncated"] is True
    assert len(json.dumps(out["events"])) <= 50_000


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("fleet.cluster.summary", {"window": "last 5m"}),
        ("fleet.cluster.event_history", {"window": "14:30-14:35"}),
        ("fleet.cluster.find_outlier_nodes", {"metric": "rankecho.health.score", "method": "mad"}),
        ("fleet.cluster.run_analysis", {"sql": "SELECT count(*) AS n FROM events"}),
        ("fleet.cluster.get_cost", {}),
        ("fleet.cluster.timeline", {}),
    ],
)
def test_every_tool_answers_on_an_empty_store(tmp_path: Path, tool: str, args: dict[str, Any]) -> None:
    empty = duckdb.connect(str(tmp_path / "empty.db"))
    migrate(empty)
    seal(empty)
    out = call(empty, tool, args)
    assert out.get("truncated") is False
    assert not out.get("nodes") and not out.get("events") and not out.get("outliers")
    empty.close()


def test_find_hangs_on_a_job_without_failures_names_none(con: duckdb.DuckDBPyConnection) -> None:
    out = call(con, "fleet.cluster.find_hangs", {"window": "last 5m"})
    assert (out["hangs"], out["crashes"], out["desyncs"]) == ([], [], [])
    assert out["verdict"] == "no hang, crash or desync" and out["truncated"] is False
