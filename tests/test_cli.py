"""The ``rankecho`` command line as a newcomer meets it, through real processes (``python -m rankecho``):
every ``--help`` has an example and shows its defaults; one vocabulary (``--endpoint`` is OTLP/gRPC,
``--mcp-url`` is MCP; old spellings warn and work); ``explain`` and ``query --mcp-url`` against a real
running Echo; a closed pipe is no traceback; ``stress`` is plaintext by default, with a loud warning.
See docs/cli.md."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from echo_helpers import TEST_TOKEN
from test_diagnosis_tools import JOB, build_store

from rankecho import __version__, exitcodes
from rankecho.cli import build_parser
from rankecho.launch.echo import EchoProcess

REPO = Path(__file__).resolve().parent.parent
ENV = {"PATH": "/usr/bin:/bin", "RANKECHO_TOKEN": TEST_TOKEN}


def rankecho(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rankecho", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def subcommands() -> list[tuple[str, ...]]:
    """Every subcommand the parser knows, nested ones (``agent check``) included."""
    found: list[tuple[str, ...]] = []

    def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.append((*prefix, name))
                    walk(sub, (*prefix, name))

    walk(build_parser(), ())
    return found


def test_the_parser_knows_every_documented_subcommand() -> None:
    names = {" ".join(c) for c in subcommands()}
    expected = {
        "serve",
        "query",
        "diagnose",
        "explain",
        "mcp",
        "stress",
        "agent",
        "agent check",
        "sim",
        "demo",
    }
    assert expected | {"evaluate"} <= names


@pytest.mark.parametrize("command", subcommands(), ids=" ".join)
def test_every_help_has_a_description_an_example_and_its_defaults(command: tuple[str, ...]) -> None:
    shown = rankecho(*command, "--help")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    description = text.split("\n\n")[1]
    assert not description.startswith(("options:", "positional arguments:")), f"no description:\n{text}"
    assert "\nexamples:\n  " in text, f"no example:\n{text}"
    first_example = text.split("\nexamples:\n", 1)[1].splitlines()[0]
    assert f"rankecho {' '.join(command)}" in first_example, first_example
    assert "%%" not in text
    parser_defaults = [
        a
        for a in _parser(command)._actions
        if a.help not in (None, argparse.SUPPRESS)
        and a.default not in (None, False)
        and a.option_strings
        and a.dest != "help"
    ]
    for action in parser_defaults:
        flag = action.option_strings[-1]
        listing = text.split("\noptions:\n", 1)[1]
        help_text = " ".join(listing.split(f"\n  {flag}", 1)[1].split("\n  -", 1)[0].split())
        assert "default" in help_text, f"{flag} does not show its default: {help_text}"


def _parser(command: tuple[str, ...]):  # type: ignore[no-untyped-def]
    parser: argparse.ArgumentParser = build_parser()
    for word in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def test_top_level_help_and_version() -> None:
    version = rankecho("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"rankecho {__version__}"
    top = rankecho("--help")
    assert top.returncode == 0 and "examples:" in top.stdout and "explain" in top.stdout
    bare = rankecho()
    assert bare.returncode == exitcodes.USAGE and "COMMAND" in bare.stderr


def test_stress_help_shows_the_tls_flags_of_the_agent() -> None:
    stress, agent = rankecho("stress", "--help").stdout, rankecho("agent", "--help").stdout
    for flag in (
        "--tls ",
        "--ca-file FILE",
        "--cert-file FILE",
        "--key-file FILE",
        "--insecure",
        "--token-file",
    ):
        assert flag in stress and flag in agent, flag
    assert "i % chain-every == 0" in stress
    assert "visible to every user of this machine in `ps`" in " ".join(stress.split())


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A running Echo (real process, MCP over HTTP) on a store with one straggler (rank 5 on node-b),
    and a copy of that store no Echo holds."""
    tmp = tmp_path_factory.mktemp("cli")
    db = build_store(tmp / "live.db", JOB)
    copy = tmp / "copy.db"
    shutil.copyfile(db, copy)
    with EchoProcess(db, token=TEST_TOKEN) as echo:
        yield echo, f"http://{echo.listening['mcp_http']}/mcp", db, copy


