"""The agent through a job's life: libraries loaded late, ranks restarted (pid reuse), the agent
killed and restarted, Echo down for 30 s. Real eBPF on the simulator's libraries."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, row_dicts
from test_agent_helpers import attrs, rank_pids, requires_ebpf, sim_built, step_lines

from rankecho.launch.echo import EchoProcess
from rankecho.shared import contract as c
from rankecho.sim.job import SimJob, stop_all

pytestmark = [requires_ebpf, pytest.mark.ebpf]


def collectives(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in events if r["metric_name"] == c.M_COLLECTIVE]


def test_libraries_loaded_by_dlopen_after_the_agent_started(tmp_path: Path) -> None:
    with inproc_echo(tmp_path / "echo.db") as echo:
        job = SimJob(tmp_path, ["node-a"], 2, sim_built())
        agents = job.start_agents(echo.grpc_address, TEST_TOKEN)
        program = job.sim_root / "build" / "simrank-dlopen"
        ranks = [job.start_rank(r, ["--steps", "4", "--dlopen-delay-ms", "700"], program) for r in range(2)]
        time.sleep(0.3)
        for p in ranks:  # not mapped yet: the libraries arrive with dlopen, after the agent attached
            maps = Path(f"/proc/{p.pid}/maps").read_text()
            assert "libnccl" not in maps
        job.wait(ranks)
        assert stop_all(agents) == [0]
        got = collectives(row_dicts(echo, "SELECT * FROM events"))
    assert Counter(r["rank"] for r in got) == {0: 4, 1: 4}
    assert all(attrs(r)[c.SEQ_ALIGNED] for r in got)
    assert len({r["causal_chain_id"] for r in got}) == 4


def test_pid_filter_traces_only_the_named_process(tmp_path: Path) -> None:
    with inproc_echo(tmp_path / "echo.db") as echo:
        job = SimJob(tmp_path, ["node-a"], 2, sim_built())
        program = job.sim_root / "build" / "simrank-dlopen"
        # The ranks load the libraries 10 s after they start: the agent (started after them, to be given a
        # pid) must be attached by then; it compiles a BPF program of ~2 s and on a loaded 2-core machine
        # took up to 15 s to be ready, and 4 s was not always enough.
        ranks = [job.start_rank(r, ["--steps", "4", "--dlopen-delay-ms", "10000"], program) for r in range(2)]
        # every raw interval: the filter must hold for off-CPU records too (by default only evidence goes)
        agent = job.start_agent("node-a", echo.grpc_address, TEST_TOKEN, "--pid", str(ranks[1].pid),
                                "--raw-interval-ms", "0")
        job.wait(ranks)
        assert stop_all([agent]) == [0]
        events = row_dicts(echo, "SELECT * FROM events WHERE rank IS NOT NULL")
    assert {attrs(r)[c.PROCESS_PID] for r in events} == {ranks[1].pid}
    assert Counter(r["rank"] for r in collectives(events)) == {1: 4}
    assert any(r["metric_name"] == c.M_OFFCPU for r in events)


def test_job_started_after_the_agent_is_found_by_rescan(tmp_path: Path) -> None:
    """No --nccl-lib/--cuda-lib: the agent discovers the job's libraries in /proc/PID/maps."""
    with inproc_echo(tmp_path / "echo.db") as echo:
        job = SimJob(tmp_path, ["node-a"], 1, sim_built())
        libs = job.lib_dir("node-a")
        env_agent = job.root / "agent.log"
        cmd = [os.sys.executable, "-m", "rankecho", "agent", "--endpoint", echo.grpc_address,  # type: ignore[attr-defined]
               "--cluster-id", "sim", "--node-id", "node-a", "--scan-interval", "0.2",
               "--ready-file", str(job.root / "ready"), "--spool-dir", str(job.root / "spool")]
        with open(env_agent, "wb") as log:
            agent = subprocess.Popen(cmd, env={**os.environ, "RANKECHO_TOKEN": TEST_TOKEN}, stdout=log,
                                     stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while not (job.root / "ready").exists():
                assert agent.poll() is None and time.monotonic() < deadline, env_agent.read_text()
                time.sleep(0.05)
            # 100 steps of 30 ms: discovery (every 0.2 s) and attaching the probes, whose programs the
            # kernel verifies then, take up to ~0.5 s of the run; at least 30 steps must follow.
            rank = job.start_rank(0, ["--steps", "100", "--compute-us", "30000"])
            job.wait([rank])
        finally:
            agent.terminate()
            # The kernel releases each uprobe at detach (an RCU grace period each: 4.5 s for ~45 probes,
            # up to ~40 s on a loaded machine, docs/agent.md), and discovery attaches to every job here.
            assert agent.wait(90) == 0
        log_text = env_agent.read_text()
        # Discovery also finds any other job on this machine: keep only our rank's events.
        everything = collectives(row_dicts(echo, "SELECT * FROM events"))
        got = [r for r in everything if attrs(r)[c.PROCESS_PID] == rank.pid]
    assert "attached" in log_text and str(libs / "libnccl.so.2") in log_text, log_text
    assert got, log_text
    assert {r["rank"] for r in got} == {0} and {r["nranks"] for r in got} == {1}
    seqs = sorted(attrs(r)[c.SEQ] for r in got)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # nothing missing once attached
    assert len(got) >= 30


def _start_with_pid(job: SimJob, pid: int | None, args: list[str]) -> subprocess.Popen[bytes]:
    """Start rank 0, trying to make the kernel hand out ``pid`` again (ns_last_pid, as root)."""
    for _ in range(20):
        if pid is not None:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        p = job.start_rank(0, args)
        if pid is None or p.pid == pid:
            return p
        p.wait()
    pytest.skip("could not get the kernel to reuse the pid (busy machine)")


def test_restarted_rank_new_pid_and_reused_pid(tmp_path: Path) -> None:
    args = ["--steps", "3"]
    with inproc_echo(tmp_path / "echo.db") as echo:
        job = SimJob(tmp_path, ["node-a"], 1, sim_built())
        agents = job.start_agents(echo.grpc_address, TEST_TOKEN)
        first = _start_with_pid(job, None, args)
        job.wait([first])
        second = _start_with_pid(job, None, args)  # a restart: new pid
        job.wait([second])
        third = _start_with_pid(job, second.pid, args)  # a restart that reuses the previous pid
        job.wait([third])
        assert stop_all(agents) == [0]
        got = collectives(row_dicts(echo, "SELECT * FROM events"))
    runs = Counter((attrs(r)[c.PROCESS_PID], attrs(r)[c.PROCESS_START_NS]) for r in got)
    assert len(runs) == 3 and set(runs.values()) == {3}
    assert {pid for pid, _ in runs} == {first.pid, second.pid}
    for run in runs:  # each run's sequence starts at 0 on its own communicator
        mine = [r for r in got if (attrs(r)[c.PROCESS_PID], attrs(r)[c.PROCESS_START_NS]) == run]
        assert sorted(attrs(r)[c.SEQ] for r in mine) == [0, 1, 2]
        assert len({attrs(r)[c.COMM_ID] for r in mine}) == 1
    assert len({attrs(r)[c.COMM_ID] for r in got}) == 3


def test_agent_killed_and_restarted_mid_run(tmp_path: Path) -> None:
    with inproc_echo(tmp_path / "echo.db") as echo:
        job = SimJob(tmp_path, ["node-a"], 2, sim_built())
        [agent] = job.start_agents(echo.grpc_address, TEST_TOKEN)
        ranks = job.start_ranks(["--steps", "120", "--compute-us", "40000"])
        time.sleep(1.5)
        # Hold the job while the new agent compiles (seconds on a loaded machine, when the ranks could
        # otherwise finish first and the new agent see nothing): it must attach mid-run.
        for p in ranks:
            p.send_signal(signal.SIGSTOP)
        agent.proc.kill()
        again = job.start_agent("node-a", echo.grpc_address, TEST_TOKEN)
        for p in ranks:
            p.send_signal(signal.SIGCONT)
        job.wait(ranks)
        agent.proc.wait()
        assert stop_all([again]) == [0]
        got = collectives(row_dicts(echo, "SELECT * FROM events"))
        pids = dict(rank_pids(job.rank_log(r)) for r in range(2))
    aligned = [r for r in got if attrs(r)[c.SEQ_ALIGNED]]
    unaligned = [r for r in got if not attrs(r)[c.SEQ_ALIGNED]]
    assert aligned and unaligned
    # After the restart the rank comes from the environment; the comm id is the same on both ranks.
    assert {r["rank"] for r in unaligned} == {0, 1}, [attrs(r) for r in unaligned if r["rank"] is None][:2]
    for r in unaligned:
        assert attrs(r)[c.PROCESS_PID] == pids[r["rank"]]
    by_chain = Counter(r["causal_chain_id"] for r in unaligned)
    assert len({attrs(r)[c.COMM_ID] for r in unaligned}) == 1
    assert max(by_chain.values()) <= 2
    # The last step of each rank reached Echo through the new agent.
    last = max(int(w[1]) for w in step_lines(job.rank_log(0)))
    assert last == 119
    assert Counter(r["rank"] for r in unaligned)[0] >= 10


@pytest.mark.slow
def test_echo_down_for_30_s_loses_nothing(tmp_path: Path) -> None:
    steps = 6
    echo = EchoProcess(tmp_path / "echo.db", token=TEST_TOKEN).start()
    port = echo.grpc_port
    job = SimJob(tmp_path, ["node-a"], 2, sim_built())
    try:
        [agent] = job.start_agents(echo.otlp_grpc, TEST_TOKEN)
        echo.stop()
        down_at = time.monotonic()
        job.wait(job.start_ranks(["--steps", str(steps)]))
        spool = job.root / "node-a" / "spool"
        time.sleep(max(0.0, 30 - (time.monotonic() - down_at)))
        assert list(spool.rglob("*.otlp")), "nothing was spooled while Echo was down"
        echo = EchoProcess(tmp_path / "echo.db", token=TEST_TOKEN, grpc_port=port).start()
        deadline = time.monotonic() + 30
        while list(spool.rglob("*.otlp")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not list(spool.rglob("*.otlp")), agent.log.read_text()
        assert stop_all([agent]) == [0]
    finally:
        echo.stop()
    con = duckdb.connect(str(tmp_path / "echo.db"), read_only=True)
    try:
        counts = dict(con.execute("SELECT rank, count(*) FROM events WHERE metric_name = ? GROUP BY rank",
                                  [c.M_COLLECTIVE]).fetchall())
        dupes = con.execute("SELECT count(*) - count(DISTINCT event_id) FROM events").fetchone()
    finally:
        con.close()
    assert counts == {0: steps, 1: steps}
    assert dupes == (0,)


def test_detach_all_closes_every_uprobe_and_they_stop_firing(tmp_path: Path) -> None:
    import ctypes
    import shutil

    from bcc import BPF

    from rankecho.agent.probes import detach_all

    lib = tmp_path / "libcudart.so.12"
    shutil.copy2(sim_built() / "build" / "libcudart.so.12", lib)  # own inode: no other test's probes
    bpf = BPF(text=b"BPF_ARRAY(hits, u64, 1); int hit(void *ctx) { int k = 0; hits.atomic_increment(k); "
                   b"return 0; }")
    names = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaGetLastError")
    for name in names:
        bpf.attach_uprobe(name=bytes(lib), sym=name.encode(), fn_name=b"hit")
    bpf.attach_uretprobe(name=bytes(lib), sym=names[0].encode(), fn_name=b"hit")
    fds = list(bpf.uprobe_fds.values())
    cudart = ctypes.CDLL(str(lib))

    def calls_counted() -> int:
        cudart.cudaStreamSynchronize(None)
        cudart.cudaGetLastError()
        return int(bpf[b"hits"][ctypes.c_int(0)].value)

    assert calls_counted() == 3  # entry + return + entry
    assert detach_all(bpf) == 4 and bpf.uprobe_fds == {}
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    assert calls_counted() == 3
    bpf.cleanup()
