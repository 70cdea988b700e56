"""Failures that used to look like success (issue 19): real agents, real Echo, eBPF as root.

`rankecho sim` exited 0 while its agents lost everything (a wrong token: 851 points rejected, only the
agent log said so) or left it in a spool (Echo down or paused); the spool was the system-wide default
and went into the *next* run's Echo, mixing two jobs under one cluster id; an agent given a wrong
``--nccl-lib`` still sent its own points (a phantom cluster); a SIGTERM during the sim's start-up
killed it without stopping what it had started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, count
from test_agent_helpers import requires_ebpf, sim_built

from rankecho.launch.echo import EchoProcess
from rankecho.shared import contract as c
from rankecho.sim.launcher import free_port

REPO = Path(__file__).resolve().parents[1]
pytestmark = [requires_ebpf, pytest.mark.ebpf]
COLLECTIVES = f"metric_name = '{c.M_COLLECTIVE}'"


def scenario(tmp: Path, steps: int = 15, cluster: str = "loss") -> Path:
    path = tmp / f"{cluster}-{steps}.yaml"
    path.write_text(json.dumps({  # JSON is YAML
        "cluster_id": cluster, "steps": steps, "nodes": [{"id": "n0", "ranks": 2}],
        "step": {"compute_ms": 5, "host_ms": 0.2, "dataloader_ms": 0.2, "allreduce_mb": 1},
    }))  # fmt: skip
    return path


def env(tmp: Path) -> dict[str, str]:
    """The agents' default spool root is kept under the test's directory (the old code's default spool,
    shared by every run, lived there: what the test of two runs watches)."""
    return {**os.environ, "RANKECHO_SPOOL_ROOT": str(tmp / "spool-root")}


def sim(tmp: Path, run: str, endpoint: str, token: str = TEST_TOKEN, steps: int = 15,
        cluster: str = "loss") -> subprocess.CompletedProcess[str]:  # fmt: skip
    argv = [sys.executable, "-m", "rankecho", "sim", str(scenario(tmp, steps, cluster)), "--run-dir",
            str(tmp / run), "--agent-endpoint", endpoint, "--token", token]  # fmt: skip
    return subprocess.run(argv, cwd=REPO, env=env(tmp), capture_output=True, text=True, timeout=180)


def test_a_wrong_token_fails_the_run_naming_the_token(tmp_path: Path) -> None:
    with inproc_echo(tmp_path / "echo.db") as echo:
        out = sim(tmp_path, "run", echo.grpc_address, token="WRONG")
        assert count(echo) == 0
    assert out.returncode == 1, out.stderr
    assert "Echo rejected" in out.stderr and "points for good (UNAUTHENTICATED" in out.stderr, out.stderr
    assert "--token" in out.stderr and "Echo's token" in out.stderr


def test_a_paused_echo_fails_the_run_naming_the_undelivered_points_and_the_spool(tmp_path: Path) -> None:
    # The measured case: Echo stopped (SIGSTOP) through the run; nothing may be reported as done.
    with EchoProcess(tmp_path / "echo.db", token=TEST_TOKEN) as echo:
        echo.proc.send_signal(signal.SIGSTOP)
        try:
            out = sim(tmp_path, "run", echo.otlp_grpc)
        finally:
            echo.proc.send_signal(signal.SIGCONT)
    assert out.returncode == 1, out.stderr
    spool = tmp_path / "run" / "n0" / "spool"
    assert "points not delivered: Echo at" in out.stderr, out.stderr
    assert f"they wait in {spool}/run-" in out.stderr and f"--spool-dir {spool} " in out.stderr
    assert "did not deliver all their data" in out.stderr.splitlines()[-1]
    assert list(spool.glob("run-*/*.otlp")), "the undelivered points are kept in the run's spool"


def test_two_runs_under_one_cluster_id_do_not_mix(tmp_path: Path) -> None:
    first = sim(tmp_path, "run1", f"127.0.0.1:{free_port()}")  # no Echo there: everything is spooled
    assert first.returncode == 1, first.stderr
    between = time.time_ns()
    with inproc_echo(tmp_path / "echo.db") as echo:
        second = sim(tmp_path, "run2", echo.grpc_address)
        assert second.returncode == 0, second.stderr
        assert count(echo, f"{COLLECTIVES} AND timestamp_ns < {between}") == 0, "the first run's collectives"
        assert count(echo, f"{COLLECTIVES} AND timestamp_ns >= {between}") == 2 * 15 * 1


def test_a_reused_run_dir_with_undelivered_points_is_refused(tmp_path: Path) -> None:
    first = sim(tmp_path, "run", f"127.0.0.1:{free_port()}")
    assert first.returncode == 1, first.stderr
    with inproc_echo(tmp_path / "echo.db") as echo:
        again = sim(tmp_path, "run", echo.grpc_address)
        assert count(echo) == 0
    assert again.returncode == 1
    assert f"{tmp_path / 'run' / 'n0' / 'spool'} holds" in again.stderr and "new --run-dir" in again.stderr


@pytest.mark.parametrize(("flag", "path", "why"), [
    ("--nccl-lib", "{lib}/libcudart.so.12", "exports none of the"),
    ("--nccl-lib", "/etc/passwd", "is not an ELF file"),
    ("--cuda-lib", "{tmp}/missing.so", "does not exist"),
])  # fmt: skip
def test_a_wrong_library_exits_2_and_sends_nothing(tmp_path: Path, flag: str, path: str, why: str) -> None:
    lib = sim_built() / "build"
    path = path.format(lib=lib, tmp=tmp_path)
    libs = {"--nccl-lib": str(lib / "libnccl.so.2"), "--cuda-lib": str(lib / "libcudart.so.12"), flag: path}
    with inproc_echo(tmp_path / "echo.db") as echo:
        argv = [sys.executable, "-m", "rankecho", "agent", "--endpoint", echo.grpc_address, "--cluster-id",
                "phantom", "--spool-dir", str(tmp_path / "spool"), *(w for kv in libs.items() for w in kv)]
        out = subprocess.run(argv, cwd=REPO, env={**os.environ, "RANKECHO_TOKEN": TEST_TOKEN},
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        time.sleep(0.5)  # anything sent would be committed by now
        assert count(echo) == 0, "a misconfigured agent put points in Echo"
    assert out.returncode == 2, out.stderr
    assert f"{flag} {path} {why}" in out.stderr and f"or drop {flag}" in out.stderr
    assert "Traceback" not in out.stderr


def alive_under(run_dir: Path) -> list[int]:
    """Processes (not zombies) whose command line names the run directory: ranks and agents."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(run_dir).encode() in cmd and state not in ("Z", "X"):
            found.append(pid)
    return found


