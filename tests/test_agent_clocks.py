"""Drifting and stepped node clocks end to end: sim/scenarios/format/clock-drift runs with one real agent per
node into a real Echo; every collective node-b's agent sent carries its true call time shifted by exactly the
offset the ground truth gives for that instant (constant part, drift since the epoch, the step once the agent
applied it), and node-a's carries none."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, row_dicts
from test_agent_helpers import requires_ebpf, sim_built

from rankecho.sim.clocks import offset_ns
from rankecho.sim.groundtruth import read_rank_logs
from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import load_scenario

pytestmark = [requires_ebpf, pytest.mark.ebpf]

SCENARIO = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "format" / "clock-drift.yaml"
MS = 1_000_000


def test_agents_shift_timestamps_by_the_true_drifting_stepped_offset(tmp_path: Path) -> None:
    sim_built()
    s = load_scenario(SCENARIO)
    with inproc_echo(tmp_path / "echo.db") as echo:
        opts = LaunchOptions(run_dir=tmp_path / "run", agent_endpoint=echo.grpc_address, token=TEST_TOKEN,
                             timeout_s=120, progress=None)  # fmt: skip
        run = run_scenario(s, opts)
        assert run.returncode == 0 and run.truth is not None
        rows = row_dicts(echo, f"SELECT node_id, rank, enter_ns FROM collectives WHERE cluster_id = "
                               f"'{s.cluster_id}' AND comm_nranks = 4 ORDER BY rank, enter_ns")  # fmt: skip
    b = run.truth["nodes"][1]
    applied = b["clock_step"]["applied_ns"]
    assert applied is not None and applied >= b["clock_step"]["requested_ns"]
    logs = read_rank_logs(tmp_path / "run", s)
    node = {rank: n for rank, n, _ in s.rank_layout()}
    residual: dict[int, list[tuple[int, int]]] = {}  # rank -> (step, sent - true - expected offset)
    for rank in range(4):
        sent = [r["enter_ns"] for r in rows if r["rank"] == rank]  # one world all-reduce per step
        true = [rec.enter_ns for rec in logs[rank].steps]
        assert len(sent) == len(true) == s.steps
        assert {r["node_id"] for r in rows if r["rank"] == rank} == {node[rank].id}
        residual[rank] = [(k, got - t - offset_ns(node[rank], b["clock_epoch_ns"], applied, t))
                          for k, (got, t) in enumerate(zip(sent, true, strict=True))]  # fmt: skip
    first = b["offsets"][0]["offset_ns"]
    step_at = next(o["step"] for o in b["offsets"] if o["offset_ns"] - first > 30 * MS)  # the first stepped
    for rank, res in residual.items():
        # the call is timed a few us before the probe fires (more if preempted): medians, per segment of
        # the run, so neither the 40 ms step nor ~1 ms of drift over the run can hide in the tolerance
        for part in ([r for k, r in res if k < step_at - 1], [r for k, r in res if k > step_at + 1][-15:]):
            assert abs(statistics.median(part)) < 0.3 * MS, (rank, step_at, res)
