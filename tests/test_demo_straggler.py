"""``make demo``'s straggler part end to end: simulated job, real eBPF agents, Echo, MCP over HTTP, and
a diagnosis that must equal the simulator's ground truth (rank 5, every 14 steps, cudaMalloc)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rankecho.demo_straggler import missing_prerequisite

pytestmark = [pytest.mark.ebpf, pytest.mark.slow]


def test_straggler_demo_names_rank5_its_period_and_cause() -> None:
    why_not = missing_prerequisite()
    if why_not:
        pytest.skip(why_not)
    done = subprocess.run(
        [sys.executable, "-m", "rankecho.demo", "--part", "straggler"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith("VERDICT: PASS: rank 5 on node-h100 entered 28 collectives"), verdict
    assert "every 14 steps" in verdict and "in cudaMalloc" in verdict, verdict
    assert "[ok] late ranks and steps {'5': [7, 21, 35, 49, 63, 77, 91]}" in done.stdout
