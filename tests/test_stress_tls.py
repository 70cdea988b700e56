"""``rankecho stress`` over TLS: Echo serves a certificate from a private CA, both clients verify it
with ``--ca-file`` (and refuse it with only the system roots, ``--tls``), and every event lands. When the
client and Echo disagree on TLS, the error names the flag to use."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from echo_helpers import TEST_TOKEN as TOKEN
from echo_helpers import self_signed

from rankecho.launch.echo import EchoProcess
from rankecho.launch.stress import StressProcess


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
                extra=("--tls", "--retry-deadline", "1"),
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


def test_a_tls_mismatch_names_the_flag_to_use(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    tls_args = ("--tls-cert", str(cert), "--tls-key", str(key))
    plain_log, tls_log = tmp_path / "plain.err", tmp_path / "tls.err"
    with EchoProcess(tmp_path / "tls.db", token=TOKEN, extra_args=tls_args) as echo:
        plain = (
            StressProcess(
                echo.otlp_grpc,
                TOKEN,
                "c",
                "plain",
                events=5,
                insecure=False,
                stderr_path=plain_log,
                extra=("--retry-deadline", "1"),
            )
            .start()
            .finish()
        )
    with EchoProcess(tmp_path / "plain.db", token=TOKEN) as echo:
        tls = (
            StressProcess(
                echo.otlp_grpc,
                TOKEN,
                "c",
                "tls",
                events=5,
                insecure=False,
                stderr_path=tls_log,
                extra=("--ca-file", str(cert), "--retry-deadline", "1"),
            )
            .start()
            .finish()
        )
    assert (plain["acked"], plain["exit_code"], tls["acked"], tls["exit_code"]) == (0, 1, 0, 1)
    said_plain, said_tls = plain_log.read_text(), tls_log.read_text()
    assert "WARNING: plaintext gRPC" in said_plain
    assert "Socket closed (if Echo serves TLS (--tls-cert), pass --tls, or --ca-file FILE" in said_plain
    assert (
        "WRONG_VERSION_NUMBER" in said_tls and "Echo answers in plaintext: drop --tls/--ca-file" in said_tls
    )