def stop_repeatedly(proc: subprocess.Popen[str], after_s: float, timeout_s: float = 60.0) -> str:
    """SIGTERM ``after_s`` after the start, then every 0.1 s until the process exits (a supervisor that
    repeats its stop: each one must find a handler, none may cut the drain short); its stderr."""
    time.sleep(after_s)
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
    _, err = proc.communicate(timeout=5)
    return err


# From 0.3 s: before that the interpreter itself may still be starting (~0.1 s with an editable install),
# which no Python program can handle; launchers close that gap by spawning with the signals blocked.
@pytest.mark.parametrize("delay_s", [0.3, 0.8, 1.5, 3.0])
def test_sim_stopped_at_any_moment_of_its_start_stops_and_drains_everything(
    tmp_path: Path, delay_s: float
) -> None:
    run_dir = tmp_path / "run"
    with inproc_echo(tmp_path / "echo.db") as echo:
        argv = [sys.executable, "-m", "rankecho", "sim", str(scenario(tmp_path, steps=3000)), "--run-dir",
                str(run_dir), "--agent-endpoint", echo.grpc_address, "--token", TEST_TOKEN]  # fmt: skip
        proc = subprocess.Popen(argv, cwd=REPO, env=env(tmp_path), stderr=subprocess.PIPE, text=True)
        err = stop_repeatedly(proc, delay_s)
        assert proc.returncode == 143, err
        assert alive_under(run_dir) == [], "a rank or an agent outlived the sim"
    assert "Traceback" not in err
    for log in run_dir.glob("n0/agent*.log"):  # an agent that was started drained and said so
        assert "delivery summary" in log.read_text(), log.read_text()


@pytest.mark.parametrize("delay_s", [0.3, 0.6, 1.0, 2.0])
def test_agent_stopped_at_any_moment_of_its_start_exits_0_having_drained(
    tmp_path: Path, delay_s: float
) -> None:
    # Started as a supervisor would (no blocked signals, unlike sim.agents.spawn_agent). Both libraries
    # named: no other process on the machine is traced.
    lib = sim_built() / "build"
    with inproc_echo(tmp_path / "echo.db") as echo:
        argv = [sys.executable, "-m", "rankecho", "agent", "--endpoint", echo.grpc_address, "--spool-dir",
                str(tmp_path / "spool"), "--nccl-lib", str(lib / "libnccl.so.2"), "--cuda-lib",
                str(lib / "libcudart.so.12")]  # fmt: skip
        proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "RANKECHO_TOKEN": TEST_TOKEN},
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        # A stop after the probes are attached pays for detaching ~45 uprobes (each release waits for
        # kernel RCU grace periods: ~5 s on this VM, up to ~40 s with the machine loaded), so the bound is
        # generous: the test is about exiting 0 drained, not about how fast the kernel lets go.
        err = stop_repeatedly(proc, delay_s, timeout_s=90)
    assert proc.returncode == 0, err
    assert "delivery summary: " in err.splitlines()[-1]


def run_agent(tmp: Path, endpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """One agent of cluster ``loss`` on node ``n0`` (the sim's libraries named, so nothing else on the
    machine is traced), stopped once ready: it sends only its own points."""
    lib = sim_built() / "build"
    ready = tmp / "agent.ready"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "rankecho", "agent", "--endpoint", endpoint, "--cluster-id", "loss",
            "--node-id", "n0", "--nccl-lib", str(lib / "libnccl.so.2"), "--cuda-lib",
            str(lib / "libcudart.so.12"), "--ready-file", str(ready), "--shutdown-grace", "1",
            *extra]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, env={**env(tmp), "RANKECHO_TOKEN": TEST_TOKEN},
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(argv, proc.returncode, "", err)


def test_the_default_spool_is_replayed_only_when_named(tmp_path: Path) -> None:
    first = run_agent(tmp_path, f"127.0.0.1:{free_port()}")  # no Echo: its points stay in its spool
    default = tmp_path / "spool-root" / "loss-n0"
    assert first.returncode == 1, first.stderr
    assert f"they wait in {default}/run-" in first.stderr and f"--spool-dir {default} " in first.stderr
    between = time.time_ns()
    with inproc_echo(tmp_path / "echo.db") as echo:
        second = run_agent(tmp_path, echo.grpc_address)  # same cluster and node, default spool
        assert second.returncode == 0, second.stderr
        assert count(echo, f"timestamp_ns < {between}") == 0, "the first run's points were replayed"
        named = run_agent(tmp_path, echo.grpc_address, "--spool-dir", str(default))
        assert named.returncode == 0, named.stderr
        assert count(echo, f"timestamp_ns < {between}") > 0, "naming the spool sends what waits there"
    assert not list(default.glob("run-*/*.otlp"))
