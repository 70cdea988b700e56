"""Call stacks through the front ends, on the scenario of tests/test_echo_stacks.py ingested by a real
Echo: fleet.cluster.stacks, explain_straggler's stacks and find_stragglers' leading frames through
fastmcp's client, caller SQL over the stacks table, and `rankecho stacks` writing folded stacks that parse
back and a pprof profile that decodes (gzip + the same profile.proto) with the right sample values."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from test_echo_stacks import ALLOC, ALLOC_LEAD, FETCH, FORWARD, LATE_RANK, episodes, scenario_store

from rankecho.echo.guard.check import project_policy
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.server import build_server
from rankecho.echo.mcp.stacks import MAX_FOLDED_CHARS, MAX_FRAMES, _stack
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.pprof import profile_class
from rankecho.echo.queries import QUERIES
from rankecho.echo.sandbox import Sandbox, SandboxLimits
from rankecho.echo.store.reader import Reader
from rankecho.shared.stacks import stack_id


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario_store(tmp_path_factory.mktemp("stacks") / "s.db")


def call(path: Path, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    with duckdb.connect(str(path), read_only=True) as con:
        inv = Investigation(Reader(con), load_rates())

        async def go() -> dict[str, Any]:
            async with Client(build_server(inv)) as client:
                result = await client.call_tool(tool, args)
                assert result.structured_content is not None
                return result.structured_content

        return asyncio.run(go())


def test_the_stacks_tool_returns_bounded_folded_stacks(store: Path) -> None:
    out = call(store, "fleet.cluster.stacks", {"node_id": "node-1", "rank": LATE_RANK})
    assert out["job_id"] == "torchelastic:stacks" and out["weight_unit"] == "microseconds"
    folded = dict(line.rsplit(" ", 1) for line in out["folded"])
    assert int(folded[";".join(reversed(ALLOC))]) == len(episodes()) * 40_000
    assert [s["stack_id"] for s in out["stacks"]][:1] == [stack_id(FORWARD)]  # host compute: most time
    one = call(store, "fleet.cluster.stacks", {"node_id": "node-1", "rank": LATE_RANK, "limit": 1})
    assert len(one["stacks"]) == 1 and one["truncated"] is True
    episode = call(
        store, "fleet.cluster.stacks", {"node_id": "node-1", "rank": LATE_RANK, "causal_chain_id": "w0rld:4"}
    )
    assert {s["stack_id"]: s["ms"] for s in episode["stacks"]}[stack_id(ALLOC)] == pytest.approx(40.0)
    empty = call(store, "fleet.cluster.stacks", {"node_id": "node-9", "rank": LATE_RANK})
    assert empty["stacks"] == [] and "no stack-carried time" in empty["note"]
    with pytest.raises(ToolError, match="give node_id with causal_chain_id"):
        call(store, "fleet.cluster.stacks", {"node_id": None, "rank": 3, "causal_chain_id": "w0rld:4"})


def test_deep_stacks_are_cut_at_the_root_end() -> None:
    frames = [f"f{i:03d}" for i in range(127)]
    row = {
        "stack_id": "x",
        "ms": 1.0,
        "category": "host_compute",
        "ms_by_category": {},
        "leading_frames": "f000",
        "truncated": True,
        "frames": frames,
        "folded": ";".join(reversed(frames)),
    }
    s = _stack(row)
    assert s["frames"] == frames[:MAX_FRAMES] and s["frames_cut"] and s["depth"] == 127
    assert s["folded"] == ";".join(["[...]", *reversed(frames[:MAX_FRAMES])]) + " 1000"
    row |= {"frames": ["x" * 100] * 20, "folded": ";".join(["x" * 100] * 20)}
    long = _stack(row)["folded"]
    assert len(long) <= MAX_FOLDED_CHARS + 10 and long.startswith("[...];x") and long.endswith(" 1000")


def test_explain_and_find_stragglers_over_mcp_carry_the_stacks(store: Path) -> None:
    found = call(store, "fleet.cluster.find_stragglers", {})
    assert found["stragglers"][0]["cause"]["leading_frames"] == ALLOC_LEAD
    seq = episodes()[-1]
    explained = call(
        store,
        "fleet.cluster.explain_straggler",
        {"node_id": "node-1", "rank": LATE_RANK, "causal_chain_id": f"w0rld:{seq}"},
    )
    assert explained["cause"] == "allocator"
    assert [d["leading_frames"] for d in explained["stacks"]["distinctive"]] == [ALLOC_LEAD]


def test_caller_sql_reads_the_stacks_table(store: Path) -> None:
    assert "stacks" in project_policy().relations
    out = call(
        store,
        "fleet.cluster.run_analysis",
        {
            "sql": "SELECT s.frames[1] AS leaf, count(*) AS calls FROM host_activity h "
            "JOIN stacks s USING (stack_id) GROUP BY ALL ORDER BY leaf"
        },
    )
    assert out["rows"] == [{"leaf": "__clock_nanosleep", "calls": 120}, {"leaf": "cudaMalloc", "calls": 10}]
    example = call(store, "fleet.cluster.run_analysis", {"sql": QUERIES["example_late_rank_stacks"].sql})
    top = example["rows"][0]
    assert (top["rank"], top["category"], top["leading_frames"], top["ms"]) == (
        3,
        "allocator",
        ALLOC_LEAD,
        400.0,
    )
    # and in the sandbox worker, whose catalog is pruned to the allowed relations (echo/guard/catalog.py)
    box = Sandbox(lambda: store, SandboxLimits(memory_bytes=1 << 30, workers=1, margin_s=1.0), 10)
    try:
        got = box.query("SELECT rk_lead_frames(frames, 4) AS lead FROM stacks WHERE depth = 5").rows
    finally:
        box.close()
    assert got == [(ALLOC_LEAD,)]


def export(store: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankecho", "stacks", "--db", str(store), "-o", str(out), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_folded_export_parses_back(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "rank3.folded"
    done = export(store, out, "--node-id", "node-1", "--rank", str(LATE_RANK))
    assert done.returncode == 0, done.stderr
    parsed = {}
    for line in out.read_text().splitlines():
        stack, weight = line.rsplit(" ", 1)
        parsed[tuple(reversed(stack.split(";")))] = int(weight)  # root first on disk: back to callee first
    assert parsed[tuple(ALLOC)] == len(episodes()) * 40_000
    assert parsed[tuple(FETCH)] == 30 * 5_000
    assert set(parsed) == {tuple(ALLOC), tuple(FETCH), tuple(FORWARD)}
    window = export(
        store,
        tmp_path / "w.folded",
        "--rank",
        str(LATE_RANK),
        "--start",
        "1789999990000000000",
        "--end",
        "2026-09-21T14:14:00Z",
    )
    assert window.returncode == 0, window.stderr
    assert (tmp_path / "w.folded").read_text() == out.read_text()
    assert export(store, tmp_path / "x", "--rank", "3", "--causal-chain-id", "w0rld:4").returncode == 2


def test_pprof_export_decodes_with_the_right_sample_values(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "late.pb.gz"
    done = export(
        store,
        out,
        "--node-id",
        "node-1",
        "--rank",
        str(LATE_RANK),
        "--causal-chain-id",
        "w0rld:4",
        "--format",
        "pprof",
    )
    assert done.returncode == 0, done.stderr
    profile = profile_class()()
    profile.ParseFromString(gzip.decompress(out.read_bytes()))
    strings = list(profile.string_table)
    assert strings[0] == "" and [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [
        ("time", "nanoseconds")
    ]
    functions = {f.id: (strings[f.name], strings[f.filename]) for f in profile.function}
    locations = {loc.id: loc.line[0] for loc in profile.location}

    def frame(location_id: int) -> str:
        line = locations[location_id]
        name, filename = functions[line.function_id]
        return f"{filename}:{name}:{line.line}" if filename else name

    samples = {
        tuple(frame(i) for i in s.location_id): (
            list(s.value),
            {strings[lb.key]: strings[lb.str] for lb in s.label},
        )
        for s in profile.sample
    }
    assert samples[tuple(ALLOC)] == ([40_000_000], {"category": "allocator"})
    assert samples[tuple(FETCH)] == ([5_000_000], {"category": "sleeping"})
    assert set(samples) == {tuple(ALLOC), tuple(FETCH), tuple(FORWARD)}
