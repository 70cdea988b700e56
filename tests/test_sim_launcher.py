"""`rankecho sim` as a program: agents around the ranks, failures, signals, scenario errors."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rankecho.sim.groundtruth import read_rank_logs
from rankecho.sim.launcher import LaunchOptions, run_scenario
from rankecho.sim.scenario import ScenarioError, load_scenario, parse_scenario

REPO = Path(__file__).resolve().parents[1]
FAKE_AGENT = """#!{python}
import json, os, signal, sys, time
from pathlib import Path
argv = sys.argv[1:]
ready = Path(argv[argv.index("--ready-file") + 1])
record = ready.with_suffix(".json")
info = {{"argv": argv, "token": os.environ.get("RANKECHO_TOKEN"), "started_ns": time.time_ns()}}
def term(*_):
    info["sigterm_ns"] = time.time_ns()
    record.write_text(json.dumps(info))
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
# As the real agent does (agent.stopflag.install): the launcher starts agents with the stop signals
# blocked, so a stop sent before the handler exists waits for it.
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM, signal.SIGINT}})
if os.environ.get("FAKE_AGENT_FAIL"):
    print("cannot attach probes: no such library", flush=True)
    sys.exit(3)
time.sleep(0.2)  # attaching probes takes a moment
info["ready_ns"] = time.time_ns()
record.write_text(json.dumps(info))
ready.touch()
if os.environ.get("FAKE_AGENT_CRASH"):
    sys.exit(5)
while True:
    time.sleep(1)
