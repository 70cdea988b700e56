"""``make demo`` (``python -m rankecho.demo``) runs end to end against real processes and ends with a
PASS verdict, the four fan-in queries printed with their results."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import duckdb


def test_demo_passes_and_keeps_the_db_it_reports(tmp_path: Path) -> None:
    keep = tmp_path / "demo.db"
    done = subprocess.run(
        [sys.executable, "-m", "rankecho.demo", "--part", "fanin", "--keep", str(keep)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("VERDICT: PASS: 2,000/2,000 events landed"), lines[-1]
    for name in ("per_node_events", "chains", "stragglers", "health_quantiles"):
        assert f"-- {name}" in done.stdout
    for node in ("node-a100", "node-h100"):
        assert re.search(rf"demo-cluster\s*\|\s*{node}\s*\|\s*1000\b", done.stdout)
    with duckdb.connect(str(keep), read_only=True) as con:
        assert con.execute(
            "SELECT node_id, COUNT(*) FROM events WHERE value_double < 0.40 GROUP BY node_id ORDER BY node_id"
        ).fetchall() == [("node-a100", 9), ("node-h100", 9)]
