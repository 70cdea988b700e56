"""The stack analysis (echo/queries/layers/70_stacks.sql) on the scenario of tests/test_echo_stacks.py,
ingested by a real Echo: a rank's top stacks weighted by time, the differential view that picks the late
rank's distinctive stack against its peers', and find_stragglers' cause with its leading frames (also as
`rankecho diagnose` prints it), with raw intervals and with the agent's breakdown alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_echo_stacks import (
    ALLOC,
    ALLOC_LEAD,
    FETCH,
    FORWARD,
    LATE_NS,
    LATE_RANK,
    NEVER_SHIPPED,
    STEPS,
    episodes,
    scenario_store,
)

from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.store.reader import Reader
from rankecho.shared.stacks import stack_id


@pytest.fixture(scope="module", params=[True, False], ids=["intervals", "breakdown-only"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario_store(tmp_path_factory.mktemp("stacks") / "s.db", intervals=request.param)


def investigation(path: Path) -> tuple[Investigation, duckdb.DuckDBPyConnection]:
    con = duckdb.connect(str(path), read_only=True)
    return Investigation(Reader(con), load_rates()), con


def query(inv: Investigation, sql: str) -> list[dict[str, Any]]:
    result = inv.reader.query(sql, max_rows=10_000, max_bytes=1 << 26, timeout_s=60)
    return [dict(zip(result.columns, r, strict=True)) for r in result.rows]


def test_a_ranks_top_stacks_are_weighted_by_the_time_they_carried(store: Path) -> None:
    inv, con = investigation(store)
    with con:
        out = inv.stacks.rank("node-1", LATE_RANK)
        by_id = {s["stack_id"]: s for s in out["stacks"]}
        alloc = by_id[stack_id(ALLOC)]
        # 40 ms at each late step, counted once whether raw intervals, the breakdown or both say it
        assert alloc["ms"] == pytest.approx(len(episodes()) * LATE_NS / 1e6)
        assert alloc["category"] == "allocator" and alloc["leading_frames"] == ALLOC_LEAD
        assert alloc["frames"] == ALLOC and alloc["truncated"] is False
        assert by_id[stack_id(FETCH)]["ms"] == pytest.approx(STEPS * 5.0)
        assert by_id[stack_id(FETCH)]["ms_by_category"] == {"sleeping": pytest.approx(STEPS * 5.0)}
        assert by_id[stack_id(FORWARD)]["category"] == "host_compute"
        assert [s["ms"] for s in out["stacks"]] == sorted((s["ms"] for s in out["stacks"]), reverse=True)
        assert out["total_ms"] == pytest.approx(sum(s["ms"] for s in out["stacks"]), abs=0.01)


def test_a_stack_cited_but_never_stored_comes_back_without_frames(store: Path) -> None:
    inv, con = investigation(store)
    with con:
        out = inv.stacks.rank("node-0", 1)
        [unknown] = [s for s in out["stacks"] if s["stack_id"] == stack_id(NEVER_SHIPPED)]
        assert unknown["frames"] is None and unknown["leading_frames"] is None
        assert unknown["folded"].startswith(f"[stack {stack_id(NEVER_SHIPPED)}] ")


def test_the_differential_view_picks_the_late_ranks_distinctive_stack(store: Path) -> None:
    inv, con = investigation(store)
    with con:
        for seq in episodes():
            out = inv.explainer.explain_straggler("node-1", LATE_RANK, causal_chain_id=f"w0rld:{seq}")
            view = out["stacks"]
            assert view["peers_compared"] == 3 and view["leading_frames"] == ALLOC_LEAD
            [distinct] = view["distinctive"]  # the data loader and forward ran on every rank alike
            assert distinct["stack_id"] == stack_id(ALLOC) and distinct["category"] == "allocator"
            assert distinct["rank_ms"] == pytest.approx(40.0) and distinct["peers_mean_ms"] == 0.0
            assert distinct["peers_with"] == 0 and distinct["excess_ms"] == pytest.approx(40.0)
            assert {s["stack_id"] for s in view["rank_top"]} >= {stack_id(ALLOC), stack_id(FORWARD)}
        on_time = inv.explainer.explain_straggler("node-1", LATE_RANK, causal_chain_id="w0rld:5")["stacks"]
        assert on_time["distinctive"] == [] and on_time["leading_frames"] is None


def test_the_differential_layer_on_its_own(store: Path) -> None:
    """rk_stack_diff with windows built by hand from the agents' pre-call windows at one late instance."""
    inv, con = investigation(store)
    with con:
        calls = query(
            inv,
            "SELECT node_id, rank, pid, tid, enter_ns, pre_window_ns FROM collectives "
            "WHERE causal_chain_id = 'w0rld:4' ORDER BY rank",
        )
        ws = ", ".join(
            f"{{'w': {c['rank']}, 'role': '{'target' if c['rank'] == LATE_RANK else 'peer'}', "
            f"'cluster_id': 'c1', 'node_id': '{c['node_id']}', 'pid': {c['pid']}, 'tid': {c['tid']}, "
            f"'from_ns': {c['enter_ns'] - c['pre_window_ns']}, 'to_ns': {c['enter_ns']}}}"
            for c in calls
        )
        rows = query(inv, f"SELECT * FROM rk_stack_diff([{ws}])")
        top = rows[0]
        assert top["stack_id"] == stack_id(ALLOC) and top["distinctive"] and top["peers"] == 3
        assert top["target_ms"] == pytest.approx(40.0) and top["excess_ms"] == pytest.approx(40.0)
        assert not any(r["distinctive"] for r in rows[1:])


def test_find_stragglers_cause_carries_the_leading_frames(store: Path) -> None:
    inv, con = investigation(store)
    with con:
        out = inv.diagnosis.find_stragglers()
    [s] = out["stragglers"]
    assert (s["node_id"], s["rank"], s["cause"]["class"]) == ("node-1", LATE_RANK, "allocator")
    assert s["cause"]["leading_frames"] == ALLOC_LEAD
    assert s["cause"]["stack"]["stack_id"] == stack_id(ALLOC)
    assert s["cause"]["stack"]["ms"] == pytest.approx(len(episodes()) * LATE_NS / 1e6)
    assert f"at {ALLOC_LEAD}." in s["summary"]


def test_rankecho_diagnose_prints_the_leading_frames(store: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rankecho", "diagnose", "--db", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"(allocator) (40 ms vs the peers' 0 ms), at {ALLOC_LEAD}." in done.stdout
