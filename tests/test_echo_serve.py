"""``rankecho serve`` and ``rankecho query`` as real processes: listening line, auth refusal, flock,
and the seed's four queries on the store a served Echo wrote."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import grpc
import pyarrow as pa
import pytest
from echo_helpers import TEST_TOKEN, grpc_export, node_request, wait_until

from rankecho.echo.store.lock import StoreLock, StoreLockedError, is_locked
from rankecho.echo.store.migrate import available
from rankecho.launch.echo import EchoProcess
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request
from rankecho.sim.procs import signals_blocked

RANKECHO = [sys.executable, "-m", "rankecho"]


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RANKECHO, *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_serve_prints_one_listening_line_and_drains_on_sigterm(echo_process: EchoProcess) -> None:
    listening = echo_process.listening
    assert set(listening) == {"otlp_grpc", "otlp_http", "mcp_http"}
    assert listening["otlp_grpc"] and listening["otlp_grpc"].startswith("127.0.0.1:")
    assert listening["otlp_http"] and listening["otlp_http"].startswith("127.0.0.1:")
    grpc_export(echo_process.otlp_grpc, node_request("n1", 300), TEST_TOKEN)
    assert echo_process.stop() == 0
    assert (
        "memory_limit 3.7 GiB" in echo_process.log.read_text()
    )  # --duckdb-memory-limit's default, in effect
    out = run_cli("query", "--db", str(echo_process.db), "--json", "SELECT count(*) AS n FROM events")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows"] == [[300]]


def test_serve_without_token_exits_naming_both_fixes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RANKECHO_TOKEN"}
    out = run_cli("serve", "--db", str(tmp_path / "e.db"), "--otlp-grpc", "127.0.0.1:0", env=env)
    assert out.returncode != 0
    assert (
        "RANKECHO_TOKEN" in out.stderr and "--token-file" in out.stderr and "--insecure-no-auth" in out.stderr
    )
    assert out.stdout == ""


def test_second_echo_on_same_store_exits_naming_the_holder(echo_process: EchoProcess, tmp_path: Path) -> None:
    assert echo_process.proc is not None
    second = EchoProcess(echo_process.db, token=TEST_TOKEN, log=tmp_path / "second.log")
    with pytest.raises(Exception, match="did not print"):
        second.start()
    assert f"pid {echo_process.proc.pid}" in (tmp_path / "second.log").read_text()
    query = run_cli("query", "--db", str(echo_process.db), "SELECT 1")
    assert query.returncode == 3 and f"pid {echo_process.proc.pid}" in query.stderr


def test_kill_9_releases_the_lock(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    echo = EchoProcess(db, token=TEST_TOKEN).start()
    with pytest.raises(StoreLockedError):
        StoreLock(db).acquire()
    echo.kill()
    with StoreLock(db):
        pass
    with EchoProcess(db, token=TEST_TOKEN) as again:
        grpc_export(again.otlp_grpc, node_request("n1", 5), TEST_TOKEN)


def test_sigterm_drains_and_every_acknowledged_event_is_stored(echo_process: EchoProcess) -> None:
    acked: list[str] = []
    failed = threading.Event()

    def produce(p: int) -> None:
        for k in range(10_000):
            ids = [f"p{p}-{k}-{i}" for i in range(200)]
            now = time.time_ns()
            points = [Point(c.M_HEALTH, now + i, 0.5, {c.EVENT_ID: e}) for i, e in enumerate(ids)]
            try:
                grpc_export(echo_process.otlp_grpc, metrics_request({"node_id": f"n{p}"}, points), TEST_TOKEN)
            except grpc.RpcError:
                failed.set()
                return
            acked.extend(ids)

    producers = [threading.Thread(target=produce, args=(p,)) for p in range(4)]
    for t in producers:
        t.start()
    wait_until(lambda: len(acked) >= 2000 or failed.is_set(), "2000 acknowledged events", timeout_s=60)
    assert not failed.is_set(), "an export failed before Echo was asked to stop"
    assert echo_process.proc is not None
    echo_process.proc.send_signal(signal.SIGTERM)
    for t in producers:
        t.join(30)
    assert failed.is_set() and echo_process.stop() == 0
    with duckdb.connect(str(echo_process.db), read_only=True) as con:
        con.register("acked", pa.table({"event_id": acked}))
        missing = "SELECT count(*) FROM acked WHERE event_id NOT IN (SELECT event_id FROM events)"
        assert con.execute(missing).fetchone() == (0,)
        counts = con.execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchone()
        total, distinct = counts or (0, 0)
    assert total == distinct >= len(acked)


@pytest.mark.parametrize("flag", ["--otlp-grpc", "--otlp-http", "--mcp-http"])
def test_a_busy_port_is_a_clear_error(tmp_path: Path, flag: str) -> None:
    """Found (issue 19): a busy port left a new empty store and its lock behind."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        env = {**os.environ, "RANKECHO_TOKEN": TEST_TOKEN}
        ports = ["--otlp-grpc", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0", "--mcp-http", "127.0.0.1:0"]
        out = run_cli("serve", "--db", str(tmp_path / "e.db"), *ports, flag, address, env=env)
    assert out.returncode == 2, out.stderr
    name = {"--otlp-grpc": "OTLP/gRPC", "--otlp-http": "OTLP/HTTP", "--mcp-http": "MCP/HTTP"}[flag]
    assert f"cannot listen for {name} on {address}" in out.stderr and f"choose another {flag}" in out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == [], "a refused start left files behind"


STOP_BOUND_S = 20.0
"""docs/echo.md: an idle Echo drains and exits well within this of a SIGTERM, sent at any moment."""


def _serve_command(db: Path) -> list[str]:
    return [*RANKECHO, "serve", "--db", str(db), "--otlp-grpc", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0",
            "--mcp-http", "127.0.0.1:0"]  # fmt: skip


@pytest.mark.parametrize(
    "when", [0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, "ready", "ready, repeated", "at once, launched blocked"]
)
def test_sigterm_at_any_moment_of_serve_is_a_clean_stop(tmp_path: Path, when: float | str) -> None:
    """Found (issue 19): a SIGTERM right after "Echo ready" was lost now and then (the handler deadlocked
    on the Event the main thread was waiting on) and Echo was killed 20 s later; a SIGTERM repeated
    while Echo exited (a supervisor retrying) turned its exit 0 into -15. Sent at fixed delays (start-up:
    imports, store creation, migration, listeners), at the listening line, and every 2 ms from there on;
    and at once to an Echo started with SIGTERM blocked, as launchers do to cover the interpreter's start."""
    db, log = tmp_path / "echo.db", tmp_path / "echo.log"
    env = {**os.environ, "RANKECHO_TOKEN": TEST_TOKEN}
    blocked = signals_blocked() if when == "at once, launched blocked" else contextlib.nullcontext()
    with log.open("wb") as err, blocked:
        proc = subprocess.Popen(_serve_command(db), stdout=subprocess.PIPE, stderr=err, env=env)
    assert proc.stdout is not None
    try:
        if isinstance(when, float):
            time.sleep(when)
        elif when.startswith("ready"):
            assert proc.stdout.readline(), log.read_text()
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        while when == "ready, repeated" and proc.poll() is None and time.monotonic() - sent < STOP_BOUND_S:
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.002)
        try:
            returncode = proc.wait(max(0.1, STOP_BOUND_S - (time.monotonic() - sent)))
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {STOP_BOUND_S:g} s after SIGTERM; log:\n{log.read_text()[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    text = log.read_text()
    if returncode == -signal.SIGTERM and "blocked" not in str(when):  # only before serve's first line
        assert text == "" and not db.exists(), f"killed by SIGTERM (-15) after serve started:\n{text[-3000:]}"
    else:
        assert returncode == 0, text[-3000:]
        assert "Traceback" not in text, text
        assert "stopped" in text or "nothing to drain" in text, text
    assert not is_locked(db)
    if db.exists():  # a stop during creation or migration still leaves a whole store
        with duckdb.connect(str(db), read_only=True) as con:
            newest = available()[-1].version
            assert con.execute("SELECT max(version) FROM schema_version").fetchone() == (newest,)


def test_a_port_lost_after_the_check_leaves_no_store_behind(tmp_path: Path) -> None:
    """Both OTLP listeners on one free port: each passes the port check alone, the second bind fails
    after the store was created, and that start removes the store, its log and its lock again."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    env = {**os.environ, "RANKECHO_TOKEN": TEST_TOKEN}
    out = run_cli("serve", "--db", str(tmp_path / "e.db"), "--otlp-grpc", address, "--otlp-http", address,
                  "--mcp-http", "", env=env)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"cannot listen for OTLP/HTTP on {address}" in out.stderr and "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == [], "the failed start left files behind"
