"""Which rank program a scenario runs: the C rank (build/simrank, its dlopen build, or its build without
frame pointers) or the Python rank (sim/pyrank.py) under the launcher's interpreter or one of pyenv's, and
the command line each rank gets (``rank_argv``: the same options for both programs).

    rank_command(scenario)  # ["/root/.pyenv/versions/3.10.13/bin/python3.10", ".../sim/pyrank.py"]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rankecho.sim.procs import LaunchError
from rankecho.sim.scenario import PROGRAMS, PYTHONS, Node, Scenario, ScenarioError
from rankecho.sim.scenario import _choice as choice
from rankecho.sim.scenario_pipeline import pipeline_argv

SIM_ROOT = Path(__file__).resolve().parent


def rank_command(scenario: Scenario, root: Path = SIM_ROOT) -> list[str]:
    """The rank program's command line before its options (they are the same for every program)."""
    if scenario.program == "python":
        return [python_interpreter(scenario.python), str(root / "pyrank.py")]
    if scenario.load == "dlopen":
        return [str(root / "build" / "simrank-dlopen")]
    return [str(root / "build" / ("simrank" if scenario.frame_pointers else "simrank-nofp"))]


def program_fields(d: dict[str, Any]) -> None:
    """The rank program and its build: refuse the combinations no build provides."""
    d["program"] = choice("program", d.get("program", "c"), PROGRAMS)
    if d.get("python") is not None:
        if not isinstance(d["python"], str):
            raise ScenarioError(f'python: quote the version (python: "3.10"); YAML read {d["python"]!r}')
        if d["program"] != "python":
            raise ScenarioError("python: only the Python rank runs under an interpreter; add program: python")
        d["python"] = choice("python", str(d["python"]), PYTHONS)
    if d.get("frame_pointers", True) is False:
        if d["program"] != "c":
            raise ScenarioError("frame_pointers: false selects the C rank's no-frame-pointer build; "
                                "drop it for program: python")
        if d.get("load", "linked") != "linked":
            raise ScenarioError("frame_pointers: false has a linked build only; drop load: dlopen")


def pyenv_root() -> Path:
    if os.environ.get("PYENV_ROOT"):
        return Path(os.environ["PYENV_ROOT"])
    try:
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return Path.home() / ".pyenv"
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else Path.home() / ".pyenv"


def python_interpreter(version: str | None) -> str:
    """pyenv's newest CPython ``version`` (e.g. "3.10" -> versions/3.10.13/bin/python3.10); None: this
    process's interpreter (the virtualenv's)."""
    if version is None:
        return sys.executable
    root = pyenv_root()
    found = [p for p in (root / "versions").glob(f"{version}.*/bin/python{version}") if os.access(p, os.X_OK)]
    found = [p for p in found if p.parent.parent.name.removeprefix(f"{version}.").isdigit()]
    if not found:
        raise LaunchError(f"no CPython {version} under {root}/versions; install it (pyenv install {version}) "
                          "or drop the scenario's python: to use the launcher's interpreter")  # fmt: skip
    return str(max(found, key=lambda p: int(p.parent.parent.name.split(".")[2])))


def rank_argv(
    scenario: Scenario, rank: int, node: Node, log: Path, lib_dir: Path, root: Path = SIM_ROOT
) -> list[str]:
    st = scenario.step
    argv = [
        *rank_command(scenario, root),
        "--steps",
        str(scenario.steps),
        "--compute-us",
        str(st.compute_ms * 1000),
        "--host-us",
        str(st.host_ms * 1000),
        "--loader-us",
        str(st.dataloader_ms * 1000),
        "--kernels",
        str(st.kernels_per_step),
        "--allreduce-bytes",
        str(int(st.allreduce_mb * 2**20)),
        "--buckets",
        str(st.buckets),
        "--malloc-every",
        str(st.malloc_every),
        "--seed",
        str(scenario.seed),
        "--log",
        str(log),
    ]
    for c in scenario.communicators:
        argv += [
            "--split",
            f"{c.name}:{c.group_size}:{int(c.layout == 'strided')}:{int(c.allreduce_mb * 2**20)}",
        ]
    for f in scenario.faults:
        if f.targets(rank, node.id):
            argv += ["--fault", f.spec(tuple(c.name for c in scenario.communicators))]
    argv += scenario.jitter.argv()
    argv += pipeline_argv(scenario)
    if any(f.comm is not None or f.bucket is not None for f in scenario.faults):
        argv += ["--log-collectives"]  # every rank: the ground truth's lateness at the chosen collective
    if scenario.load == "dlopen":
        argv += ["--lib-dir", str(lib_dir), "--dlopen-delay-ms", str(scenario.dlopen_delay_ms)]
    return argv
