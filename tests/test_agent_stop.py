"""An agent told to stop at any moment of its start-up still exits 0 (issue 11, item 7).

The launcher starts agents with SIGTERM/SIGINT blocked and the agent unblocks them once its stop
handler is installed (first thing in ``rankecho.cli.main``), so even a stop sent before Python runs
is a clean stop. Later moments (imports, BPF compile, attach, shutdown) need eBPF to get that far.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN
from test_agent_helpers import requires_ebpf, sim_built

from rankecho.sim.agents import Agent, AgentSpec, spawn_agent
from rankecho.sim.launcher import prepare_node_libs
from rankecho.sim.scenario import Node


def _spawn(tmp: Path, endpoint: str, name: str) -> Agent:
    node = Node(name, 1)
    spool = ("--spool-dir", str(tmp / name / "spool"))
    spec = AgentSpec(endpoint, "stop-test", TEST_TOKEN, sys.executable, spool)
    lib = prepare_node_libs(tmp / name / "lib", sim_built())
    return spawn_agent(spec, node, tmp / name, lib)


def test_stop_sent_before_the_interpreter_runs_exits_zero(tmp_path: Path) -> None:
    # The endpoint is never contacted: the agent stops before it attaches anything.
    agent = _spawn(tmp_path, "127.0.0.1:9", "early")
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(60) == 0, agent.log.read_text()
    assert not agent.ready.exists()


@requires_ebpf
@pytest.mark.ebpf
@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.3, 1.0, 2.5])
def test_stop_during_start_up_exits_zero(tmp_path: Path, delay_s: float) -> None:
    with inproc_echo(tmp_path / "echo.db") as echo:
        agent = _spawn(tmp_path, echo.grpc_address, "node")
        time.sleep(delay_s)
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(60) == 0, agent.log.read_text()


@requires_ebpf
@pytest.mark.ebpf
def test_repeated_stops_through_shutdown_exit_zero(tmp_path: Path) -> None:
    # A launcher that repeats SIGTERM must not hit the moment Python's finalization restores the
    # default action (that was the -15 of a fresh machine's first run).
    with inproc_echo(tmp_path / "echo.db") as echo:
        agent = _spawn(tmp_path, echo.grpc_address, "node")
        deadline = time.monotonic() + 60
        while not agent.ready.exists():
            assert agent.proc.poll() is None and time.monotonic() < deadline, agent.log.read_text()
            time.sleep(0.05)
        while agent.proc.poll() is None and time.monotonic() < deadline:
            agent.proc.send_signal(signal.SIGTERM)
            time.sleep(0.002)
        assert agent.proc.wait(5) == 0, agent.log.read_text()
