"""A simulated job driven by hand, for tests and benchmarks: the launcher's pieces without a scenario.

``rankecho sim`` runs a whole scenario (:func:`rankecho.sim.launcher.run_scenario`); agent tests and the agent
benchmark instead start agents and ranks themselves, with raw simrank options, to time what happens
between them. Both copy libraries (:func:`sim.launcher.prepare_node_libs`), build the rank environment
(:func:`sim.launcher.torch_env`) and start, wait for and stop agents (:mod:`sim.agents`) the same way, so
a launch bug cannot hide in one of two launchers. Usage::

    job = SimJob(tmp, ["node-a", "node-b"], ranks_per_node=4, endbr_nodes=("node-b",))
    agents = job.start_agents(endpoint, token)
    job.wait(job.start_ranks(["--steps", "20"]))
    assert stop_all(agents) == [0, 0]
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rankecho.sim.agents import Agent, AgentSpec, spawn_agent, stop_agents, wait_ready
from rankecho.sim.launcher import SIM_ROOT, free_port, prepare_node_libs, torch_env
from rankecho.sim.procs import LaunchError
from rankecho.sim.scenario import Node


@dataclass(frozen=True)
class SimRun:
    """One job launched on a :class:`SimJob`'s nodes: its rendezvous port (MASTER_PORT, also what keeps
    its barriers apart from another job's), TORCHELASTIC_RUN_ID (None: none, so the agent names the job by
    its rendezvous and first start time) and the prefix of its rank logs. Several runs on one SimJob are
    several jobs on the same nodes, traced by the same agents: at once (different ports) or one after
    the other (same port and ranks)."""

    port: int
    run_id: str | None
    tag: str = ""


@dataclass
class SimJob:
    root: Path
    nodes: list[str]
    ranks_per_node: int
    sim_root: Path = SIM_ROOT
    endbr_nodes: tuple[str, ...] = ()
    """Nodes whose libraries come from the endbr64 build (functions start with endbr64)."""
    cluster_id: str = "sim"
    master_port: int = field(default_factory=free_port)
    run_id: str | None = ""
    """TORCHELASTIC_RUN_ID of the ranks: "" means ``sim-<master port>``; None sets none (the agent then
    names the job by its rendezvous and first start time)."""

    def __post_init__(self) -> None:
        for node in self.nodes:
            prepare_node_libs(self.lib_dir(node), self.sim_root, node in self.endbr_nodes)
        if self.run_id == "":
            self.run_id = f"sim-{self.master_port}"

    @property
    def world(self) -> int:
        return len(self.nodes) * self.ranks_per_node

    @property
    def simrank(self) -> Path:
        return self.sim_root / "build" / "simrank"

    def lib_dir(self, node: str) -> Path:
        return self.root / node / "lib"

    def start_agent(self, node: str, endpoint: str, token: str, *extra: str, wait: bool = True) -> Agent:
        """The node's agent, spooling under ``<root>/<node>/spool`` (:func:`sim.agents.agent_argv`); a
        second one logs to agent.2.log."""
        spec = AgentSpec(endpoint, self.cluster_id, token, sys.executable, extra)
        agent = spawn_agent(spec, Node(node, self.ranks_per_node), self.root / node, self.lib_dir(node))
        if wait:
            wait_ready([agent])
        return agent

    def start_agents(self, endpoint: str, token: str, *extra: str) -> list[Agent]:
        """One agent per node, started together (each compiles its BPF program for ~1 s)."""
        agents = [self.start_agent(n, endpoint, token, *extra, wait=False) for n in self.nodes]
        wait_ready(agents)
        return agents

    @property
    def main_run(self) -> SimRun:
        """The job :meth:`start_ranks` launches by default (the SimJob's own port and run id)."""
        return SimRun(self.master_port, self.run_id)

    def another_run(self, tag: str, run_id: str | None = "", port: int | None = None) -> SimRun:
        """Another job on these nodes: a fresh port unless ``port`` (the same port and ranks: a job
        that follows another); ``run_id`` "" means ``sim-<port>-<tag>``, None no run id."""
        port = port if port is not None else free_port()
        return SimRun(port, f"sim-{port}-{tag}" if run_id == "" else run_id, tag)

    def start_rank(self, rank: int, args: list[str], program: Path | None = None,
                   run: SimRun | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
        run = run or self.main_run
        node = self.nodes[rank // self.ranks_per_node]
        lib = self.lib_dir(node)
        env = torch_env(rank, self.world, node, rank % self.ranks_per_node, self.ranks_per_node,
                        run.port, lib, run_id=run.run_id)
        env["SIMRANK_LIB_DIR"] = str(lib)  # what the dlopen build loads
        cmd = [str(program or self.simrank), *args, "--log", str(self.rank_log_path(rank, run))]
        return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)

    def start_ranks(
        self, args: list[str], per_rank: dict[int, list[str]] | None = None, run: SimRun | None = None
    ) -> list[subprocess.Popen[bytes]]:
        per_rank = per_rank or {}
        return [self.start_rank(r, args + per_rank.get(r, []), run=run) for r in range(self.world)]

    def wait(self, ranks: list[subprocess.Popen[bytes]], timeout_s: float = 120.0) -> None:
        """Every rank exits 0 within ``timeout_s`` (all are killed otherwise)."""
        end = time.monotonic() + timeout_s
        for p in ranks:
            try:
                _, err = p.communicate(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in ranks:
                    q.kill()
                raise
            if p.returncode != 0:
                raise LaunchError(f"rank exited {p.returncode}: {err.decode(errors='replace')}")

    def rank_log_path(self, rank: int, run: SimRun | None = None) -> Path:
        return self.root / f"{run.tag if run else ''}rank{rank}.log"

    def rank_log(self, rank: int, run: SimRun | None = None) -> str:
        return self.rank_log_path(rank, run).read_text()


def stop_all(agents: list[Agent], grace_s: float = 30.0) -> list[int]:
    """SIGTERM every agent at once, wait for each; their exit codes (a stopped agent exits 0)."""
    return stop_agents(agents, say=lambda msg: print(msg, file=sys.stderr), grace_s=grace_s)
