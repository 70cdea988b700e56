"""`rankecho serve` flags -> Settings, and running without auth only when asked for, loudly."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import local_settings
from echo_helpers import grpc_export, node_request

from rankecho.cli import build_parser
from rankecho.echo.app import Echo
from rankecho.echo.settings import HostPort, Settings, SettingsError, settings_from_args
from rankecho.launch.echo import EchoProcess


def parse(*argv: str, env: dict[str, str] | None = None) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]), env or {})


def test_flags_reach_the_settings(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  from-file \n")
    s = parse(
        "--db", str(tmp_path / "e.db"), "--otlp-grpc", ":0", "--otlp-http", "[::1]:4318", "--mcp-http", "",
        "--token-file", str(token_file), "--max-message-bytes", "2048", "--queue-rows", "7",
        "--duckdb-memory-limit", "512MiB", "--max-spill-size", "2GB", env={"RANKECHO_TOKEN": "from-env"},
    )  # fmt: skip
    assert (s.token, s.otlp_grpc, s.otlp_http, s.mcp_http) == (
        "from-file",
        HostPort("0.0.0.0", 0),
        HostPort("::1", 4318),
        None,
    )
    assert (s.max_message_bytes, s.queue_rows, s.insecure_no_auth) == (2048, 7, False)
    assert (s.duckdb_memory_limit, s.max_spill_size) == ("512MiB", "2GB")
    assert str(s.otlp_http) == "[::1]:4318"
    defaults = parse("--db", "x.db", env={"RANKECHO_TOKEN": "from-env"})
    assert (defaults.token, defaults.store_memory_limit) == ("from-env", "4GB")
    assert defaults.memory_limit is None
    assert defaults.max_spill_size == "10GB"
    assert (defaults.mcp_token, defaults.mcp_bearer, defaults.gpu_rates) == (None, "from-env", None)


def test_mcp_token_and_gpu_rates_flags_beat_the_environment(tmp_path: Path) -> None:
    mcp_token = tmp_path / "mcp.token"
    mcp_token.write_text("mcp-from-file\n")
    env = {"RANKECHO_TOKEN": "otlp", "RANKECHO_MCP_TOKEN": "mcp-from-env", "RANKECHO_GPU_RATES": "env.yaml"}
    flags = parse("--db", "x.db", "--mcp-token-file", str(mcp_token), "--gpu-rates", "flag.yaml", env=env)
    assert (flags.token, flags.mcp_bearer, flags.gpu_rates) == ("otlp", "mcp-from-file", Path("flag.yaml"))
    from_env = parse("--db", "x.db", env=env)
    assert (from_env.mcp_bearer, from_env.gpu_rates) == ("mcp-from-env", Path("env.yaml"))
    no_auth = parse("--db", "x.db", "--insecure-no-auth", "--mcp-token-file", str(mcp_token))
    assert (no_auth.token, no_auth.mcp_bearer) == (None, "mcp-from-file")  # MCP stays closed


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
        (("--mcp-token-file", "/nonexistent/t"), {"RANKECHO_TOKEN": "t"}, "cannot read --mcp-token-file"),
        ((), {"RANKECHO_TOKEN": "t", "RANKECHO_MCP_TOKEN": " "}, "MCP token is empty"),
        (("--duckdb-memory-limit", "4"), {"RANKECHO_TOKEN": "t"}, "e.g. 4GB or 512MiB"),
        (("--duckdb-memory-limit", "lots"), {"RANKECHO_TOKEN": "t"}, "--duckdb-memory-limit 'lots'"),
        (("--duckdb-memory-limit", "10MB"), {"RANKECHO_TOKEN": "t"}, "at least 64MiB"),
        (("--max-spill-size", "lots"), {"RANKECHO_TOKEN": "t"}, "--max-spill-size 'lots'"),
        (("--memory-limit", "lots"), {"RANKECHO_TOKEN": "t"}, "--memory-limit 'lots'"),
        (("--memory-limit", "600MiB"), {"RANKECHO_TOKEN": "t"}, "give at least 640MiB"),
        (("--memory-limit", "2GB", "--duckdb-memory-limit", "2GB"), {"RANKECHO_TOKEN": "t"},
         "drop it \\(DuckDB then gets 1204MiB\\)"),
    ],
)
def test_bad_configuration_names_the_fix(argv: tuple[str, ...], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse("--db", "x.db", *argv, env=env)


def test_insecure_no_auth_accepts_anyone_and_says_so(tmp_path: Path) -> None:
    with EchoProcess(tmp_path / "e.db", token=None) as echo:
        grpc_export(echo.otlp_grpc, node_request("n1", 3), token=None)
    assert "AUTHENTICATION IS OFF" in echo.log.read_text()


@pytest.mark.parametrize(("limit", "shown"), [("512MiB", "512.0 MiB"), ("1.5 GiB", "1.5 GiB")])
def test_duckdb_memory_limit_is_set_on_the_store(tmp_path: Path, limit: str, shown: str) -> None:
    with Echo(local_settings(tmp_path / "e.db", duckdb_memory_limit=limit)) as echo:
        assert echo.duckdb_setting("memory_limit") == shown  # the owner's connection, not the guarded reader
        got = echo.reader.query("SELECT count(*) FROM events").rows  # queries still run under it
        assert got == [(0,)]


@pytest.mark.parametrize(
    ("argv", "store_limit"),
    [
        (("--memory-limit", "4GB"), "2921MiB"),  # 4e9 x 0.9 - 512 MiB
        (("--memory-limit", "640MiB"), "64MiB"),  # the smallest budget: DuckDB's floor
        (("--memory-limit", "2GB", "--duckdb-memory-limit", "1GB"), "1GB"),  # explicit, and it fits
        (("--duckdb-memory-limit", "8GB"), "8GB"),  # no budget: DuckDB's limit as given
    ],
)
def test_memory_limit_is_echos_budget_and_duckdb_gets_the_rest(
    argv: tuple[str, ...], store_limit: str
) -> None:
    """``--memory-limit`` bounds Echo's RSS: DuckDB's buffer pool gets the budget less what the process
    holds outside it (measured ~0.5 GB over ``--duckdb-memory-limit`` at 10M-100M events)."""
    assert parse("--db", "x.db", *argv, env={"RANKECHO_TOKEN": "t"}).store_memory_limit == store_limit


def test_memory_limit_reaches_the_store(tmp_path: Path) -> None:
    with Echo(local_settings(tmp_path / "e.db", memory_limit="1GB")) as echo:
        assert echo.duckdb_setting("memory_limit") == "346.0 MiB"  # 1e9 x 0.9 - 512 MiB = 346.3, whole MiB


def test_in_process_echo_defaults_to_4gb_not_most_of_the_ram(tmp_path: Path) -> None:
    with Echo(local_settings(tmp_path / "e.db")) as echo:
        assert echo.duckdb_setting("memory_limit") == "3.7 GiB"


def test_a_query_past_the_spill_limit_fails_instead_of_filling_the_disk(tmp_path: Path) -> None:
    """DuckDB's own spill limit is 90% of the free disk: a whole-store query of a big store filled this
    machine's disk that way (bench/day.py, 100M events). Echo caps it (--max-spill-size), locked like the
    memory limit, and a query that needs more fails with an error that names the setting."""
    settings = local_settings(tmp_path / "e.db", duckdb_memory_limit="64MiB", max_spill_size="64MiB")
    with Echo(settings) as echo:
        assert echo.duckdb_setting("max_temp_directory_size") == "64.0 MiB"
        big_sort = ("SELECT count(*) FROM (SELECT md5(i::VARCHAR) || md5((i + 1)::VARCHAR) AS s "
                    "FROM range(9000000) t(i) ORDER BY s)")  # fmt: skip
        with pytest.raises(Exception, match="max_temp_directory_size"):
            echo.reader.query(big_sort)
        assert echo.reader.query("SELECT count(*) FROM events").rows == [(0,)]  # and Echo goes on
    with Echo(local_settings(tmp_path / "d.db")) as echo:
        assert echo.duckdb_setting("max_temp_directory_size") == "9.3 GiB"  # the default, 10GB
