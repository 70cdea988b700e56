"""The slow-link layer (echo/queries/layers/65_links.sql) on synthetic events whose truth is exact: a
transfer slower now and then for every rank is a link (not localised: the world is the only communicator
over both nodes, slow for all alike); a healthy job, a late host and a slow GPU are not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import pytest
from analysis_helpers import query

from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.echo.store.migrate import migrate
from rankecho.echo.store.reader import Reader
from rankecho.sim.synthetic import SynFault, SynNode, SyntheticJob, write_job

NODES = (SynNode("a", 4), SynNode("b", 4, offset_ms=-30.0))


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
    assert (link["kind"], link["node_id"], link["rank"], link["cause"]) == ("link", None, None, "slow_link")
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
    assert (link["kind"], link["node_id"], link["rank"]) == ("link", None, None)
    assert asked["clusters"][0]["verdict"] == "1 straggler: a slow inter-node link (not localised to a node)"
