"""The Python rank (sim/pyrank.py) is the C rank's training loop: run through the launcher with the same
faults, it logs the same lines, the same fault schedule and jitter, the same lateness where the faults
strike and the same failures, under the launcher's interpreter and pyenv's 3.10 and 3.12; scenarios pick
the program, the interpreter and the no-frame-pointer build, and refuse what no build provides; the
ground truth names the function and Python line each fault ran in."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from rankecho.sim.faultsites import FAULT_SITES, PYRANK, python_frames
from rankecho.sim.groundtruth import read_rank_logs
from rankecho.sim.launcher import LaunchOptions, rank_argv, run_scenario
from rankecho.sim.procs import LaunchError
from rankecho.sim.programs import pyenv_root, python_interpreter
from rankecho.sim.scenario import ScenarioError, parse_scenario

STEP = {"compute_ms": 8, "host_ms": 0.2, "dataloader_ms": 0.2, "allreduce_mb": 1}
MS = 150.0
FAULTS = [  # (rank, kind, step): one delay of each kind the host can show
    (1, "host_compute", 3),
    (2, "dataloader_stall", 5),
    (3, "alloc_stall", 7),
    (0, "slow_gpu", 9),
    (1, "cpu_contention", 11),
]


def scenario(faults: list[dict[str, Any]], steps: int = 14, **extra: Any) -> Any:
    raw = {"cluster_id": "t-py", "steps": steps, "step": STEP, "faults": faults, "seed": 3,
           "communicators": [{"name": "pairs", "group_size": 2}],
           "nodes": [{"id": "n0", "ranks": 2}, {"id": "n1", "ranks": 2}], **extra}  # fmt: skip
    return parse_scenario(raw, "pyrank")


def delays(**extra: Any) -> Any:
    faults = [{"rank": r, "kind": k, "ms": MS, "every": 100, "start_step": s, "jitter": 5}
              for r, k, s in FAULTS]  # fmt: skip
    return scenario(faults, **extra)


def interpreters() -> list[str | None]:
    """The launcher's interpreter and pyenv's 3.10 and 3.12 where this machine has them."""
    out: list[str | None] = [None]
    for version in ("3.10", "3.12"):
        try:
            python_interpreter(version)
        except LaunchError:
            continue
        out.append(version)
    return out


@pytest.fixture(scope="module")
def c_truth(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    result = run_scenario(delays(), LaunchOptions(run_dir=tmp_path_factory.mktemp("c"), progress=None,
                                                  timeout_s=120))  # fmt: skip
    assert result.returncode == 0 and result.truth is not None
    return result.truth


@pytest.mark.parametrize("version", interpreters())
def test_python_rank_logs_what_the_c_rank_logs(
    c_truth: dict[str, Any], version: str | None, tmp_path: Path
) -> None:
    s = delays(program="python", python=version)
    result = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=120))
    assert result.returncode == 0, [p.read_text() for p in tmp_path.glob("n*/rank*.stderr")]
    truth = result.truth
    assert truth is not None and (truth["program"], truth["python"]) == ("python", version)
    logs = read_rank_logs(tmp_path, s)
    assert all(log.finished and len(log.steps) == s.steps and log.pid and log.tid for log in logs.values())
    assert [log.node_id for _, log in sorted(logs.items())] == ["n0", "n0", "n1", "n1"]
    # The same communicators (ids differ per run), the same fault schedule with the same jitter.
    def shape(t: dict[str, Any]) -> list[tuple[str, int, list[int]]]:
        return sorted((c["name"], c["size"], c["members"]) for c in t["communicators"])

    assert shape(truth) == shape(c_truth) and len(shape(truth)) == 3  # world and two pairs
    for step in range(s.steps):
        pairs = zip(truth["per_step"][step]["ranks"], c_truth["per_step"][step]["ranks"], strict=True)
        for mine, theirs in pairs:
            assert [(i["kind"], i["ms"]) for i in mine["injected"]] == [
                (i["kind"], i["ms"]) for i in theirs["injected"]
            ]
    frames = python_frames()
    for rank, kind, step in FAULTS:
        row = next(r for r in truth["per_step"][step]["ranks"] if r["rank"] == rank)
        late = max(row["entered_late_by_ms"], row["gpu_late_by_ms"])
        assert 0.8 * MS <= late <= MS + 250, (kind, row)
        site = [(i["function"], i["frame"]) for i in row["injected"]]
        assert site == [(FAULT_SITES[kind][0], frames[kind])]
        stragglers = {(x["rank"], x["cause"], x["frame"]) for x in truth["per_step"][step]["stragglers"]}
        assert (rank, kind, frames[kind]) in stragglers
    alloc = next(r for r in truth["per_step"][7]["ranks"] if r["rank"] == 3)
    assert alloc["alloc_ms"] >= 0.8 * MS  # the stall is in cudaMalloc/cudaFree, as in the C rank


@pytest.mark.parametrize(
    ("fault", "rc", "failures"),
    [
        ({"kind": "crash", "rank": 2, "status": 7, "start_step": 2}, 1,
         [{"kind": "crash", "rank": 2, "step": 2, "status": 7}]),
        ({"kind": "desync", "rank": 1, "start_step": 3}, 1, [{"kind": "desync", "rank": 1, "step": 3}]),
        ({"kind": "hang", "rank": 3, "ms": 300, "start_step": 2}, 0,
         [{"kind": "hang", "rank": 3, "step": 2, "ms": 300.0}]),
    ],
)  # fmt: skip
def test_python_rank_failures_are_the_c_ranks(
    fault: dict[str, Any], rc: int, failures: list[dict[str, Any]], tmp_path: Path
) -> None:
    s = scenario([fault], steps=5, program="python")
    result = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=60))
    assert result.returncode == rc and result.truth is not None
    assert result.truth["failures"] == failures
    assert result.truth["faults"][0]["frame"] == python_frames()[fault["kind"]]
    if fault["kind"] == "desync":
        hub_errors = "".join(p.read_text() for p in tmp_path.glob("n*/rank*.stderr"))
        assert "(2097152 bytes)" in hub_errors and "(1048576 bytes)" in hub_errors


def test_python_frames_point_at_the_call_in_the_named_function() -> None:
    source = PYRANK.read_text()
    funcs = {n.name: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
    lines = source.splitlines()
    for kind, frame in python_frames().items():
        file, func, line = frame.split(":")
        assert (file, func) == ("pyrank.py", FAULT_SITES[kind][0])
        node = funcs[func]
        assert node.lineno < int(line) <= (node.end_lineno or 0)
        assert FAULT_SITES[kind][1] + "(" in lines[int(line) - 1], (kind, lines[int(line) - 1])


PICKS: dict[str, dict[str, Any]] = {
    "c": {}, "nofp": {"frame_pointers": False}, "dlopen": {"load": "dlopen"}, "py": {"program": "python"},
    "py310": {"program": "python", "python": "3.10"},
}  # fmt: skip


def test_scenarios_pick_the_program_and_its_build(tmp_path: Path) -> None:
    lib, log = tmp_path / "lib", tmp_path / "r.log"
    argv = {name: rank_argv(scenario([], **extra), 0, scenario([]).nodes[0], log, lib)[:2]
            for name, extra in PICKS.items() if name != "py310" or "3.10" in interpreters()}  # fmt: skip
    assert argv["c"][0].endswith("/build/simrank") and argv["nofp"][0].endswith("/build/simrank-nofp")
    assert argv["dlopen"][0].endswith("/build/simrank-dlopen")
    assert argv["py"][1].endswith("sim/pyrank.py") and Path(argv["py"][0]).exists()
    if "py310" in argv:
        assert argv["py310"][0].startswith(str(pyenv_root())) and argv["py310"][0].endswith("python3.10")


def test_the_nofp_rank_runs_like_the_c_rank(tmp_path: Path) -> None:
    s = scenario([{"kind": "host_compute", "rank": 1, "ms": MS, "every": 100, "start_step": 2}], steps=4,
                  frame_pointers=False)  # fmt: skip
    result = run_scenario(s, LaunchOptions(run_dir=tmp_path, progress=None, timeout_s=60))
    assert result.returncode == 0 and result.truth is not None and result.truth["frame_pointers"] is False
    assert [(x["rank"], x["function"]) for x in result.truth["per_step"][2]["stragglers"]] == [
        (1, "spin_host_compute")
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"python": "3.10"}, "python: only the Python rank runs under an interpreter; add program: python"),
        ({"program": "python", "python": 3.1}, 'python: quote the version (python: "3.10")'),
        ({"program": "python", "python": "2.7"}, "python: '2.7' is not one of ['3.10', '3.11', '3.12']"),
        ({"program": "rust"}, "program: 'rust' is not one of ['c', 'python']"),
        ({"program": "python", "frame_pointers": False}, "drop it for program: python"),
        ({"load": "dlopen", "frame_pointers": False}, "has a linked build only"),
        ({"frame_pointers": "no"}, "frame_pointers: expected true or false"),
    ],
)
def test_program_settings_no_build_provides_are_refused(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as e:
        scenario([], **extra)
    assert message in str(e.value)


def test_a_missing_pyenv_version_is_a_launch_error_with_the_fix(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    with pytest.raises(LaunchError, match=r"no CPython 3\.11 under .*pyenv install 3\.11"):
        python_interpreter("3.11")
