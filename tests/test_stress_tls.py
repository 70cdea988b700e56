"""``rankecho stress`` over TLS: Echo serves a certificate from a private CA, both clients verify it
with ``--ca-file`` (and refuse it without), and every event lands."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import duckdb
import pytest

from echo.stress.harness import StressProcess
from echo.stress.server import EchoProcess

TOKEN = "tls-test-token"


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 / localhost, its own CA; returns (cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


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
