"""`rankecho serve` flags -> Settings, and running without auth only when asked for, loudly."""

from __future__ import annotations

from pathlib import Path

import pytest
from echo_helpers import grpc_export, node_request

from echo.settings import HostPort, Settings, SettingsError, settings_from_args
from echo.stress.server import EchoProcess
from rankecho.cli import build_parser


def parse(*argv: str, env: dict[str, str] | None = None) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]), env or {})


def test_flags_reach_the_settings(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  from-file \n")
    s = parse(
        "--db", str(tmp_path / "e.db"), "--otlp-grpc", ":0", "--otlp-http", "[::1]:4318", "--mcp-http", "",
        "--token-file", str(token_file), "--max-message-bytes", "2048", "--queue-rows", "7",
        env={"RANKECHO_TOKEN": "from-env"},
    )  # fmt: skip
    assert (s.token, s.otlp_grpc, s.otlp_http, s.mcp_http) == (
        "from-file",
        HostPort("0.0.0.0", 0),
        HostPort("::1", 4318),
        None,
    )
    assert (s.max_message_bytes, s.queue_rows, s.insecure_no_auth) == (2048, 7, False)
    assert str(s.otlp_http) == "[::1]:4318"
    assert parse("--db", "x.db", env={"RANKECHO_TOKEN": "from-env"}).token == "from-env"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ((), {}, "--insecure-no-auth"),
        (("--insecure-no-auth",), {"RANKECHO_TOKEN": "t"}, "drop one"),
        (("--token-file", "/nonexistent/token"), {}, "cannot read --token-file"),
        ((), {"RANKECHO_TOKEN": "   "}, "empty"),
        (("--otlp-grpc", "4317"), {"RANKECHO_TOKEN": "t"}, "HOST:PORT"),
        (("--tls-cert", "c.pem"), {"RANKECHO_TOKEN": "t"}, "--tls-key"),
        (("--queue-rows", "0"), {"RANKECHO_TOKEN": "t"}, "--queue-rows"),
    ],
)
def test_bad_configuration_names_the_fix(argv: tuple[str, ...], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse("--db", "x.db", *argv, env=env)


def test_insecure_no_auth_accepts_anyone_and_says_so(tmp_path: Path) -> None:
    with EchoProcess(tmp_path / "e.db", token=None) as echo:
        grpc_export(echo.otlp_grpc, node_request("n1", 3), token=None)
    assert "AUTHENTICATION IS OFF" in echo.log.read_text()
