"""Durability: kill -9 Echo in the middle of a stream, several times, restart it on the same DB and
port; the producers resend what was not acknowledged. After every kill, each event acknowledged so far
is in the store; at the end every event is there exactly once. Each kill waits until 300 more events
were acknowledged since the last restart, and checks the stream is still running."""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pytest
from echo_helpers import TEST_TOKEN as TOKEN

from rankecho.launch.echo import EchoProcess
from rankecho.launch.stress import StressProcess
from rankecho.stress.planting import StressPlan

KILLS = 3


def acknowledged_ids(ack_log: Path, plan: StressPlan) -> set[str]:
    """Event ids of every batch stress logged as acknowledged (a complete line = a finished ack)."""
    ids: set[str] = set()
    for line in ack_log.read_text().splitlines():
        entry = json.loads(line)
        ids.update(plan.event(i).event_id for i in range(entry["first"], entry["first"] + entry["count"]))
    return ids


def wait_for_progress(ack_log: Path, at_least: int, timeout_s: float = 20.0) -> None:
    """Block until ``at_least`` events are acknowledged, so each kill lands in a flowing stream."""
    deadline = time.monotonic() + timeout_s
    while sum(json.loads(line)["count"] for line in ack_log.read_text().splitlines()) < at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} events acknowledged in {timeout_s} s"
        time.sleep(0.05)


def stored_ids(db: Path) -> list[str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return [row[0] for row in con.execute("SELECT event_id FROM events").fetchall()]


@pytest.mark.parametrize("client", ["raw", "sdk"])
def test_kill_9_mid_stream_keeps_every_acknowledged_event_exactly_once(tmp_path: Path, client: str) -> None:
    db, ack_log = tmp_path / "durable.db", tmp_path / "acks.jsonl"
    ack_log.touch()
    echo = EchoProcess(db, token=TOKEN).start()
    port = echo.grpc_port
    run = StressProcess(
        echo.otlp_grpc,
        TOKEN,
        "durable",
        "node",
        producers=4,
        events=1500,
        rate=1500,
        extra=("--ack-log", str(ack_log), "--batch", "50", "--retry-deadline", "60"),
        stderr_path=tmp_path / "stress.log",
    ).start()
    plan = run.plan()
    try:
        acked_before = 0
        for _ in range(KILLS):
            wait_for_progress(ack_log, acked_before + 300)
            assert run.proc is not None and run.proc.poll() is None, "stream ended before the kill"
            echo.kill()
            acked, stored = acknowledged_ids(ack_log, plan), stored_ids(db)
            acked_before = len(acked)
            assert acked <= set(stored), f"{len(acked - set(stored))} acknowledged events lost by kill -9"
            assert len(stored) == len(set(stored)), "duplicate rows after a kill"
            echo = EchoProcess(db, token=TOKEN, grpc_port=port).start()
        summary = run.finish(timeout_s=120)
    finally:
        run.kill()
        echo.stop()
    assert (summary["sent"], summary["acked"], summary["failed"], summary["exit_code"]) == (6000, 6000, 0, 0)
    assert summary["retries"] > 0, "no batch was ever resent: the kills did not hit the stream"
    final = stored_ids(db)
    assert len(final) == len(set(final)) == 6000
    assert (
        set(final) == {plan.event(i).event_id for i in range(plan.total)} == acknowledged_ids(ack_log, plan)
    )
