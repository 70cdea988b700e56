"""The agent on the simulator: 8 ranks on 2 nodes, one real agent per node, a real Echo.

Node ``node-b`` runs the endbr64 build of the fake libraries, so the same job also shows that probes
placed past ``endbr64`` give the same events as plain prologues. Rank 5 is made a straggler
(``host_compute`` fault on two steps) and must show up as its peers' wait.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, row_dicts
from test_agent_helpers import attrs, rank_pids, requires_ebpf, sim_built, step_lines

from rankecho.shared import contract as c
from rankecho.sim.job import SimJob, stop_all

pytestmark = [requires_ebpf, pytest.mark.ebpf]

STEPS = 8
BUCKETS = 2
STRAGGLER = 5
STRAGGLE_MS = 150
SIM_ARGS = ["--steps", str(STEPS), "--compute-us", "20000", "--kernels", "9", "--buckets", str(BUCKETS),
            "--loader-us", "3000", "--split", "half:4:0:1048576"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("agent-sim")
    with inproc_echo(tmp / "echo.db") as echo:
        sim = SimJob(tmp, ["node-a", "node-b"], 4, sim_built(), endbr_nodes=("node-b",))
        # Every raw interval and every step's health score: this module checks what the probes capture
        # (what goes out as evidence by default is agent/window.py's, tested in test_agent_window.py).
        everything = ("--raw-interval-ms", "0", "--health-every", "1")
        agents = sim.start_agents(echo.grpc_address, TEST_TOKEN, *everything)
        fault = {STRAGGLER: ["--fault", f"host_compute:{STRAGGLE_MS}:4:2:0"]}
        sim.wait(sim.start_ranks(SIM_ARGS, fault))
        codes = stop_all(agents)
        logs = {r: sim.rank_log(r) for r in range(sim.world)}
        data = row_dicts(echo, "SELECT * FROM events")
        yield {"codes": codes, "agents": agents, "logs": logs, "events": data, "world": sim.world,
               "run_id": sim.run_id}


def by_metric(job: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    return [r for r in job["events"] if r["metric_name"] == metric]


def test_agents_exit_zero_and_endbr_probes_skip_the_prologue(job: dict[str, Any]) -> None:
    assert job["codes"] == [0, 0]
    logs = [a.log.read_text() for a in job["agents"]]
    assert "(0 past endbr64)" in logs[0]
    assert "past endbr64" in logs[1] and "(0 past endbr64)" not in logs[1], logs[1]
    for log in logs:
        # Every exported sim function begins with push %rbp (sim/Makefile: -fno-shrink-wrap, no sibling
        # calls, SIM_ENTRY_FRAME; tests/test_sim_prologues.py), whichever build: no probe is single-stepped,
        # so no warning. (The warning itself: tests/test_agent_discovery.py, on a FRAME_POINTERS= build.)
        warnings = [line for line in log.splitlines() if "single-steps on every call" in line]
        assert warnings == [], log


def test_every_collective_of_every_rank_arrives_once(job: dict[str, Any]) -> None:
    colls = by_metric(job, c.M_COLLECTIVE)
    per_rank = Counter(r["rank"] for r in colls)
    expected = STEPS * (BUCKETS + 1)  # world all-reduce buckets + one on the split comm
    assert per_rank == {rank: expected for rank in range(job["world"])}
    ids = [r["event_id"] for r in colls]
    assert len(ids) == len(set(ids))
    keys = Counter((r["rank"], r["causal_chain_id"]) for r in colls)
    assert max(keys.values()) == 1


def test_same_causal_chain_id_on_all_ranks_and_correct_identity(job: dict[str, Any]) -> None:
    colls = by_metric(job, c.M_COLLECTIVE)
    members: dict[str, set[int]] = defaultdict(set)
    for r in colls:
        a = attrs(r)
        assert r["causal_chain_id"] == c.causal_chain_id(a[c.COMM_ID], a[c.SEQ])
        assert a[c.SEQ_ALIGNED] is True
        assert r["nranks"] == job["world"]
        members[r["causal_chain_id"]].add(r["rank"])
    world = set(range(job["world"]))
    full = [k for k, v in members.items() if v == world]
    halves = [v for v in members.values() if v != world]
    assert len(full) == STEPS * BUCKETS
    assert sorted(map(sorted, {frozenset(v) for v in halves})) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # The resource pid of each rank is the pid that rank's own log reports.
    pids = dict(rank_pids(log) for log in job["logs"].values())
    for r in colls:
        assert attrs(r)[c.PROCESS_PID] == pids[r["rank"]]


def test_completion_later_than_enter_and_enter_matches_the_rank_clock(job: dict[str, Any]) -> None:
    colls = by_metric(job, c.M_COLLECTIVE)
    for r in colls:
        a = attrs(r)
        assert a[c.ENTER_NS] == r["timestamp_ns"]
        assert a[c.ENTER_NS] <= a[c.RETURN_NS] <= a[c.COMPLETE_NS]
        assert r["value_double"] == pytest.approx((a[c.COMPLETE_NS] - a[c.ENTER_NS]) / 1e6, abs=1e-3)
    # simrank logs the wall time just before its first all-reduce of each step: the agent's enter
    # timestamp (BPF clock converted to Unix ns) must land just after it.
    first = {(r["rank"], attrs(r)[c.SEQ]): attrs(r)[c.ENTER_NS] for r in colls
             if attrs(r).get(c.COMM_NRANKS) == job["world"]}
    for rank, log in job["logs"].items():
        for words in step_lines(log):
            step, enter = int(words[1]), int(words[3])
            ours = first[(rank, step * BUCKETS)]
            assert 0 <= ours - enter < 50_000_000, (rank, step, ours - enter)  # preemption may delay the call


def test_straggler_delay_is_visible_as_the_peers_wait(job: dict[str, Any]) -> None:
    colls = [r for r in by_metric(job, c.M_COLLECTIVE) if attrs(r).get(c.COMM_NRANKS) == job["world"]]
    fired = [int(w[1]) for w in step_lines(job["logs"][STRAGGLER]) if "host_compute" in w[-1]]
    assert fired, "the fault never fired"
    for step in fired:
        chain = [r for r in colls if attrs(r)[c.SEQ] == step * BUCKETS]
        enters = {r["rank"]: r["timestamp_ns"] for r in chain}
        waits = {r["rank"]: r["value_double"] for r in chain}
        assert max(enters, key=lambda k: enters[k]) == STRAGGLER
        assert enters[STRAGGLER] - min(enters.values()) > 0.6 * STRAGGLE_MS * 1e6
        peers = [w for k, w in waits.items() if k != STRAGGLER]
        assert min(peers) > waits[STRAGGLER] + 0.5 * STRAGGLE_MS
        # Its agent summarised the window before the late call: the extra compute is in it, unclassified
        # (host compute), and its peers' windows are shorter by about the same.
        pre = {r["rank"]: attrs(r)[c.PRE_WINDOW_MS] for r in chain}
        assert pre[STRAGGLER] - min(pre.values()) > 0.6 * STRAGGLE_MS, pre
    health = [r for r in by_metric(job, c.M_HEALTH) if r["rank"] == STRAGGLER]
    fired_chains = {r["causal_chain_id"] for r in colls if attrs(r)[c.SEQ] in {s * BUCKETS for s in fired}}
    low = [r for r in health if r["causal_chain_id"] in fired_chains and r["value_double"] < 0.5]
    assert low, "the straggler's health did not drop on the steps it straggled"


def test_offcpu_intervals_come_from_main_and_other_threads(job: dict[str, Any]) -> None:
    off = by_metric(job, c.M_OFFCPU)
    assert off
    pids = dict(rank_pids(log) for log in job["logs"].values())
    tids = {(r["rank"], attrs(r)[c.TID]) for r in off}
    assert any(tid != pids[rank] for rank, tid in tids), "no off-CPU interval from a non-main thread"
    for r in off:
        a = attrs(r)
        assert a[c.OFFCPU_STATE] in ("sleeping", "preempted")
        assert r["value_double"] >= 1.0
    # The data-loader wait (3 ms, sleeping, main thread) shows up on every rank.
    for rank, pid in pids.items():
        assert any(r["rank"] == rank and attrs(r)[c.TID] == pid and attrs(r)[c.OFFCPU_STATE] == "sleeping"
                   for r in off)


def test_every_event_of_a_rank_carries_a_step_chain_id(job: dict[str, Any]) -> None:
    colls = by_metric(job, c.M_COLLECTIVE)
    chains = {r["causal_chain_id"] for r in colls}
    # Windows read after the last step belong to the step that would come next.
    world_comm = {attrs(r)[c.COMM_ID] for r in colls if attrs(r).get(c.COMM_NRANKS) == job["world"]}
    after_last = {c.causal_chain_id(comm, STEPS * BUCKETS) for comm in world_comm}
    for metric in (c.M_CUDA_SYNC, c.M_CUDA_MEMCPY):
        found = by_metric(job, metric)
        assert found, metric
        for r in found:
            assert r["causal_chain_id"] in chains | after_last, (metric, r["causal_chain_id"])
    # Each step's launches end at its first collective and ride on it (rankecho.cuda.launches); the
    # rest (after the last step) come as launch points.
    per_step = [attrs(r)[c.LAUNCHES] for r in colls if c.LAUNCHES in attrs(r)]
    assert len(per_step) >= job["world"] * (STEPS - 1)
    launches = sum(per_step) + sum(r["value_int"] for r in by_metric(job, c.M_KERNEL_LAUNCHES))
    assert launches == job["world"] * STEPS * (9 + 1)  # 9 compute kernels + the optimizer kernel per step


def test_every_rank_event_carries_the_job_identity_from_the_ranks_environment(job: dict[str, Any]) -> None:
    ranked = [r for r in job["events"] if r["rank"] is not None]
    assert {r["rank"] for r in ranked} == set(range(job["world"]))
    jobs = Counter((attrs(r).get(c.JOB_ID), attrs(r).get(c.JOB_SOURCE)) for r in ranked)
    assert list(jobs) == [(f"torchelastic:{job['run_id']}", "torchelastic")], jobs
