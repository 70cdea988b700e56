"""Run a simulated multi-node job under real agents: shared by the agent's tests and its benchmark.

Each simulated node gets its own copy of the fake ``libcudart.so.12``/``libnccl.so.2`` (distinct
inodes, as on separate hosts) and one agent started with the sim's interface (``--nccl-lib``,
``--cuda-lib``, ``--ready-file``, ``RANKECHO_TOKEN``); ranks get the torch-style environment and load
their node's copy through ``LD_LIBRARY_PATH``. Usage::

    job = SimJob(tmp, nodes=["node-a", "node-b"], ranks_per_node=4, sim_root=Path("sim"))
    agents = [job.start_agent(n, endpoint, token) for n in job.nodes]
    ranks = job.start_ranks(["--steps", "20"])
    job.wait(ranks); stop_all(agents)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

LIBS = ("libcudart.so.12", "libnccl.so.2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class AgentProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_file: Path
    signalled: bool = False

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        end = time.monotonic() + timeout_s
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > end:
                raise TimeoutError(f"agent not ready after {timeout_s} s:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (flush to Echo or the spool), then wait; returns the exit code. Signals once: a
        second SIGTERM that lands while Python is finalizing (handlers reset) kills the agent (-15)."""
        if self.proc.poll() is None and not self.signalled:
            self.signal_stop()
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def signal_stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.signalled = True

    def kill(self, wait: bool = True) -> None:
        """SIGKILL. The process lingers ~0.1 s per uprobe while the kernel detaches them."""
        if self.proc.poll() is None:
            self.proc.kill()
            if wait:
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def stop_all(agents: list[AgentProcess], timeout_s: float = 30.0) -> list[int]:
    """SIGTERM every agent at once (detaching uprobes takes the kernel ~0.1 s per probe), then wait."""
    for a in agents:
        a.signal_stop()
    return [a.stop(timeout_s) for a in agents]


@dataclass
class SimJob:
    root: Path
    nodes: list[str]
    ranks_per_node: int
    sim_root: Path
    endbr_nodes: tuple[str, ...] = ()
    """Nodes whose libraries come from the endbr64 build (functions start with endbr64)."""
    cluster_id: str = "sim"
    master_port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        for node in self.nodes:
            build = self.sim_root / ("build-endbr" if node in self.endbr_nodes else "build")
            d = self.lib_dir(node)
            d.mkdir(parents=True, exist_ok=True)
            for lib in LIBS:
                if not (d / lib).exists():
                    shutil.copy2(build / lib, d / lib)

    @property
    def world(self) -> int:
        return len(self.nodes) * self.ranks_per_node

    @property
    def simrank(self) -> Path:
        return self.sim_root / "build" / "simrank"

    def lib_dir(self, node: str) -> Path:
        return self.root / node / "lib"

    def start_agent(
        self, node: str, endpoint: str, token: str, *extra: str, name: str = "", wait: bool = True
    ) -> AgentProcess:
        tag = name or node
        ready = self.root / f"agent-{tag}.ready"
        ready.unlink(missing_ok=True)
        log_path = self.root / f"agent-{tag}.log"
        libs = self.lib_dir(node)
        cmd = [
            sys.executable, "-m", "rankecho", "agent", "--endpoint", endpoint,
            "--cluster-id", self.cluster_id, "--node-id", node,
            "--nccl-lib", str(libs / "libnccl.so.2"), "--cuda-lib", str(libs / "libcudart.so.12"),
            "--ready-file", str(ready), "--spool-dir", str(self.root / node / "spool"), *extra,
        ]
        env = {**os.environ, "RANKECHO_TOKEN": token}
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        agent = AgentProcess(proc, log_path, ready)
        if wait:
            agent.wait_ready()
        return agent

    def start_agents(self, endpoint: str, token: str, *extra: str) -> list[AgentProcess]:
        """One agent per node, started together (each compiles its BPF program for ~1 s)."""
        agents = [self.start_agent(n, endpoint, token, *extra, wait=False) for n in self.nodes]
        for a in agents:
            a.wait_ready()
        return agents

    def rank_env(self, rank: int) -> dict[str, str]:
        node = self.nodes[rank // self.ranks_per_node]
        return {
            **os.environ,
            "RANK": str(rank), "WORLD_SIZE": str(self.world),
            "LOCAL_RANK": str(rank % self.ranks_per_node), "LOCAL_WORLD_SIZE": str(self.ranks_per_node),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.master_port),
            "RANKECHO_NODE_ID": node, "LD_LIBRARY_PATH": str(self.lib_dir(node)),
            "SIMRANK_LIB_DIR": str(self.lib_dir(node)),
        }

    def start_rank(self, rank: int, args: list[str], program: Path | None = None) -> subprocess.Popen[bytes]:
        log = self.root / f"rank{rank}.log"
        cmd = [str(program or self.simrank), *args, "--log", str(log)]
        return subprocess.Popen(cmd, env=self.rank_env(rank), stderr=subprocess.PIPE)

    def start_ranks(
        self, args: list[str], per_rank: dict[int, list[str]] | None = None
    ) -> list[subprocess.Popen[bytes]]:
        per_rank = per_rank or {}
        return [self.start_rank(r, args + per_rank.get(r, [])) for r in range(self.world)]

    def wait(self, ranks: list[subprocess.Popen[bytes]], timeout_s: float = 120.0) -> None:
        end = time.monotonic() + timeout_s
        for p in ranks:
            try:
                _, err = p.communicate(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in ranks:
                    q.kill()
                raise
            if p.returncode != 0:
                raise RuntimeError(f"rank exited {p.returncode}: {err.decode(errors='replace')}")

    def rank_log(self, rank: int) -> str:
        return (self.root / f"rank{rank}.log").read_text()
