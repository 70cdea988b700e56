"""Which rank program a scenario runs: the C rank (build/simrank, its dlopen build, or its build without
frame pointers) or the Python rank (sim/pyrank.py) under the launcher's interpreter or one of pyenv's.

    rank_command(scenario)  # ["/root/.pyenv/versions/3.10.13/bin/python3.10", ".../sim/pyrank.py"]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rankecho.sim.procs import LaunchError
from rankecho.sim.scenario import Scenario

SIM_ROOT = Path(__file__).resolve().parent


def rank_command(scenario: Scenario, root: Path = SIM_ROOT) -> list[str]:
    """The rank program's command line before its options (they are the same for every program)."""
    if scenario.program == "python":
        return [python_interpreter(scenario.python), str(root / "pyrank.py")]
    if scenario.load == "dlopen":
        return [str(root / "build" / "simrank-dlopen")]
    return [str(root / "build" / ("simrank" if scenario.frame_pointers else "simrank-nofp"))]


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
