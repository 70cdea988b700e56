"""Where the interop tests find clients this project did not write, and why they skip when one is missing.

``scripts/setup-interop.sh`` (run by ``make install``) installs ``tests/interop/package.json`` into
``tests/interop/node_modules``; when it cannot, it leaves the reason in ``tests/interop/.install-failed``.
Each helper returns what to run, or calls ``pytest.skip`` with that reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

INTEROP = Path(__file__).resolve().parent / "interop"
MODULES = INTEROP / "node_modules"
INSPECTOR = MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"
INSPECTOR_MIN_NODE = 22
RUN_TIMEOUT_S = 120


def _install_problem() -> str | None:
    failed = INTEROP / ".install-failed"
    if failed.exists():
        return failed.read_text().strip()
    if not MODULES.is_dir():
        return "tests/interop/node_modules is missing: run 'make install' (scripts/setup-interop.sh)"
    return None


def node_major(node: str) -> int:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    return int(out.stdout.strip().lstrip("v").split(".")[0]) if out.returncode == 0 else 0


def system_node() -> str:
    """The ``node`` on PATH (scripts/setup-host.sh installs it), with the npm packages installed."""
    node = shutil.which("node")
    if node is None:
        pytest.skip(
            "node is not installed: run 'make install' as root (scripts/setup-host.sh installs nodejs)"
        )
    if problem := _install_problem():
        pytest.skip(f"the npm packages of tests/interop are not installed: {problem}")
    return node


def inspector_command() -> list[str]:
    """``node .../inspector --cli`` on a Node new enough for MCP Inspector (>= 22): the one from the
    ``node-linux-*`` npm package when it installed, else the system's."""
    if problem := _install_problem():
        pytest.skip(f"MCP Inspector is not installed: {problem}")
    if not INSPECTOR.exists():
        pytest.skip(f"MCP Inspector is not installed: {INSPECTOR} is missing (npm ci in tests/interop)")
    for node in (str(MODULES / ".bin" / "node"), shutil.which("node")):
        if node and Path(node).exists() and node_major(node) >= INSPECTOR_MIN_NODE:
            return [node, str(INSPECTOR), "--cli"]
    pytest.skip(
        f"MCP Inspector needs Node >= {INSPECTOR_MIN_NODE}: neither the node-linux-* npm package nor the "
        "system's node provides it"
    )


def run_client(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run one client to completion (within :data:`RUN_TIMEOUT_S`) with ``env`` added to ours."""
    return subprocess.run(
        command, cwd=INTEROP, env={**os.environ, **env}, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


PYTHON_EXPORT = [sys.executable, str(INTEROP / "otlp_export.py")]
JS_EXPORT = "otlp_export.mjs"
