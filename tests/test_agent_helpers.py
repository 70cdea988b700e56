"""Helpers (no tests) for the agent eBPF tests: the eBPF skip, the built simulator, reading records.

An in-process Echo is ``conftest.inproc_echo``; reading it back, ``echo_helpers.row_dicts``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rankecho.agent.check import ebpf_missing

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "sim"


def sim_built() -> Path:
    """sim/ with its fake libraries built and current (``make -C sim`` is a no-op when they are)."""
    subprocess.run(["make", "-s", "-C", str(SIM)], check=True)
    return SIM


requires_ebpf = pytest.mark.skipif(ebpf_missing() is not None, reason=str(ebpf_missing()))
"""The one eBPF prerequisite test (agent.check.ebpf_missing), shared with the agent bench and the demo."""


def attrs(row: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(row["attrs_json"] or "{}"))


def rank_pids(log: str) -> tuple[int, int]:
    """(rank, pid) from a simrank log's first line: ``rank R world W local L node N pid P tid T``."""
    words = log.split()
    return int(words[1]), int(words[words.index("pid") + 1])


def step_lines(log: str) -> list[list[str]]:
    """``step N start enter end sync_ns causes`` lines of a simrank log."""
    return [line.split() for line in log.splitlines() if line.startswith("step ")]
