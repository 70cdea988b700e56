"""Jobs on the simulator with the real agent: two jobs at once on the same two nodes (different
TORCHELASTIC_RUN_IDs and ports, one agent per node tracing both), and on one node a job that starts right
after another on the same ranks and port with no run id (the rendezvous rule's generations). Each job's
straggler is diagnosed apart (fleet.cluster.jobs / find_stragglers with job_id)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, row_dicts
from test_agent_helpers import requires_ebpf, sim_built

from rankecho.echo.app import Echo
from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.sim.job import SimJob, stop_all

pytestmark = [requires_ebpf, pytest.mark.ebpf]

STEPS = 24
ARGS = ["--steps", str(STEPS), "--compute-us", "20000", "--kernels", "4", "--loader-us", "1000"]
LATE = "dataloader_stall:120:3:2:0"  # 120 ms late at steps 2, 5, 8, ... asleep: takes no CPU


def late_steps() -> list[int]:
    return list(range(2, STEPS, 3))


def investigation(echo: Echo) -> Investigation:
    return Investigation(echo.reader, load_rates())


def stragglers(found: dict[str, Any]) -> list[int]:
    """The ranks named on their own (two jobs on two shared cores can also make a whole node late)."""
    return [s["rank"] for s in found["stragglers"] if s["kind"] == "rank"]


@pytest.fixture(scope="module")
def concurrent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("two-jobs")
    with inproc_echo(tmp / "echo.db") as echo:
        sim = SimJob(tmp, ["node-a", "node-b"], 2, sim_built())
        agents = sim.start_agents(echo.grpc_address, TEST_TOKEN)
        other = sim.another_run("other-")
        first = sim.start_ranks(ARGS, {1: ["--fault", LATE]})
        second = sim.start_ranks(ARGS, {2: ["--fault", LATE]}, run=other)
        sim.wait(first + second)
        stop_all(agents)
        inv = investigation(echo)
        ids = (f"torchelastic:{sim.run_id}", f"torchelastic:{other.run_id}")
        yield {"inv": inv, "ids": ids, "echo": echo}


def test_two_jobs_at_once_on_the_same_nodes_are_listed_and_diagnosed_apart(
    concurrent: dict[str, Any],
) -> None:
    # Not asserted: every agent exiting 0 (test_agent_sim.py checks that); under a loaded machine an agent
    # tracing two jobs may overrun stop_all's grace and be killed after its data is in Echo.
    inv, (first, second) = concurrent["inv"], concurrent["ids"]
    jobs = {j["job_id"]: j for j in inv.jobs.list()["jobs"]}
    assert set(jobs) == {first, second}
    for job in jobs.values():
        assert (job["ranks"], job["world_size"], job["nodes"]) == (4, 4, ["node-a", "node-b"])
        assert job["steps"] >= STEPS - 2
    a = inv.diagnosis.find_stragglers(job_id=first)
    b = inv.diagnosis.find_stragglers(job_id=second)
    # Each job's top straggler is the rank planted in it (a loaded 2-core machine may add a minor one)
    assert (a["job_id"], stragglers(a)[:1]) == (first, [1]), [x["summary"] for x in a["stragglers"]]
    assert (b["job_id"], stragglers(b)[:1]) == (second, [2]), [x["summary"] for x in b["stragglers"]]
    steps = [e["step"] for e in a["stragglers"][0]["episodes"]]
    # the planted steps (a loaded machine may add a late step or two of its own)
    assert len(set(steps) & set(late_steps())) >= len(late_steps()) - 2
    assert "rank 1 on node-a" in jobs[first]["stragglers"]
    assert "rank 2 on node-b" in jobs[second]["stragglers"]


def test_every_typed_row_of_a_rank_has_its_jobs_id(concurrent: dict[str, Any]) -> None:
    rows = row_dicts(concurrent["echo"], "SELECT DISTINCT job_id FROM collectives")
    assert {r["job_id"] for r in rows} == set(concurrent["ids"])
    untagged = row_dicts(concurrent["echo"], "SELECT count(*) AS n FROM host_activity WHERE job_id = ''")
    assert untagged == [{"n": 0}]


def test_a_job_right_after_another_on_the_same_ranks_and_port_is_another_job(tmp_path: Path) -> None:
    with inproc_echo(tmp_path / "echo.db") as echo:
        sim = SimJob(tmp_path, ["node-a"], 3, sim_built(), run_id=None)  # no run id: rendezvous rule
        agents = sim.start_agents(echo.grpc_address, TEST_TOKEN)
        sim.wait(sim.start_ranks(ARGS, {1: ["--fault", LATE]}))
        again = sim.another_run("again-", run_id=None, port=sim.master_port)
        sim.wait(sim.start_ranks(ARGS, {2: ["--fault", LATE]}, run=again))
        stop_all(agents)
        inv = investigation(echo)
        listed = inv.jobs.list()["jobs"]
        assert len(listed) == 2, listed
        newer, older = (j["job_id"] for j in listed)
        prefix = f"127.0.0.1:{sim.master_port}@"
        assert newer.startswith(prefix) and older.startswith(prefix) and older < newer
        assert all(j["ranks"] == 3 and j["steps"] >= STEPS - 2 for j in listed)
        latest = inv.diagnosis.find_stragglers()
        assert (latest["job_id"], stragglers(latest)) == (newer, [2])
        assert stragglers(inv.diagnosis.find_stragglers(job_id=older)) == [1]
