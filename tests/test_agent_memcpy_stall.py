"""memcpy_stall end to end: sim/scenarios/format/memcpy-stall runs with one real agent per node into a real
Echo; find_stragglers names rank 3 with the `memcpy` cause, its period and the stall's stack, and the
diagnosis scores perfectly against the ground truth (the scoring rankecho evaluate does)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN
from test_agent_helpers import requires_ebpf, sim_built

from rankecho.echo.mcp.rates import load_rates
from rankecho.echo.mcp.tools import Investigation
from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import load_scenario
from rankecho.sim.score import periods, predictions_from, score

pytestmark = [requires_ebpf, pytest.mark.ebpf]

SCENARIO = Path(__file__).resolve().parent.parent / "sim" / "scenarios" / "format" / "memcpy-stall.yaml"


def test_memcpy_stall_is_diagnosed_as_memcpy(tmp_path: Path) -> None:
    sim_built()
    s = load_scenario(SCENARIO)
    with inproc_echo(tmp_path / "echo.db") as echo:
        opts = LaunchOptions(run_dir=tmp_path / "run", agent_endpoint=echo.grpc_address, token=TEST_TOKEN,
                             timeout_s=120, progress=None)  # fmt: skip
        run = run_scenario(s, opts)
        assert run.returncode == 0 and run.truth is not None
        found = Investigation(echo.reader, load_rates()).diagnosis.find_stragglers(
            cluster_id=s.cluster_id, min_late_ms=s.straggler_threshold_ms)
    [straggler] = found["stragglers"]
    assert (straggler["rank"], straggler["cause"]["class"]) == (3, "memcpy"), found
    assert "cudaMemcpy <- stall_memcpy" in straggler["cause"]["leading_frames"]
    got = score(run.truth, predictions_from(run.truth, found))
    assert got.recall >= 0.8 and got.precision == 1.0 and got.cause_accuracy == 1.0, got
    assert periods(run.truth, found) == [("rank 3", 5, 5)]
