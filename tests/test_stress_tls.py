"""``rankecho stress`` over TLS: Echo serves a certificate from a private CA, both clients verify it
with ``--ca-file`` (and refuse it without), and every event lands."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from echo_helpers import TEST_TOKEN as TOKEN
from echo_helpers import self_signed

from bench.launch.echo import EchoProcess
from bench.launch.stress import StressProcess


@pytest.mark.parametrize("client", ["raw", "sdk"])
def test_stress_verifies_echo_certificate_and_delivers(tmp_path: Path, client: str) -> None:
    cert, key = self_signed(tmp_path)
    db = tmp_path / "tls.db"
    with EchoProcess(db, token=TOKEN, extra_args=("--tls-cert", str(cert), "--tls-key", str(key))) as echo:
        trusted = (
            StressProcess(
                echo.otlp_grpc,
                TOKEN,
                "c",
                "trusted",
                producers=2,
                events=300,
                client=client,
                insecure=False,
                extra=("--ca-file", str(cert)),
            )
            .start()
            .finish()
        )
        untrusted = (
            StressProcess(
                echo.otlp_grpc,
                TOKEN,
                "c",
                "untrusted",
                producers=1,
                events=10,
                client=client,
                insecure=False,
                extra=("--retry-deadline", "1"),
            )
            .start()
            .finish()
        )
    assert (trusted["acked"], trusted["failed"], trusted["exit_code"]) == (600, 0, 0)
    assert (untrusted["acked"], untrusted["failed"], untrusted["exit_code"]) == (0, 10, 1)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute(
            "SELECT node_id, COUNT(*) FROM events GROUP BY node_id ORDER BY node_id"
        ).fetchall() == [
            ("trusted-0", 300),
            ("trusted-1", 300),
        ]