def test_diagnose_endpoint_is_a_deprecated_alias_of_mcp_url(live) -> None:  # type: ignore[no-untyped-def]
    _, url, db, _ = live
    new = rankecho("diagnose", "--mcp-url", url, "--json", env=ENV)
    assert new.returncode == 0, new.stderr
    assert [(s["node_id"], s["rank"]) for s in json.loads(new.stdout)["stragglers"]] == [("node-b", 5)]
    assert "deprecated" not in new.stderr
    old = rankecho("diagnose", "--endpoint", url, "--json", env=ENV)
    assert old.returncode == 0, old.stderr
    assert json.loads(old.stdout)["stragglers"] == json.loads(new.stdout)["stragglers"]
    assert "--endpoint is deprecated" in old.stderr and "use --mcp-url" in old.stderr
    both = rankecho("diagnose", "--db", str(db), "--mcp-url", url)
    assert both.returncode == exitcodes.USAGE and "not allowed with" in both.stderr
    held = rankecho("diagnose", "--db", str(db))
    assert held.returncode == exitcodes.STORE_HELD and "--mcp-url http://HOST:8000/mcp" in held.stderr


def test_explain_one_late_call_from_a_running_echo_and_from_a_store(live, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, url, db, copy = live
    found = json.loads(rankecho("diagnose", "--mcp-url", url, "--json", env=ENV).stdout)
    episode = found["stragglers"][0]["episodes"][2]
    which = ("--node-id", "node-b", "--rank", "5", "--causal-chain-id", episode["causal_chain_id"])
    text = rankecho("explain", "--mcp-url", url, *which, "--before-ms", "200", env=ENV)
    assert text.returncode == 0, text.stderr
    assert f"rank 5 on node-b, step {episode['step']}" in text.stdout
    assert (
        "cudaMalloc" in text.stdout
        and "allocator" in text.stdout
        and "every rank at that collective" in text.stdout
    )
    remote = rankecho("explain", "--mcp-url", url, *which, "--json", env=ENV)
    local = rankecho("explain", "--db", str(copy), *which, "--json")
    assert remote.returncode == 0 and local.returncode == 0, remote.stderr + local.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)
    assert json.loads(local.stdout)["cause"] == "allocator"
    token_file = tmp_path / "token"
    token_file.write_text(TEST_TOKEN + "\n")
    by_file = rankecho(
        "explain",
        "--mcp-url",
        url,
        *which,
        "--json",
        "--token-file",
        str(token_file),
        env={"PATH": "/usr/bin:/bin"},
    )
    assert by_file.returncode == 0 and json.loads(by_file.stdout) == json.loads(remote.stdout)
    held = rankecho("explain", "--db", str(db), *which)
    assert held.returncode == exitcodes.STORE_HELD and "--mcp-url" in held.stderr
    unknown = rankecho(
        "explain", "--mcp-url", url, "--node-id", "node-b", "--rank", "42", "--timestamp-ns", "1", env=ENV
    )
    assert unknown.returncode == exitcodes.FAILED and "fleet.cluster.summary lists them" in unknown.stderr
    vague = rankecho("explain", "--db", str(copy), "--node-id", "node-b", "--rank", "5")
    assert vague.returncode == exitcodes.USAGE and "--causal-chain-id or --timestamp-ns" in vague.stderr
    refused = rankecho(
        "explain", "--mcp-url", url, *which, env={"PATH": "/usr/bin:/bin", "RANKECHO_TOKEN": "no"}
    )
    assert refused.returncode == exitcodes.FAILED and "refused the bearer token" in refused.stderr


