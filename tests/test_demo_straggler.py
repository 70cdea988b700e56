"""``make demo``'s straggler part end to end: simulated job, real eBPF agents, Echo, MCP over HTTP, and
a diagnosis through find_stragglers that must equal the simulator's ground truth (rank 5, every 14
steps, cudaMalloc) although node-h100's clock runs 40 ms ahead."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankecho.demo_straggler import missing_prerequisite

pytestmark = [pytest.mark.ebpf, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent


def test_straggler_demo_names_rank5_its_period_and_cause() -> None:
    why_not = missing_prerequisite()
    if why_not:
        pytest.skip(why_not)
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "rankecho.demo", "--part", "straggler"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith("VERDICT: PASS: rank 5 on node-h100 entered 7 of 100 steps"), verdict
    assert "every 14 steps" in verdict and "at cudaMalloc <- allocate_cache <- " in verdict, verdict
    assert "[ok] late episodes: precision 1.000, recall 1.000 (7 found, 0 wrong, 0 missed)" in done.stdout
    assert "[ok] the one straggler named is rank 5 on node-h100: [('node-h100', 5)]" in done.stdout
    report = re.search(r"^-- the report .*: (\S+)$", done.stdout, re.M)
    assert report and Path(report.group(1)) == REPO / "build" / "demo-report" / "report.html"
    page = Path(report.group(1))
    assert "rank 5 on node-h100" in page.read_text() and page.stat().st_mtime > started
    assert (page.parent / "timeline.png").stat().st_mtime > started