"""


def small(steps: int = 12, **extra: Any) -> dict[str, Any]:
    return {
        "cluster_id": "t-launch",
        "steps": steps,
        "step": {"compute_ms": 8, "host_ms": 0.2, "dataloader_ms": 0.2, "allreduce_mb": 2},
        "nodes": [{"id": "n0", "ranks": 1}, {"id": "n1", "ranks": 1, "clock_offset_ms": 7.5}],
        **extra,
    }


@pytest.fixture
def fake_agent(tmp_path: Path) -> str:
    path = tmp_path / "fake-python"
    path.write_text(FAKE_AGENT.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def agent_records(run_dir: Path) -> dict[str, dict[str, Any]]:
    return {n: json.loads((run_dir / n / "agent.json").read_text()) for n in ("n0", "n1")}


def test_agents_start_ready_before_ranks_and_stop_after(tmp_path: Path, fake_agent: str) -> None:
    run_dir = tmp_path / "run"
    scenario = parse_scenario(small(), "agents")
    opts = LaunchOptions(run_dir=run_dir, agent_endpoint="127.0.0.1:4317", token="s3cret", python=fake_agent,
                         progress=None, timeout_s=60)  # fmt: skip
    assert run_scenario(scenario, opts).returncode == 0
    logs = read_rank_logs(run_dir, scenario)
    records = agent_records(run_dir)
    for rank, node, offset in ((0, "n0", 0), (1, "n1", 7_500_000)):
        lib = run_dir / node / "lib"
        rec = records[node]
        assert rec["argv"] == [
            "-m", "rankecho", "agent", "--endpoint", "127.0.0.1:4317", "--cluster-id", "t-launch",
            "--node-id", node, "--nccl-lib", f"{lib}/libnccl.so.2", "--cuda-lib", f"{lib}/libcudart.so.12",
            "--clock-offset-ns", str(offset), "--ready-file", str(run_dir / node / "agent.ready"),
            "--spool-dir", str(run_dir / node / "spool"),  # this run's own: a later run never replays it
        ]  # fmt: skip
        assert rec["token"] == "s3cret"
        assert rec["ready_ns"] < min(log.start_ns for log in logs.values())
        assert rec["sigterm_ns"] > max(log.done_ns for log in logs.values())
        assert logs[rank].node_id == node
    # Both agents were launched before either was ready: they start together, not one after another.
    assert max(r["started_ns"] for r in records.values()) < min(r["ready_ns"] for r in records.values())


def test_agents_can_start_after_step_k(tmp_path: Path, fake_agent: str) -> None:
    run_dir = tmp_path / "run"
    scenario = parse_scenario(small(steps=120, agent_start_after_step=5), "late")
    opts = LaunchOptions(run_dir=run_dir, agent_endpoint="127.0.0.1:4317", python=fake_agent, progress=None)
    assert run_scenario(scenario, opts).returncode == 0
    logs = read_rank_logs(run_dir, scenario)
    for rec in agent_records(run_dir).values():
        assert rec["token"] is None
        assert rec["started_ns"] >= max(log.steps[4].end_ns for log in logs.values())
        assert rec["ready_ns"] < max(log.steps[-1].end_ns for log in logs.values())  # ranks still running


def test_one_nodes_agent_can_start_late_and_another_be_killed_and_restarted(
    tmp_path: Path, fake_agent: str
) -> None:
    run_dir = tmp_path / "run"
    nodes = [{"id": "n0", "ranks": 1, "agent_restart_after_step": 30}, {"id": "n1", "ranks": 1,
             "agent_start_after_step": 10}]  # fmt: skip
    scenario = parse_scenario(small(steps=150, nodes=nodes), "per-node")
    said = io.StringIO()  # the launcher's own account, shown if the run fails (a rare failure under load)
    opts = LaunchOptions(run_dir=run_dir, agent_endpoint="127.0.0.1:4317", python=fake_agent, progress=said)
    result = run_scenario(scenario, opts)
    assert result.returncode == 0 and result.truth is not None, said.getvalue()
    logs = read_rank_logs(run_dir, scenario)
    spans = {(o["node_id"], o["from_ns"]): o["to_ns"] for o in result.truth["observed"]}
    n0 = sorted((start, end) for (node, start), end in spans.items() if node == "n0")
    n1 = [(start, end) for (node, start), end in spans.items() if node == "n1"]
    assert len(n0) == 2 and len(n1) == 1
    first, second = n0
    assert first[0] < logs[0].steps[0].start_ns and first[1] >= logs[0].steps[29].end_ns  # killed at step 30
    assert second[0] > first[1]  # the new agent is ready after the old one was killed
    assert (run_dir / "n0" / "agent.2.log").exists()  # the restarted agent has a log of its own
    assert n1[0][0] >= logs[1].steps[9].end_ns  # node n1's agent only after step 10


def test_a_node_fault_strikes_every_rank_of_the_node() -> None:
    scenario = parse_scenario(
        {**small(), "nodes": [{"id": "n0", "ranks": 2}, {"id": "n1", "ranks": 2}],
         "faults": [{"node": "n1", "kind": "host_compute", "ms": 5, "every": 3}]}, "node-fault"
    )  # fmt: skip
    assert scenario.fault_ranks(scenario.faults[0]) == [2, 3]
    with pytest.raises(ScenarioError, match="exactly one of rank"):
        parse_scenario({**small(), "faults": [{"node": "n1", "rank": 0, "kind": "host_compute", "ms": 5}]})
    with pytest.raises(ScenarioError, match="'n9' is not one of the nodes"):
        parse_scenario({**small(), "faults": [{"node": "n9", "kind": "host_compute", "ms": 5}]})


def test_an_agent_that_dies_is_reported_with_its_log(
    tmp_path: Path, fake_agent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_AGENT_FAIL", "1")
    out = io.StringIO()
    opts = LaunchOptions(run_dir=tmp_path, agent_endpoint="127.0.0.1:1", python=fake_agent, progress=out)
    assert run_scenario(parse_scenario(small(), "dead-agent"), opts).returncode == 1
    text = out.getvalue()
    assert "agent for node n0 exited with code 3" in text
    assert str(tmp_path / "n0" / "agent.log") in text and "cannot attach probes" in text


def test_an_agent_crashing_mid_run_is_reported_the_job_finishes_and_the_run_fails(
    tmp_path: Path, fake_agent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ranks are fine and run to the end, but what the crashed agent did not send is not in Echo:
    # the run must not look like a success (issue 19).
    monkeypatch.setenv("FAKE_AGENT_CRASH", "1")
    out = io.StringIO()
    opts = LaunchOptions(run_dir=tmp_path, agent_endpoint="127.0.0.1:1", python=fake_agent, progress=out)
    result = run_scenario(parse_scenario(small(steps=30), "crash"), opts)
    text = out.getvalue()
    assert "warning: the agent for n0 exited with code 5 during the run" in text
    logs = read_rank_logs(tmp_path, parse_scenario(small(steps=30), "crash"))
    assert all(len(log.steps) == 30 for log in logs.values())
    assert result.returncode == 1, text
    assert "error: the agents of n0, n1 did not deliver all their data" in text


def launch_cli(tmp_path: Path, steps: int = 3000, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    """``rankecho sim`` on a long scenario; ``sigint_ignored``: started as a non-interactive shell starts a
    background job (SIGINT ignored), as a CI runner may start the whole suite."""
    scenario = tmp_path / "long.yaml"
    scenario.write_text(json.dumps(small(steps=steps)))  # JSON is YAML
    argv = [sys.executable, "-m", "rankecho", "sim", str(scenario), "--run-dir", str(tmp_path / "run")]

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ignore_sigint if sigint_ignored else None)  # fmt: skip


def wait_for_steps(tmp_path: Path, n: int) -> dict[int, int]:
    """Return {rank: pid} once every rank logged at least n steps."""
    scenario = parse_scenario(small(), "long")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        logs = read_rank_logs(tmp_path / "run", scenario)
        if all(len(log.steps) >= n for log in logs.values()):
            return {r: log.pid for r, log in logs.items()}
        time.sleep(0.02)
    pytest.fail("ranks did not make progress")


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_a_failing_rank_stops_the_run_with_its_stderr(tmp_path: Path) -> None:
    proc = launch_cli(tmp_path)
    pids = wait_for_steps(tmp_path, 3)
    os.kill(pids[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "rank 1 on n1 exited with code -9" in err
    assert all(gone(pid) for pid in pids.values())


@pytest.mark.parametrize(
    ("sig", "code", "sigint_ignored"),
    [(signal.SIGTERM, 143, False), (signal.SIGINT, 130, False), (signal.SIGINT, 130, True)],
)
def test_signals_stop_every_process(tmp_path: Path, sig: int, code: int, sigint_ignored: bool) -> None:
    proc = launch_cli(tmp_path, sigint_ignored=sigint_ignored)
    pids = wait_for_steps(tmp_path, 2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert "stopping every process" in err
    assert all(gone(pid) for pid in pids.values())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"faults": [{"rank": 0, "kind": "slowgpu", "ms": 5}]}, "faults[0].kind: 'slowgpu' is not one of"),
        ({"faults": [{"rank": 2, "kind": "slow_gpu", "ms": 5}]}, "faults[0].rank: 2 is outside the world"),
        ({"faults": [{"rank": 0, "kind": "slow_gpu", "ms": 5, "every": 0}]}, "faults[0].every: must be >= 1"),
        ({"faults": [{"rank": 0, "kind": "slow_gpu"}]}, "faults[0]: missing required key(s) ['ms']"),
        ({"communicators": [{"name": "tp", "group_size": 3}]}, "does not divide the world size 2"),
        ({"nodes": [{"id": "a", "ranks": 1}, {"id": "a", "ranks": 1}]}, "'a' is used twice"),
        ({"stepz": 3}, "unknown key(s) ['stepz']"),
        ({"step": {"compute_ms": 0}}, "step.compute_ms: must be > 0"),
    ],
)
def test_scenario_errors_name_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as e:
        parse_scenario({**small(), **change})
    assert message in str(e.value)


def test_cli_rejects_a_bad_file_with_exit_code_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_id: x\nnodes: [{id: a}]\n")
    proc = subprocess.run([sys.executable, "-m", "rankecho", "sim", str(bad)], cwd=REPO, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 2
    assert f"{bad}: nodes[0]: missing required key(s) ['ranks']" in proc.stderr


def test_shipped_scenarios_are_valid() -> None:
    names = {p.stem: load_scenario(p) for p in (REPO / "sim" / "scenarios").glob("*.yaml")}
    evaluation = [load_scenario(p) for p in (REPO / "sim" / "scenarios" / "diagnosis").glob("*.yaml")]
    assert len(evaluation) >= 15 and len({s.cluster_id for s in evaluation}) == len(evaluation)
    assert any(f.node for s in evaluation for f in s.faults)  # a whole node late together
    assert any(not s.faults for s in evaluation)  # healthy ones: naming anybody is a false alarm
    seed = names["seed-rank5"]
    assert (seed.world_size, len(seed.nodes), seed.step.compute_ms + 4 > 88) == (8, 2, True)
    assert [(f.rank, f.ms, f.every) for f in seed.faults] == [(5, 290.0, 14)]
    kinds = {f.kind for s in names.values() for f in s.faults if len(s.faults) == 1}
    assert kinds >= {"host_compute", "dataloader_stall", "cpu_contention", "slow_gpu", "alloc_stall"}
    assert any(len({f.rank for f in s.faults}) == 2 for s in names.values())
    assert any(not s.faults for s in names.values())


def test_dlopen_ranks_load_the_libraries_after_start(tmp_path: Path) -> None:
    scenario = parse_scenario(small(load="dlopen", dlopen_delay_ms=300), "dlopen")
    result = run_scenario(scenario, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=60))
    assert result.returncode == 0
    for log in read_rank_logs(tmp_path, scenario).values():
        assert log.steps[0].start_ns - log.start_ns >= 300e6
    needed = subprocess.run(["readelf", "-d", str(REPO / "sim/build/simrank-dlopen")], capture_output=True,
                            text=True, check=True).stdout  # fmt: skip
    assert "libnccl" not in needed and "libcudart" not in needed
