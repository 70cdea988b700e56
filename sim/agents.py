"""One rankecho agent per simulated node, started with the command agreed with the agent.

Agents of all nodes start together (each compiles its BPF program for about a second) and the
caller waits until every ready file exists; after the ranks exit each agent gets SIGTERM and time
to flush. Usage::

    agents = start_agents(nodes, AgentSpec(endpoint, cluster_id, token, python), run_dir, lib_dirs)
    ...
    stop_agents(agents, say=print)
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from rankecho.agent.export import LOSS_MARK
from rankecho.sim.clocks import clock_argv
from rankecho.sim.procs import LaunchError, Stopped, signals_blocked, stop_process, tail
from rankecho.sim.scenario import Node
from rankecho.stopflag import StopFlag

READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class AgentSpec:
    endpoint: str
    cluster_id: str
    token: str | None
    python: str
    extra: tuple[str, ...] = ()
    """More ``rankecho agent`` options (tests: ``--spool-dir``, ``--pid``, ``--scan-interval``)."""
    clock_epoch_ns: int = 0
    """True Unix ns from which a drifting node clock drifts (sim/clocks.py)."""


@dataclass
class Agent:
    node: Node
    proc: subprocess.Popen[bytes]
    log: Path
    ready: Path
    ready_ns: int = 0
    """Wall-clock ns when its probes were attached (the ready file appeared): it sees what follows."""
    stopped_ns: int = 0
    """Wall-clock ns when it was told to stop (or killed)."""
    killed: bool = False
    """Killed on purpose (a scenario's agent restart): its exit code says nothing; its successor adopts
    its spool."""

    def observed(self) -> dict[str, object]:
        """The span of the job this agent could see, for the ground truth."""
        return {"node_id": self.node.id, "from_ns": self.ready_ns, "to_ns": self.stopped_ns or time.time_ns()}


def agent_argv(spec: AgentSpec, node: Node, lib_dir: Path, ready: Path) -> list[str]:
    """The node's agent command line; it spools under ``<node dir>/spool`` (this run's, so a later run
    never replays it) unless ``spec.extra`` names a ``--spool-dir``."""
    spool = () if "--spool-dir" in spec.extra else ("--spool-dir", str(ready.parent / "spool"))
    return [
        *(spec.python, "-m", "rankecho", "agent", "--endpoint", spec.endpoint),
        *("--cluster-id", spec.cluster_id, "--node-id", node.id),
        *("--nccl-lib", str(lib_dir / "libnccl.so.2"), "--cuda-lib", str(lib_dir / "libcudart.so.12")),
        *("--clock-offset-ns", str(node.clock_offset_ns), "--ready-file", str(ready)),
        *clock_argv(node, spec.clock_epoch_ns, ready.parent),
        *spool,
        *spec.extra,
    ]


def spawn_agent(spec: AgentSpec, node: Node, node_dir: Path, lib_dir: Path) -> Agent:
    """Start the node's agent; a node's later agents (a restart) log to agent.2.log, agent.3.log, ...

    It starts with SIGTERM/SIGINT blocked (:func:`sim.procs.signals_blocked`): the agent unblocks them
    once its stop handler is installed (``rankecho.stopflag.install``), so an early stop is a clean one.
    Anything started in its place must do the same, or it only stops by SIGKILL after the grace time."""
    ready, log = node_dir / "agent.ready", node_dir / "agent.log"
    n = 1
    while log.exists():
        n += 1
        log = node_dir / f"agent.{n}.log"
    ready.unlink(missing_ok=True)
    env = dict(os.environ)
    if spec.token is not None:
        env["RANKECHO_TOKEN"] = spec.token
    with log.open("wb") as out, signals_blocked():
        proc = subprocess.Popen(
            agent_argv(spec, node, lib_dir, ready),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return Agent(node, proc, log, ready)


def wait_ready(
    agents: Iterable[Agent], timeout_s: float = READY_TIMEOUT_S, stop: StopFlag | None = None
) -> None:
    """Block until every agent's ready file exists; raise naming the agent and its log otherwise, or
    :class:`Stopped` once ``stop`` is set."""
    deadline = time.monotonic() + timeout_s
    for a in agents:
        while not a.ready.exists():
            if stop is not None and stop.is_set():
                raise Stopped(stop.signum)
            if a.proc.poll() is not None:
                raise LaunchError(
                    f"the agent for node {a.node.id} exited with code {a.proc.returncode} before it was "
                    f"ready; its log {a.log} ends with:\n{tail(a.log)}"
                )
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"the agent for node {a.node.id} was not ready within {timeout_s:.0f} s "
                    f"(no {a.ready}); see its log {a.log}:\n{tail(a.log)}"
                )
            time.sleep(0.05)
        a.ready_ns = time.time_ns()


def start_agents(
    nodes: Iterable[Node], spec: AgentSpec, run_dir: Path, lib_dirs: dict[str, Path], into: list[Agent],
    stop: StopFlag | None = None,
) -> None:
    """Start one agent per node, appending each to ``into`` at once (so a failure or a stop still stops
    them), then wait until all are ready."""
    started = []
    for node in nodes:
        agent = spawn_agent(spec, node, run_dir / node.id, lib_dirs[node.id])
        into.append(agent)
        started.append(agent)
    wait_ready(started, stop=stop)


def stop_agents(agents: Iterable[Agent], say: Callable[[str], None], grace_s: float = 30.0) -> list[int]:
    """SIGTERM every agent at once (each takes ~0.1 s per uprobe to detach), wait; their exit codes."""
    agents = list(agents)
    for a in agents:
        if a.proc.poll() is None:
            a.stopped_ns = a.stopped_ns or time.time_ns()
            a.proc.send_signal(signal.SIGTERM)
    for a in agents:
        stop_process(a.proc, sig=None, grace_s=grace_s)  # signalled above: wait, never signal twice
        failure = describe_failure(a)
        if failure:
            say(f"error: {failure}")
    return [int(a.proc.returncode) for a in agents]


def describe_failure(a: Agent) -> str | None:
    """Why this (exited) agent's run is not a clean one, with the agent's own cause-and-fix lines: it
    exited non-zero (points rejected, dropped or left unsent; a crash) without being killed on purpose.
    None when it exited 0 or was killed by the launcher."""
    code = a.proc.returncode
    if code in (0, None) or a.killed:
        return None
    lines = [line[line.index(LOSS_MARK):] for line in tail(a.log, 20_000).splitlines() if LOSS_MARK in line]
    if not lines:
        return f"the agent for {a.node.id} exited with code {code}; see its log {a.log}:\n{tail(a.log, 500)}"
    text = "\n  ".join(lines)
    hint = ("\n  (rankecho sim passes the token from --token or RANKECHO_TOKEN: give it Echo's token)"
            if "UNAUTHENTICATED" in text else "")
    return (f"the agent for {a.node.id} did not deliver all its data (exit {code}; log {a.log}):\n"
            f"  {text}{hint}")
