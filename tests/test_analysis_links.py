"""The slow-link layer (echo/queries/layers/65_links.sql) on synthetic events whose truth is exact: a
transfer slower now and then for every rank is a link: over two nodes the link between the two (the world
is the only communicator over both, slow for all alike), over three not localised; two nodes of three
finishing the slow steps late are one link between the two; a healthy job, a late host and a slow GPU are
not links."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import pytest
from analysis_helpers import query

from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.report import render_stragglers
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.reader import Reader
from rankecho.sim.synthetic import SynFault, SynNode, SyntheticJob, write_job

NODES = (SynNode("a", 4), SynNode("b", 4, offset_ms=-30.0))
THREE = (*NODES, SynNode("c", 4))


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    with duckdb.connect(":memory:") as connection:
        migrate(connection)
        yield connection


def links(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    return query(con, "SELECT * FROM rk_links(NULL, NULL, NULL) WHERE significant")


def test_a_transfer_slow_for_everyone_is_a_link_not_a_straggler(con: duckdb.DuckDBPyConnection) -> None:
    fault = SynFault(rank=5, ms=40, every=6, start_step=3, kind="link")
    job = SyntheticJob(nodes=NODES, steps=60, step_ms=90.0, faults=(fault,))
    write_job(con, job)
    [link] = links(con)
    assert (link["kind"], link["rank"], link["cause"]) == ("link", None, "slow_link")
    assert (link["node_id"], link["peer_node_id"], link["ranks"]) == ("a", "b", list(range(8)))
    assert [e["step"] for e in link["episode_list"]] == job.late_steps(5)
    assert link["median_late_ms"] == pytest.approx(40, abs=4)
    assert link["period"] == 6 and link["period_confidence"] == 1
    assert link["inter_node"] is True
    assert link["imposed_gpu_s"] == pytest.approx(len(job.late_steps(5)) * 8 * 0.040, rel=0.15)
    assert query(con, "SELECT * FROM rk_stragglers(NULL, NULL, NULL) WHERE significant") == []


@pytest.mark.parametrize(
    "faults",
    [(), (SynFault(rank=5, ms=60, every=7, start_step=2),), (SynFault(rank=2, ms=50, every=5, kind="gpu"),)],
    ids=["healthy", "late-host", "slow-gpu"],
)
def test_no_link_where_every_transfer_is_usual(
    con: duckdb.DuckDBPyConnection, faults: tuple[SynFault, ...]
) -> None:
    write_job(con, SyntheticJob(nodes=NODES, steps=60, step_ms=90.0, faults=faults))
    assert links(con) == []


def test_find_stragglers_reports_a_link_only_when_asked(con: duckdb.DuckDBPyConnection) -> None:
    """Links cost a second pass over the window: find_stragglers runs it with links=True (the MCP tool's
    `links`, `rankecho diagnose`, evaluate), and the frequent callers (exporter, timeline) leave it out."""
    fault = SynFault(rank=5, ms=40, every=6, start_step=3, kind="link")
    write_job(con, SyntheticJob(nodes=NODES, steps=60, step_ms=90.0, faults=(fault,)))
    diagnosis = Investigation(Reader(con), load_rates()).diagnosis
    without = diagnosis.find_stragglers(stacks=False)
    assert without["stragglers"] == [] and without["clusters"][0]["verdict"].startswith("no straggler")
    asked = diagnosis.find_stragglers(stacks=False, links=True)
    [link] = asked["stragglers"]
    assert (link["kind"], link["node_id"], link["peer_node_id"], link["rank"]) == ("link", "a", "b", None)
    assert asked["clusters"][0]["verdict"] == "1 straggler: a slow inter-node link between node a and node b"
    assert "nccl-tests between node a and node b" in link["next_step"]
    text = render_stragglers(asked)  # what `rankecho diagnose` prints
    assert link["summary"] in text and "link a<->b" in text


def test_a_link_slow_for_every_node_of_three_is_not_localised(con: duckdb.DuckDBPyConnection) -> None:
    """Three nodes finishing alike single out no node and no pair: the link is reported, not localised."""
    fault = SynFault(rank=5, ms=40, every=6, start_step=3, kind="link")
    job = SyntheticJob(nodes=THREE, steps=60, step_ms=90.0, faults=(fault,))
    write_job(con, job)
    [link] = links(con)
    assert (link["node_id"], link["peer_node_id"], link["rank"], link["ranks"]) == (None, None, None, [])
    assert link["inter_node"] is True and [e["step"] for e in link["episode_list"]] == job.late_steps(5)


def test_two_nodes_finishing_late_are_one_link_between_them(con: duckdb.DuckDBPyConnection) -> None:
    """At each slow step the ranks of nodes a and b finish 15 ms after node c's: both nodes are named, and
    they are one link between the two, whose imposed cost is not split between them."""
    fault = SynFault(rank=5, ms=40, every=6, start_step=3, kind="link")
    job = SyntheticJob(nodes=THREE, steps=60, step_ms=90.0, faults=(fault,))
    write_job(con, job)
    slow = job.late_steps(5)
    con.execute(  # every call of a rank on a or b at a slow step completes 15 ms later (3 calls per step)
        "UPDATE collectives c SET complete_ns = c.complete_ns + 15000000 FROM (SELECT event_id_sent, rank, "
        "(row_number() OVER (PARTITION BY rank ORDER BY enter_ns) - 1) // 3 AS step FROM collectives) s "
        "WHERE s.event_id_sent = c.event_id_sent AND s.rank < 8 AND list_contains(?, s.step)",
        [slow],
    )
    [link] = links(con)
    assert (link["node_id"], link["peer_node_id"], link["rank"]) == ("a", "b", None)
    assert link["ranks"] == list(range(8))
    assert [e["step"] for e in link["episode_list"]] == slow and link["period"] == 6
    assert all(e["ranks"] == list(range(8)) for e in link["episode_list"])
    late_s = sum(e["late_by_ms"] for e in link["episode_list"]) / 1e3
    assert link["imposed_gpu_s"] == pytest.approx(late_s * 12, rel=0.05)  # all 12 ranks waited, one link
