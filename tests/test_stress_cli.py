"""``rankecho stress`` against a real Echo: a wrong token fails fast with the reason, a full queue
(RESOURCE_EXHAUSTED + RetryInfo) is retried until everything lands, and the summary is the last line."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pytest
from echo_helpers import TEST_TOKEN as TOKEN

from rankecho.launch.echo import EchoProcess
from rankecho.launch.stress import StressProcess


@pytest.mark.parametrize("client", ["raw", "sdk"])
def test_wrong_token_fails_every_batch_without_retrying_and_says_why(tmp_path: Path, client: str) -> None:
    log = tmp_path / "stress.log"
    with EchoProcess(tmp_path / "auth.db", token=TOKEN) as echo:
        run = StressProcess(
            echo.otlp_grpc, "wrong-token", "c", "n", producers=2, events=100, client=client, stderr_path=log
        )
        summary = run.start().finish()
    assert (summary["sent"], summary["acked"], summary["failed"], summary["retries"]) == (200, 0, 200, 0)
    assert summary["exit_code"] == 1
    assert "UNAUTHENTICATED" in log.read_text()
    with duckdb.connect(str(tmp_path / "auth.db"), read_only=True) as con:
        assert con.execute("SELECT COUNT(*) FROM events").fetchall() == [(0,)]


@pytest.mark.parametrize("client", ["raw", "sdk"])
def test_full_queue_is_retried_until_every_event_lands_once(tmp_path: Path, client: str) -> None:
    db = tmp_path / "busy.db"
    with EchoProcess(db, token=TOKEN, extra_args=("--queue-rows", "600")) as echo:
        run = StressProcess(
            echo.otlp_grpc, TOKEN, "c", "n", producers=8, events=1500, client=client, extra=("--batch", "300")
        )
        summary = run.start().finish()
    assert (summary["sent"], summary["acked"], summary["failed"], summary["exit_code"]) == (
        12000,
        12000,
        0,
        0,
    )
    if client == "raw":  # the SDK exporter retries RESOURCE_EXHAUSTED itself, out of our count
        assert summary["retries"] > 0, "Echo's queue never filled: the backpressure path was not exercised"
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM events").fetchall() == [
            (12000, 12000)
        ]


def test_rerun_with_the_same_run_id_is_stored_once_and_a_new_run_id_adds_events(tmp_path: Path) -> None:
    """A resend is the same events: the same ids at the same times (``--start-ns``); Echo finds them
    among the events stored in the request's time range."""
    db = tmp_path / "rerun.db"
    start = str(time.time_ns() - 60 * 10**9)
    with EchoProcess(db, token=TOKEN) as echo:
        summaries = [
            StressProcess(
                echo.otlp_grpc, TOKEN, "c", "n", producers=2, events=250,
                extra=("--run-id", run_id, "--start-ns", start),
            )
            .start()
            .finish()
            for run_id in ("first", "first", "second")
        ]
    assert [s["acked"] for s in summaries] == [500, 500, 500]  # a resend is acknowledged, not stored again
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT split_part(event_id, '/', 3) AS run, COUNT(*) FROM events GROUP BY run ORDER BY run"
        ).fetchall()
    assert rows == [("first", 500), ("second", 500)]
