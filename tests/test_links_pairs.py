"""Slow-link localisation by send/recv pairs (echo/queries/layers/65_links.sql) on a synthetic job whose
truth is exact: a 3-stage pipeline over three nodes (stage k = node k) whose send/recv rows are written into
the collectives table beside a synthetic all-reduce job. A rank's own slow link is named by rank (its slow
pairs have two partners), a node's NIC by node, a slowdown in one direction only (a GPU that reaches its
send late) names nothing, and neither does a healthy pipeline."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import pytest
from analysis_helpers import query

from rankecho.echo.store.migrate import migrate
from rankecho.sim.synthetic import SynNode, SyntheticJob, write_job

NODES = (SynNode("a", 2), SynNode("b", 2, offset_ms=-30.0), SynNode("c", 2))
NODE_OF = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
OFFSET_NS = {"a": 0, "b": -30_000_000, "c": 0}
PAIRS = [(0, 2), (2, 4), (1, 3), (3, 5)]
"""Forward (sender, receiver) pairs of the two pipelines {0, 2, 4} and {1, 3, 5}; backward goes back."""
SLOW_STEPS = [5, 10, 15, 20, 25]
HEALTHY_NS, SLOW_NS = 2_000_000, 42_000_000


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    with duckdb.connect(":memory:") as connection:
        migrate(connection)
        write_job(connection, SyntheticJob(nodes=NODES, steps=30, step_ms=90.0, tp_size=2))
        yield connection


def step_enters(con: duckdb.DuckDBPyConnection) -> dict[tuple[int, int], int]:
    """(rank, step) -> the rank's first all-reduce call of the step (node clock), steps by call order."""
    rows = con.execute(
        "SELECT rank, enter_ns FROM collectives WHERE op = 'ncclAllReduce' ORDER BY rank, enter_ns"
    ).fetchall()
    out: dict[tuple[int, int], int] = {}
    calls: dict[int, list[int]] = {}
    for rank, enter in rows:
        calls.setdefault(rank, []).append(enter)
    for rank, enters in calls.items():
        per_step = len(enters) // 30
        for step in range(30):
            out[(rank, step)] = enters[step * per_step]
    return out


def write_pairs(con: duckdb.DuckDBPyConnection, slow: Any) -> None:
    """Every step, each forward pair then its backward pair, 20 and 10 ms before the step's all-reduce (true
    time); ``slow(step, src, dst)`` says whether that transfer takes SLOW_NS instead of HEALTHY_NS."""
    enters = step_enters(con)
    rows = []
    for step in range(30):
        for direction, before_ms in ((1, 20), (-1, 10)):
            for a, b in PAIRS:
                src, dst = (a, b) if direction == 1 else (b, a)
                true_enter = enters[(src, step)] - OFFSET_NS[NODE_OF[src]] - before_ms * 1_000_000
                done = true_enter + (SLOW_NS if slow(step, src, dst) else HEALTHY_NS)
                chain = f"pp{a % 2}.{src // 2}>{dst // 2}:{step}"
                for rank, op in ((src, "ncclSend"), (dst, "ncclRecv")):
                    off = OFFSET_NS[NODE_OF[rank]]
                    rows.append(
                        (
                            f"{chain}/{op}",
                            "synthetic",
                            NODE_OF[rank],
                            rank,
                            op,
                            f"pp{a % 2}",
                            step,
                            true_enter + off,
                            done + off,
                            chain,
                            "",
                        )
                    )
    con.executemany(
        "INSERT INTO collectives (event_id_sent, cluster_id, node_id, rank, op, comm_id, seq, enter_ns, "
        "complete_ns, causal_chain_id, job_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )


def links(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    return query(con, "SELECT * FROM rk_links(NULL, NULL, NULL, 20) WHERE significant")


def test_a_ranks_own_link_is_named_by_rank(con: duckdb.DuckDBPyConnection) -> None:
    write_pairs(con, lambda step, src, dst: step in SLOW_STEPS and 3 in (src, dst))
    [link] = links(con)
    assert (link["node_id"], link["rank"], link["ranks"]) == ("b", 3, [3])
    assert [e["step"] for e in link["episode_list"]] == SLOW_STEPS
    assert all(e["ranks"] == [1, 3, 5] for e in link["episode_list"])
    assert link["median_late_ms"] == pytest.approx(40, abs=1)
    assert link["inter_node"] is True and link["period"] == 5 and link["communicators"] == ["pp1"]
    assert query(con, "SELECT * FROM rk_stragglers(NULL, NULL, NULL, 20) WHERE significant") == []


def test_a_slow_nic_is_named_by_node(con: duckdb.DuckDBPyConnection) -> None:
    write_pairs(con, lambda step, src, dst: step in SLOW_STEPS and "b" in (NODE_OF[src], NODE_OF[dst]))
    [link] = links(con)
    assert (link["node_id"], link["rank"], link["ranks"]) == ("b", None, [2, 3])
    assert [e["step"] for e in link["episode_list"]] == SLOW_STEPS


@pytest.mark.parametrize(
    "slow",
    [lambda step, src, dst: False, lambda step, src, dst: step in SLOW_STEPS and dst == 3],
    ids=["healthy", "one-direction"],
)
def test_no_link_where_pairs_are_usual_or_slow_one_way_only(
    con: duckdb.DuckDBPyConnection, slow: Any
) -> None:
    write_pairs(con, slow)
    assert links(con) == []


def test_one_slow_pair_names_the_link_between_its_nodes(con: duckdb.DuckDBPyConnection) -> None:
    """One slow rank pair (as in a two-stage pipeline, where a rank has one partner): both ends are as
    suspect, so no rank is named, and the two nodes are one link between them."""
    write_pairs(con, lambda step, src, dst: step in SLOW_STEPS and {src, dst} == {1, 3})
    [link] = links(con)
    assert (link["node_id"], link["peer_node_id"], link["rank"]) == ("a", "b", None)
    assert link["ranks"] == [0, 1, 2, 3]
    assert [e["step"] for e in link["episode_list"]] == SLOW_STEPS