def test_query_through_a_running_echo(live) -> None:  # type: ignore[no-untyped-def]
    _, url, db, copy = live
    sql = "SELECT node_id, count(DISTINCT rank) AS ranks FROM events WHERE rank >= 0 GROUP BY 1 ORDER BY 1"
    table = rankecho("query", "--mcp-url", url, sql, env=ENV)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines() == ["node_id | ranks", "node-a | 4", "node-b | 4"]
    remote = rankecho("query", "--mcp-url", url, "--json", sql, env=ENV)
    local = rankecho("query", "--db", str(copy), "--json", sql)
    assert (
        json.loads(remote.stdout)
        == json.loads(local.stdout)
        == {"columns": ["node_id", "ranks"], "rows": [["node-a", 4], ["node-b", 4]], "truncated": False}
    )
    cut = rankecho("query", "--mcp-url", url, "--max-rows", "3", "--json", "SELECT * FROM range(10)", env=ENV)
    assert json.loads(cut.stdout)["truncated"] is True and len(json.loads(cut.stdout)["rows"]) == 3
    refused = rankecho("query", "--mcp-url", url, "SELECT * FROM read_csv('/etc/passwd')", env=ENV)
    assert refused.returncode == exitcodes.FAILED and "file readers" in refused.stderr
    held = rankecho("query", "--db", str(db), "SELECT 1")
    assert held.returncode == exitcodes.STORE_HELD and "--mcp-url" in held.stderr
    nobody = rankecho("query", "--mcp-url", "http://127.0.0.1:9/mcp", "SELECT 1", env=ENV)
    assert nobody.returncode == exitcodes.FAILED and "nothing answers there" in nobody.stderr


def test_a_reader_that_goes_away_is_no_traceback(live) -> None:  # type: ignore[no-untyped-def]
    """``rankecho diagnose | head``: the pipe closes before diagnose writes."""
    _, _, _, copy = live
    for args in (
        ("diagnose", "--db", str(copy)),
        ("query", "--db", str(copy), "SELECT * FROM range(100000)"),
    ):
        proc = subprocess.Popen(
            [sys.executable, "-m", "rankecho", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == exitcodes.BROKEN_PIPE, err
        assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_stress_and_echo_are_plaintext_by_default_and_say_so_loudly(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TEST_TOKEN)
    common = ("--cluster-id", "c", "--events-per-producer", "20", "--retry-deadline", "10", "--quiet")
    with EchoProcess(tmp_path / "plain.db", token=TEST_TOKEN, log=tmp_path / "echo.log") as echo:
        default = rankecho("stress", "--endpoint", echo.otlp_grpc, "--node-id", "a", *common, env=ENV)
        quiet = rankecho(
            "stress",
            "--endpoint",
            echo.otlp_grpc,
            "--node-id",
            "b",
            "--insecure",
            *common,
            "--token-file",
            str(token_file),
            env={"PATH": "/usr/bin:/bin"},
        )
    assert default.returncode == 0, default.stderr
    assert json.loads(default.stdout.splitlines()[-1])["acked"] == 20
    assert "WARNING: plaintext gRPC" in default.stderr and "--tls" in default.stderr
    assert "--insecure" in default.stderr
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout.splitlines()[-1])["acked"] == 20
    assert "WARNING" not in quiet.stderr
    assert "PLAINTEXT: tokens and data cross the network unencrypted" in (tmp_path / "echo.log").read_text()
    unreadable = rankecho(
        "stress",
        "--endpoint",
        "127.0.0.1:9",
        "--node-id",
        "x",
        *common,
        "--token-file",
        str(tmp_path / "missing"),
        env=ENV,
    )
    assert unreadable.returncode == exitcodes.USAGE and "cannot read --token-file" in unreadable.stderr


def test_demo_and_evaluate_are_subcommands_with_the_module_flags() -> None:
    for name in ("demo", "evaluate"):
        sub = rankecho(name, "--help").stdout
        module = subprocess.run(
            [sys.executable, "-m", f"rankecho.{name}", "--help"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        options = lambda text: text.split("options:", 1)[1]  # noqa: E731
        assert options(sub) == options(module)
    missing = rankecho("evaluate", "--json", "/nonexistent/dir/out.json", "/nonexistent/x.yaml")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr, missing.stderr


TOKEN_FILE_USERS = [
    ("agent", "--endpoint", "127.0.0.1:9", "--cluster-id", "c"),
    ("stress", "--endpoint", "127.0.0.1:9", "--cluster-id", "c", "--node-id", "n"),
]


@pytest.mark.parametrize("command", TOKEN_FILE_USERS)
def test_an_unreadable_token_file_is_bad_input_not_a_traceback(command: tuple[str, ...],
                                                                tmp_path: Path) -> None:  # fmt: skip
    missing = tmp_path / "missing"
    done = rankecho(*command, "--token-file", str(missing))
    assert done.returncode == exitcodes.USAGE, done.stderr
    assert f"cannot read --token-file {missing}" in done.stderr and "Traceback" not in done.stderr
