"""Helpers (no tests) for the agent eBPF tests: skip reasons, a started Echo, reading Echo back."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "sim"


def ebpf_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to load BPF programs"
    if importlib.util.find_spec("bcc") is None:
        return "needs the bcc python bindings (make install)"
    if not Path(f"/lib/modules/{os.uname().release}/build").exists():
        return "needs kernel headers (scripts/setup-host.sh)"
    return None


def sim_built() -> Path:
    """sim/ with its fake libraries built and current (``make -C sim`` is a no-op when they are)."""
    subprocess.run(["make", "-s", "-C", str(SIM)], check=True)
    return SIM


requires_ebpf = pytest.mark.skipif(ebpf_skip_reason() is not None, reason=str(ebpf_skip_reason()))


@contextmanager
def inproc_echo(db: Path) -> Iterator[Any]:
    from conftest import local_settings

    from echo.app import Echo

    with Echo(local_settings(db)) as echo:
        yield echo


def rows(echo: Any, sql: str) -> list[dict[str, Any]]:
    result = echo.reader.query(sql, max_rows=1_000_000, max_bytes=1 << 30, timeout_s=60)
    return [dict(zip(result.columns, r, strict=True)) for r in result.rows]


def attrs(row: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(row["attrs_json"] or "{}"))


def rank_pids(log: str) -> tuple[int, int]:
    """(rank, pid) from a simrank log's first line: ``rank R world W local L node N pid P tid T``."""
    words = log.split()
    return int(words[1]), int(words[words.index("pid") + 1])


def step_lines(log: str) -> list[list[str]]:
    """``step N start enter end sync_ns causes`` lines of a simrank log."""
    return [line.split() for line in log.splitlines() if line.startswith("step ")]
