"""The agent on a pipeline job: a short scenario with two pipeline stages and FSDP-like collectives run with
one real agent per node into a real Echo. Every rank's ncclSend and ncclRecv arrive in the collectives
table with the peer they named and one causal chain id per send/recv pair (the sender's and receiver's
rows share it, and no other row does); the all-gather and reduce-scatter arrive as world collectives."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, row_dicts
from test_agent_helpers import requires_ebpf, sim_built

from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import parse_scenario

pytestmark = [requires_ebpf, pytest.mark.ebpf]

STEPS = 6
SCENARIO = {
    "cluster_id": "agent-pipeline",
    "steps": STEPS,
    "seed": 2,
    "step": {
        "compute_ms": 8,
        "host_ms": 0.2,
        "dataloader_ms": 0.2,
        "allreduce_mb": 2,
        "pipeline_stages": 2,
        "activation_mb": 4,
        "allgather_mb": 2,
        "reducescatter_mb": 2,
    },
    "nodes": [{"id": "node-a", "ranks": 2}, {"id": "node-b", "ranks": 2}],
}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    sim_built()
    tmp = tmp_path_factory.mktemp("agent-pipeline")
    with inproc_echo(tmp / "echo.db") as echo:
        opts = LaunchOptions(
            run_dir=tmp / "run",
            agent_endpoint=echo.grpc_address,
            token=TEST_TOKEN,
            timeout_s=90,
            progress=None,
        )
        result = run_scenario(parse_scenario(SCENARIO, "pipeline"), opts)
        assert result.returncode == 0 and result.truth is not None
        rows = row_dicts(
            echo,
            "SELECT rank, op, comm_id, seq, comm_rank, causal_chain_id, enter_ns, complete_ns, "
            "event_id FROM collectives WHERE cluster_id = 'agent-pipeline'",
        )
        ids = [r["event_id"] for r in rows if r["op"] in ("ncclSend", "ncclRecv")]
        peers = (
            row_dicts(
                echo,
                "SELECT event_id, attrs_json FROM events WHERE event_id IN ("
                + ",".join(f"'{i}'" for i in ids)
                + ")",
            )
            if ids
            else []
        )
        yield {
            "truth": result.truth,
            "rows": rows,
            "peer": {p["event_id"]: json.loads(p["attrs_json"]).get("rankecho.nccl.peer") for p in peers},
        }


def test_send_and_recv_rows_carry_the_peer_and_pair_by_chain_id(job: dict[str, Any]) -> None:
    p2p = [r for r in job["rows"] if r["op"] in ("ncclSend", "ncclRecv")]
    # 4 ranks, 2 stages: per step each rank sends once and receives once (forward or backward)
    assert Counter(r["op"] for r in p2p) == {"ncclSend": 4 * STEPS, "ncclRecv": 4 * STEPS}
    [pp_members_a, pp_members_b] = sorted(
        c["members"] for c in job["truth"]["communicators"] if c["name"] == "pp"
    )
    assert (pp_members_a, pp_members_b) == ([0, 2], [1, 3])
    chains: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in p2p:
        chains[r["causal_chain_id"]].append(r)
        partner = {0: 2, 2: 0, 1: 3, 3: 1}[r["rank"]]
        assert job["peer"][r["event_id"]] == 1 - r["comm_rank"], (
            r
        )  # the peer as a rank of the pp communicator
        assert r["comm_rank"] == r["rank"] // 2 and partner // 2 == 1 - r["comm_rank"]
        assert r["complete_ns"] is not None and r["complete_ns"] >= r["enter_ns"]
    assert len(chains) == 4 * STEPS
    for chain, pair in chains.items():
        assert sorted(r["op"] for r in pair) == ["ncclRecv", "ncclSend"], chain
        send = next(r for r in pair if r["op"] == "ncclSend")
        recv = next(r for r in pair if r["op"] == "ncclRecv")
        assert {send["rank"], recv["rank"]} in ({0, 2}, {1, 3}) and send["seq"] == recv["seq"]


def test_fsdp_collectives_arrive_on_the_world(job: dict[str, Any]) -> None:
    ops = Counter(r["op"] for r in job["rows"])
    assert ops["ncclAllGather"] == 4 * STEPS and ops["ncclReduceScatter"] == 4 * STEPS
    assert ops["ncclAllReduce"] == 4 * STEPS  # one world bucket per step
    world = {
        r["comm_id"]
        for r in job["rows"]
        if r["op"] in ("ncclAllGather", "ncclReduceScatter", "ncclAllReduce")
    }
    assert len(world) == 1
