"""The GPU side of the lateness layer (echo/queries/layers/30_lateness.sql) on synthetic events whose
truth is exact: a GPU slow now and then is named from the delay it adds to healthy instances; a GPU slow
at every step, where no instance is healthy, from the lateness its longer sync implies; a healthy job,
and a rank whose host is late at every step, are not named for their GPU."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest
from analysis_helpers import late_steps, query

from rankecho.echo.store.migrate import migrate
from rankecho.sim.synthetic import SynFault, SynNode, SyntheticJob, write_job

NODES = (SynNode("a", 4), SynNode("b", 4, offset_ms=-30.0))


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    with duckdb.connect(":memory:") as connection:
        migrate(connection)
        yield connection


def named(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, int | None], dict[str, object]]:
    rows = query(
        con,
        "SELECT kind, node_id, rank, side, cause, median_late_ms "
        "FROM rk_stragglers(NULL, NULL, NULL) WHERE significant",
    )
    return {(r["node_id"], r["rank"]): r for r in rows}


def test_a_gpu_slow_at_every_step_is_named_from_its_longer_sync(con: duckdb.DuckDBPyConnection) -> None:
    """Its host calls 8 ms late (the longer sync), under the threshold: only the GPU rule can name it."""
    job = SyntheticJob(nodes=NODES, steps=90, step_ms=90.0, faults=(SynFault(rank=6, ms=24, kind="gpu"),))
    write_job(con, job)
    assert late_steps(con) == {("rank", "b", 6): list(range(1, 90))}  # step 0 has no previous step
    found = named(con)[("b", 6)]
    assert (found["side"], found["cause"]) == ("gpu", "slow_gpu")
    assert found["median_late_ms"] == pytest.approx(24, abs=3)
    rows = query(
        con,
        "SELECT bool_or(host_late) AS host, count(gpu_late_ns) AS gpu, "
        "min(delay_ns) FILTER (WHERE gpu_late_ns IS NOT NULL) AS delay "
        "FROM rk_lateness(NULL, NULL, NULL) WHERE rank = 6 AND on_primary AND pos = 0",
    )
    assert rows[0]["host"] is False and rows[0]["gpu"] == 89
    assert rows[0]["delay"] >= 20e6, "the others' wait (the imposed cost) is the implied lateness"


def test_a_node_of_slow_gpus_at_every_step_is_named_as_the_node(con: duckdb.DuckDBPyConnection) -> None:
    faults = tuple(SynFault(rank=r, ms=24, kind="gpu") for r in range(4))
    write_job(con, SyntheticJob(nodes=NODES, steps=60, step_ms=90.0, faults=faults))
    assert late_steps(con) == {("node", "a", None): list(range(1, 60))}


def test_a_gpu_slow_now_and_then_is_named_at_those_steps(con: duckdb.DuckDBPyConnection) -> None:
    fault = SynFault(rank=2, ms=40, every=9, start_step=4, kind="gpu")
    job = SyntheticJob(nodes=NODES, steps=100, faults=(fault,))
    write_job(con, job)
    assert late_steps(con) == {("rank", "a", 2): job.late_steps(2)}
    assert named(con)[("a", 2)]["cause"] == "slow_gpu"


@pytest.mark.parametrize(
    "faults",
    [(), (SynFault(rank=3, ms=30),)],
    ids=["healthy", "host-late-every-step"],
)
def test_no_gpu_is_named_without_a_slow_gpu(
    con: duckdb.DuckDBPyConnection, faults: tuple[SynFault, ...]
) -> None:
    job = SyntheticJob(nodes=NODES, steps=80, faults=faults)
    write_job(con, job)
    gpu = query(con, "SELECT count(*) AS n FROM rk_lateness(NULL, NULL, NULL) WHERE gpu_late_ns IS NOT NULL")
    assert gpu == [{"n": 0}]
    assert late_steps(con) == ({("rank", "a", 3): list(range(80))} if faults else {})


def test_a_fault_kind_other_than_host_or_gpu_is_refused(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ValueError, match="use 'host' or 'gpu'"):
        write_job(con, SyntheticJob(nodes=NODES, faults=(SynFault(rank=1, ms=5, kind="disk"),)))
