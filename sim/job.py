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

    def start_rank(self, rank: int, args: list[str], program: Path | None = None) -> subprocess.Popen[bytes]:
        node = self.nodes[rank // self.ranks_per_node]
        lib = self.lib_dir(node)
        env = torch_env(rank, self.world, node, rank % self.ranks_per_node, self.ranks_per_node,
                        self.master_port, lib, run_id=self.run_id)
        env["SIMRANK_LIB_DIR"] = str(lib)  # what the dlopen build loads
        cmd = [str(program or self.simrank), *args, "--log", str(self.root / f"rank{rank}.log")]
        return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)

    def start_ranks(
        self, args: list[str], per_rank: dict[int, list[str]] | None = None
    ) -> list[subprocess.Popen[bytes]]:
        per_rank = per_rank or {}
        return [self.start_rank(r, args + per_rank.get(r, [])) for r in range(self.world)]

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

    def rank_log(self, rank: int) -> str:
        return (self.root / f"rank{rank}.log").read_text()


def stop_all(agents: list[Agent], grace_s: float = 30.0) -> list[int]:
    """SIGTERM every agent at once, wait for each; their exit codes (a stopped agent exits 0)."""
    return stop_agents(agents, say=lambda msg: print(msg, file=sys.stderr), grace_s=grace_s)
