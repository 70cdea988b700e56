"""Launch a simulated cluster: nodes x ranks as separate simrank processes, optionally one agent per node.

Each node gets its own copy of the libraries (``<run dir>/<node>/lib/``, distinct inodes, as on two
hosts); each rank gets the torch-style environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) plus RANKECHO_NODE_ID. With an agent endpoint, every node's agent is
started and ready before that node's ranks start (or, with ``agent_start_after_step: K``, once
every rank finished step K), and gets SIGTERM after the ranks exit so it can flush. Usage::

    result = run_scenario(load_scenario(path), LaunchOptions(ground_truth=Path("truth.json")))
    result.returncode  # 0 when every rank finished
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rankecho import stopflag
from rankecho.sim.agents import Agent, AgentSpec, describe_failure, start_agents, stop_agents
from rankecho.sim.clocks import SimClocks
from rankecho.sim.groundtruth import build_ground_truth, rank_log_path, read_rank_logs
from rankecho.sim.procs import LaunchError, Stopped, stop_process, tail
from rankecho.sim.programs import rank_argv
from rankecho.sim.scenario import Node, Scenario

__all__ = ["LaunchError", "LaunchOptions", "RunResult", "Stopped", "run_scenario"]

SIM_ROOT = Path(__file__).resolve().parent
LIB_NAMES = ("libcudart.so.12", "libnccl.so.2")


@dataclass(frozen=True)
class LaunchOptions:
    run_dir: Path | None = None
    ground_truth: Path | None = None
    agent_endpoint: str | None = None
    token: str | None = None
    timeout_s: float | None = None
    python: str = sys.executable
    progress: IO[str] | None = sys.stderr
    progress_every_s: float = 2.0


@dataclass
class RunResult:
    returncode: int
    run_dir: Path
    wall_s: float
    truth: dict[str, Any] | None = None
    lib_dirs: dict[str, Path] = field(default_factory=dict)


def build_libs(root: Path = SIM_ROOT) -> None:
    """Run the (incremental) sim Makefile so the libraries and simrank exist and are current."""
    if not (root / "Makefile").exists():
        if not (root / "build" / "simrank").exists():
            raise LaunchError(f"{root}/build/simrank is missing and there is no Makefile to build it")
        return
    proc = subprocess.run(["make", "-s", "-C", str(root)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise LaunchError(
            f"building the simulated libraries failed (needs gcc and make):\n{proc.stderr[-2000:]}"
        )


def prepare_node_libs(lib: Path, root: Path = SIM_ROOT, endbr: bool = False) -> Path:
    """Copy the library pair into ``lib`` (fresh files, own inodes, as on another host), with the
    unversioned ``.so`` links a dlopen by short name needs; ``endbr``: the build whose functions start
    with endbr64."""
    src = root / ("build-endbr" if endbr else "build")
    lib.mkdir(parents=True, exist_ok=True)
    for name in LIB_NAMES:
        dst = lib / name
        dst.unlink(missing_ok=True)
        shutil.copy2(src / name, dst)
        link = lib / name.split(".so")[0]
        link = link.with_name(link.name + ".so")
        link.unlink(missing_ok=True)
        link.symlink_to(name)
    return lib


def prepare_lib_dirs(run_dir: Path, scenario: Scenario, root: Path = SIM_ROOT) -> dict[str, Path]:
    """Copy the library pair into ``<run dir>/<node>/lib`` for every node."""
    return {n.id: prepare_node_libs(run_dir / n.id / "lib", root, scenario.endbr) for n in scenario.nodes}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(
    scenario: Scenario, rank: int, node: Node, local: int, port: int, lib_dir: Path
) -> dict[str, str]:
    env = torch_env(rank, scenario.world_size, node.id, local, node.ranks, port,
                    lib_dir if scenario.load == "linked" else None, run_id=f"sim-{port}")
    if scenario.bus_gbps is not None:  # a uniformly slower network: the fake libnccl's bus bandwidth
        env["RANKECHO_SIM_BUS_GBPS"] = str(scenario.bus_gbps)
    return env


def torch_env(
    rank: int, world: int, node_id: str, local: int, local_world: int, port: int, lib_dir: Path | None,
    run_id: str | None = None,
) -> dict[str, str]:
    """This process's environment plus what torchrun gives a rank; ``lib_dir`` goes first on
    LD_LIBRARY_PATH (the node's copy of the libraries is the one a linked simrank loads). ``run_id``
    becomes TORCHELASTIC_RUN_ID (torchrun's ``--rdzv-id``): the job identity every node's agent agrees on
    (agent/jobid.py); None leaves it out (the agent then falls back to the rendezvous rule)."""
    env = dict(os.environ)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local_world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANKECHO_NODE_ID": node_id,
            "SIMRANK_DIE_WITH_PARENT": "1",
        }
    )
    env.pop("TORCHELASTIC_RUN_ID", None)
    if run_id is not None:
        env["TORCHELASTIC_RUN_ID"] = run_id
    if lib_dir is not None:
        env["LD_LIBRARY_PATH"] = (
            f"{lib_dir}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else str(lib_dir)
        )
    return env


class Cluster:
    """The processes of one run. Not reusable: build one per run."""

    def __init__(self, scenario: Scenario, opts: LaunchOptions, run_dir: Path, lib_dirs: dict[str, Path],
                 stop: stopflag.StopFlag | None = None):
        self.scenario, self.opts, self.run_dir, self.lib_dirs = scenario, opts, run_dir, lib_dirs
        self.stop = stop or stopflag.StopFlag()
        """Set by SIGTERM/SIGINT; polled where stopping is safe (:func:`stopflag.handled`)."""
        self.ranks: dict[int, subprocess.Popen[bytes]] = {}
        self.agents: list[Agent] = []
        self._last_progress = 0.0
        self._log_offsets: dict[int, int] = {}
        self._steps: dict[int, int] = {}
        self._reported_agents: list[Agent] = []
        self.clocks = SimClocks(scenario, run_dir)

    def say(self, msg: str) -> None:
        if self.opts.progress is not None:
            print(f"rankecho sim: {msg}", file=self.opts.progress, flush=True)

    def start_ranks(self) -> None:
        port = free_port()
        for rank, node, local in self.scenario.rank_layout():
            lib = self.lib_dirs[node.id]
            log = rank_log_path(self.run_dir, node.id, rank)
            argv = rank_argv(self.scenario, rank, node, log, lib)
            env = rank_env(self.scenario, rank, node, local, port, lib)
            with (self.run_dir / node.id / f"rank{rank}.stderr").open("wb") as err:
                self.ranks[rank] = subprocess.Popen(
                    argv, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True
                )
        self.say(
            f"started {len(self.ranks)} ranks on {len(self.scenario.nodes)} nodes; run dir {self.run_dir}"
        )

    def steps_done(self) -> dict[int, int]:
        """Steps each rank has logged so far, reading only what was appended since the last call."""
        for rank, node, _ in self.scenario.rank_layout():
            try:
                with rank_log_path(self.run_dir, node.id, rank).open("rb") as f:
                    f.seek(self._log_offsets.get(rank, 0))
                    chunk = f.read()
            except OSError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a half-written line is read next time
            self._log_offsets[rank] = self._log_offsets.get(rank, 0) + len(complete)
            lines = complete.split(b"\n")
            self._steps[rank] = self._steps.get(rank, 0) + sum(line.startswith(b"step ") for line in lines)
        return {rank: self._steps.get(rank, 0) for rank, _, _ in self.scenario.rank_layout()}

    def check_agents(self) -> None:
        """An agent that dies mid-run does not stop the job (the ranks are fine); say so once."""
        for a in self.agents:
            if a.proc.poll() is not None and a not in self._reported_agents:
                self._reported_agents.append(a)
                self.say(
                    f"warning: the agent for {a.node.id} exited with code {a.proc.returncode} during the "
                    f"run; see {a.log}:\n{tail(a.log, 500)}"
                )

    def report_progress(self, done: dict[int, int], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_progress < self.opts.progress_every_s:
            return
        self._last_progress = now
        slowest = min(done, key=lambda r: done[r])
        running = sum(p.poll() is None for p in self.ranks.values())
        self.say(
            f"step {done[slowest]}/{self.scenario.steps} (slowest rank {slowest}), {running} ranks running"
        )

    def failed_rank(self) -> int | None:
        for rank, proc in self.ranks.items():
            if proc.poll() not in (None, 0):
                return rank
        return None

    def root_failure(self) -> int:
        """A failed rank that did not merely abort because a peer vanished (else the lowest failed rank)."""
        failed = sorted(r for r, p in self.ranks.items() if p.poll() not in (None, 0))
        for rank in failed:
            node = next(n for r, n, _ in self.scenario.rank_layout() if r == rank)
            text = tail(self.run_dir / node.id / f"rank{rank}.stderr")
            if "left without ncclCommDestroy" not in text and "lost the connection" not in text:
                return rank
        return failed[0]

    def describe_failure(self, rank: int) -> str:
        node = next(n for r, n, _ in self.scenario.rank_layout() if r == rank)
        err = self.run_dir / node.id / f"rank{rank}.stderr"
        return (
            f"rank {rank} on {node.id} exited with code {self.ranks[rank].returncode}; "
            f"{err} ends with:\n{tail(err)}"
        )

    def wait(self) -> None:
        """Block until every rank exited; start (or restart) agents on the way; raise on a failure."""
        deadline = time.monotonic() + self.opts.timeout_s if self.opts.timeout_s else None
        late: dict[int, list[Node]] = {}
        restarts: dict[int, list[Node]] = {}
        if self.opts.agent_endpoint:
            for node in self.scenario.nodes:
                if self.scenario.agent_start_step(node) > 0:
                    late.setdefault(self.scenario.agent_start_step(node), []).append(node)
                if node.agent_restart_after_step > 0:
                    restarts.setdefault(node.agent_restart_after_step, []).append(node)
        while any(p.poll() is None for p in self.ranks.values()):
            if self.stop.wait(0.1):
                raise Stopped(self.stop.signum)
            done = self.steps_done()
            self.report_progress(done)
            self.check_agents()
            for step in [s for s in sorted(late) if min(done.values()) >= s]:
                nodes = late.pop(step)
                names = ", ".join(n.id for n in nodes)
                self.say(f"every rank passed step {step}: starting the agents of {names}")
                self.start_agents(nodes)
            for step in [s for s in sorted(restarts) if min(done.values()) >= s]:
                self.restart_agents(restarts.pop(step), step)
            for node_id in self.clocks.poll(min(done.values())):
                self.say(f"stepped the clock of {node_id}")
            bad = self.failed_rank()
            if bad is not None:
                time.sleep(0.5)  # peers of a dead rank abort too; report the one that failed first
                raise LaunchError(self.describe_failure(self.root_failure()))
            if deadline and time.monotonic() > deadline:
                raise LaunchError(
                    f"the run exceeded its {self.opts.timeout_s:.0f} s timeout at step "
                    f"{min(done.values())}/{self.scenario.steps}"
                )
        bad = self.failed_rank()
        if bad is not None:
            raise LaunchError(self.describe_failure(bad))
        self.report_progress(self.steps_done(), force=True)

    def stop_ranks(self) -> None:
        for proc in self.ranks.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.ranks.values():
            stop_process(proc, grace_s=3.0)

    def agent_spec(self) -> AgentSpec:
        assert self.opts.agent_endpoint
        return AgentSpec(
            self.opts.agent_endpoint, self.scenario.cluster_id, self.opts.token, self.opts.python,
            clock_epoch_ns=self.clocks.epoch_ns,
        )

    def start_agents(self, nodes: list[Node]) -> None:
        before = len(self.agents)
        start_agents(nodes, self.agent_spec(), self.run_dir, self.lib_dirs, self.agents, self.stop)
        for a in self.agents[before:]:
            self.say(f"agent for {a.node.id} ready (pid {a.proc.pid}, log {a.log})")

    def restart_agents(self, nodes: list[Node], step: int) -> None:
        """kill -9 these nodes' agents (as a crash or an OOM kill would) and start new ones at once."""
        ids = {n.id for n in nodes}
        for a in [a for a in self.agents if a.node.id in ids and a.proc.poll() is None]:
            a.stopped_ns = time.time_ns()
            a.killed = True
            a.proc.send_signal(signal.SIGKILL)
            a.proc.wait()
            self._reported_agents.append(a)
        names = ", ".join(sorted(ids))
        self.say(f"every rank passed step {step}: killed and restarting the agents of {names}")
        self.start_agents(nodes)


def leftover_spools(run_dir: Path, scenario: Scenario) -> None:
    """Refuse a ``--run-dir`` whose node spools still hold an earlier run's undelivered points: this
    run's agents would replay them into this run's Echo, mixing two jobs under one cluster id."""
    for node in scenario.nodes:
        spool = run_dir / node.id / "spool"
        held = sorted(spool.glob("*/*.otlp")) if spool.is_dir() else []
        if held:
            raise LaunchError(
                f"{spool} holds {len(held)} requests an earlier run could not deliver; send them with "
                f"`rankecho agent --spool-dir {spool} --endpoint ECHO`, or delete {spool}, or use a new "
                "--run-dir"
            )


def run_scenario(scenario: Scenario, opts: LaunchOptions) -> RunResult:
    """Run the scenario to completion. Returns 0 on success; 1 if a process failed or an agent did not
    deliver all its data (stderr names which and the fix); 130/143 if stopped by SIGINT/SIGTERM, at any
    moment: the stop signals only set a flag, polled here, so agents are always stopped and drained."""
    with stopflag.handled() as stop:
        return _run(scenario, opts, stop)


def _run(scenario: Scenario, opts: LaunchOptions, stop: stopflag.StopFlag) -> RunResult:
    build_libs()
    run_dir = (opts.run_dir or Path(tempfile.mkdtemp(prefix=f"rankecho-sim-{scenario.name}-"))).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    lib_dirs = prepare_lib_dirs(run_dir, scenario)
    cluster = Cluster(scenario, opts, run_dir, lib_dirs, stop)
    started = time.monotonic()
    rc = 0
    try:
        if stop.is_set():
            raise Stopped(stop.signum)
        if opts.agent_endpoint:
            leftover_spools(run_dir, scenario)
            cluster.start_agents([n for n in scenario.nodes if scenario.agent_start_step(n) == 0])
        cluster.start_ranks()
        cluster.wait()
    except LaunchError as e:
        cluster.say(f"error: {e}")
        rc = 1
    except Stopped as e:
        cluster.say(f"{'interrupted' if e.returncode == 130 else 'terminated'}; stopping every process")
        rc = e.returncode
    finally:
        cluster.stop_ranks()
        stop_agents(cluster.agents, cluster.say)
    lost = [a.node.id for a in cluster.agents if describe_failure(a)]
    if rc == 0 and lost:
        rc = 1
    result = RunResult(rc, run_dir, time.monotonic() - started, lib_dirs=lib_dirs)
    observed = [a.observed() for a in cluster.agents if a.ready_ns]
    logs = read_rank_logs(run_dir, scenario)
    result.truth = build_ground_truth(scenario, logs, observed, cluster.clocks.truth(logs))
    if opts.ground_truth is not None:
        opts.ground_truth.parent.mkdir(parents=True, exist_ok=True)
        opts.ground_truth.write_text(json.dumps(result.truth, indent=1) + "\n")
        cluster.say(f"ground truth written to {opts.ground_truth}")
    late = [f"rank {r} ({len(v['steps'])} steps)" for r, v in result.truth["stragglers_by_rank"].items()]
    cluster.say(
        f"finished in {result.wall_s:.1f} s; ranks entering >= {scenario.straggler_threshold_ms:g} ms "
        f"late: {', '.join(late) or 'none'}"
    )
    if lost:
        cluster.say(f"error: the agents of {', '.join(sorted(set(lost)))} did not deliver all their data "
                    "(see above); Echo does not hold the whole run")
    return result
