"""Simulator slow_link: validated (settings that could never take effect are refused with the fix), it
really slows the transfers of the communicators it should (a node's NIC: only those spanning nodes), and
the ground truth records each episode (the ranks run through the launcher, without agents)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import ScenarioError, parse_scenario

STEP = {"compute_ms": 6, "host_ms": 0.2, "dataloader_ms": 0.2, "allreduce_mb": 1}
TP = [{"name": "tp", "group_size": 2, "allreduce_mb": 64}]  # intra-node: n0 {0, 1}, n1 {2, 3}


def scenario(faults: list[dict[str, Any]], steps: int = 8, nodes: int = 2, **extra: Any) -> Any:
    raw = {"cluster_id": "t-link", "steps": steps, "step": STEP, "faults": faults,
           "nodes": [{"id": f"n{i}", "ranks": 2} for i in range(nodes)], **extra}  # fmt: skip
    return parse_scenario(raw, "links")


@pytest.mark.parametrize(
    ("faults", "extra", "message"),
    [
        ([{"kind": "slow_link", "node": "n1"}], {}, "missing required key(s) ['factor']"),
        ([{"kind": "slow_link", "node": "n1", "factor": 1}], {}, "pick a factor > 1"),
        ([{"kind": "slow_link", "node": "n1", "factor": 500}], {}, "and <= 100"),
        ([{"kind": "slow_link", "node": "n1", "ms": 5}], {}, "a slow_link takes no ms; give factor"),
        ([{"kind": "slow_link", "rank": 1, "factor": 4, "jitter": 1}], {}, "a slow_link takes no jitter"),
        ([{"kind": "host_compute", "rank": 1, "ms": 5, "factor": 2}], {}, "only a slow_link takes a factor"),
        ([{"kind": "slow_link", "node": "n0", "factor": 4}], {"nodes": 1}, "add a node, or give rank"),
        ([{"kind": "slow_link", "rank": 1, "factor": 4}], {"program": "python"}, "use program: c"),
    ],
)
def test_slow_links_that_cannot_take_effect_are_refused_with_the_fix(
    faults: list[dict[str, Any]], extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ScenarioError) as e:
        scenario(faults, **extra)
    assert message in str(e.value)


def test_slow_link_specs_name_a_node_fault_a_nic() -> None:
    s = scenario([{"kind": "slow_link", "node": "n1", "factor": 8, "every": 3, "start_step": 1},
                  {"kind": "slow_link", "rank": 0, "factor": 2.5}], bus_gbps=40)  # fmt: skip
    assert [f.spec() for f in s.faults] == ["slow_nic:8.0:3:1:0", "slow_link:2.5:1:0:0"]
    assert [s.faults[0].fires_at(k) for k in range(5)] == [False, True, False, False, True]
    assert s.bus_gbps == 40.0


def extra_step_ms(truth: dict[str, Any], rank: int, slow_steps: list[int]) -> float:
    """The rank's median step time at the slowed steps less at the others (step 0, warm-up, left out)."""
    times = {s["step"]: r["step_ms"] for s in truth["per_step"] for r in s["ranks"] if r["rank"] == rank}
    slow = [times[k] for k in slow_steps]
    healthy = [t for k, t in times.items() if k not in slow_steps and k > 0]
    return statistics.median(slow) - statistics.median(healthy)


def test_a_slow_nic_spares_intra_node_communicators_a_slow_rank_does_not(tmp_path: Path) -> None:
    # tp moves 64 MiB inside each node (0.8 ms at 80 GB/s; x50: +41 ms); the world only 1 MiB (+1 ms).
    fault = {"kind": "slow_link", "factor": 50, "every": 2, "start_step": 1}
    nic = run_scenario(scenario([{**fault, "node": "n1"}], communicators=TP),
                       LaunchOptions(run_dir=tmp_path / "nic", progress=None, timeout_s=60))  # fmt: skip
    rank = run_scenario(scenario([{**fault, "rank": 2}], communicators=TP),
                        LaunchOptions(run_dir=tmp_path / "rank", progress=None, timeout_s=60))  # fmt: skip
    assert nic.returncode == 0 and rank.returncode == 0
    assert nic.truth is not None and rank.truth is not None
    slow_steps = [1, 3, 5, 7]
    assert extra_step_ms(nic.truth, 2, slow_steps) < 15
    assert extra_step_ms(rank.truth, 2, slow_steps) > 30
    assert extra_step_ms(rank.truth, 3, slow_steps) > 30  # its tp peer waits as long
    [link] = nic.truth["links"]
    assert (link["scope"], link["node_id"], link["rank"], link["ranks"]) == ("node", "n1", None, [2, 3])
    assert link["steps"] == slow_steps and link["factor"] == 50.0
    assert [(c["name"], c["inter_node"]) for c in link["communicators"]] == [("world", True)]
    [link] = rank.truth["links"]
    assert (link["scope"], link["node_id"], link["rank"]) == ("rank", "n1", 2)
    slowed = {c["name"]: c for c in link["communicators"]}
    assert sorted(slowed) == ["tp", "world"]
    assert slowed["tp"]["slow_transfer_ms"] == pytest.approx(50 * slowed["tp"]["transfer_ms"], rel=0.05)
    assert rank.truth["faults"][0]["factor"] == 50.0 and rank.truth["faults"][0]["function"] is None
    assert all(not s["stragglers"] for s in nic.truth["per_step"])  # the world is slow for all alike
