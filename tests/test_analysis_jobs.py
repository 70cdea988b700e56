"""The analysis layers keep jobs apart (the ``job`` parameter of rk_collective_rows, passed up through
every layer): two jobs with the same ranks, pids and communicator ids, one right after the other, each
with its own straggler, diagnosed apart; data without job ids ('') analysed as before."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest
from analysis_helpers import query

from rankecho.echo.store.migrate import migrate
from rankecho.sim.synthetic import SynFault, SynNode, SyntheticJob, write_job

NODES = (SynNode("a", 4), SynNode("b", 4, 20.0))
STEPS = 80
T0 = 1_790_000_000_000_000_000
FIRST = SyntheticJob(nodes=NODES, steps=STEPS, faults=(SynFault(rank=5, ms=30, every=7, start_step=3),),
                     job_id="torchelastic:first", t0_ns=T0)  # fmt: skip
SECOND = SyntheticJob(nodes=NODES, steps=STEPS, faults=(SynFault(rank=2, ms=30, every=5, start_step=2),),
                      job_id="torchelastic:second", t0_ns=T0 + 6 * 10**9, seed=2)  # fmt: skip


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    with duckdb.connect(":memory:") as connection:
        migrate(connection)
        yield connection


def stragglers(con: duckdb.DuckDBPyConnection, job: str | None) -> dict[int, list[int]]:
    arg = "NULL" if job is None else f"'{job}'"
    rows = query(con, "SELECT rank, episode_list FROM rk_stragglers(NULL, NULL, NULL, job := "
                      f"{arg}) WHERE significant AND kind = 'rank'")  # fmt: skip
    return {r["rank"]: [e["step"] for e in r["episode_list"]] for r in rows}


def test_two_jobs_on_the_same_ranks_one_after_the_other_are_diagnosed_apart(
    con: duckdb.DuckDBPyConnection,
) -> None:
    write_job(con, FIRST)
    write_job(con, SECOND)
    assert query(con, "SELECT job_id, count(*) AS n FROM collectives GROUP BY 1 ORDER BY 1") == [
        {"job_id": "torchelastic:first", "n": STEPS * 8 * 3},
        {"job_id": "torchelastic:second", "n": STEPS * 8 * 3},
    ]
    first, second = stragglers(con, FIRST.job_id), stragglers(con, SECOND.job_id)
    assert list(first) == [5] and first[5] == FIRST.late_steps(5)
    assert list(second) == [2] and second[2] == SECOND.late_steps(2)
    steps = "SELECT max(step) + 1 AS steps FROM rk_arrivals(NULL, NULL, NULL, job := 'torchelastic:second')"
    assert query(con, steps) == [{"steps": STEPS}]
    # Unfiltered, the two jobs' instances share ids (same comms, same seqs) and mix: that is the bug.
    assert stragglers(con, None) != {5: FIRST.late_steps(5), 2: SECOND.late_steps(2)}


def test_a_job_alone_gives_the_same_answer_with_and_without_its_filter(
    con: duckdb.DuckDBPyConnection,
) -> None:
    write_job(con, SyntheticJob(nodes=NODES, steps=STEPS, faults=FIRST.faults))  # no job id: ''
    assert query(con, "SELECT DISTINCT job_id FROM collectives") == [{"job_id": ""}]
    everything = query(con, "SELECT * FROM rk_stragglers(NULL, NULL, NULL) ORDER BY ALL")
    assert everything == query(con, "SELECT * FROM rk_stragglers(NULL, NULL, NULL, job := '') ORDER BY ALL")
    assert stragglers(con, "") == {5: FIRST.late_steps(5)}
    assert stragglers(con, "torchelastic:other") == {}
