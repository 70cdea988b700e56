"""Burst: 5,000 events at ~1k EPS from 8 concurrent writers into a real Echo: zero loss, zero duplicates."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from echo_helpers import TEST_TOKEN as TOKEN

from rankecho.launch.echo import EchoProcess
from rankecho.launch.stress import StressProcess


@pytest.mark.parametrize("client", ["raw", "sdk"])
def test_burst_of_5000_events_at_1k_eps_loses_and_duplicates_nothing(tmp_path: Path, client: str) -> None:
    db = tmp_path / "burst.db"
    with EchoProcess(db, token=TOKEN) as echo:
        run = StressProcess(
            echo.otlp_grpc, TOKEN, "burst", "writer", producers=8, events=625, client=client, rate=1000
        ).start()
        summary = run.finish()
    assert (summary["sent"], summary["acked"], summary["failed"], summary["exit_code"]) == (5000, 5000, 0, 0)
    assert summary["elapsed_s"] >= 4.0  # paced at ~1k EPS, not dumped at once
    with duckdb.connect(str(db), read_only=True) as con:
        total, distinct_ids, nodes = con.execute(
            "SELECT COUNT(*), COUNT(DISTINCT event_id), COUNT(DISTINCT node_id) FROM events"
        ).fetchone()  # type: ignore[misc]
        per_node = con.execute(
            "SELECT node_id, COUNT(*) FROM events GROUP BY node_id ORDER BY node_id"
        ).fetchall()
    assert (total, distinct_ids, nodes) == (5000, 5000, 8)
    assert per_node == [(f"writer-{p}", 625) for p in range(8)]
