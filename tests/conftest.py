"""Shared fixtures: a real Echo, in-process or as a ``rankecho serve`` subprocess.

Both bind 127.0.0.1 on free ports, use a fresh DuckDB file under pytest's tmp dir, require the token
``TEST_TOKEN`` and are stopped (drained, committed, lock released) when the test ends.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from echo_helpers import TEST_TOKEN

from rankecho.echo.app import Echo
from rankecho.echo.settings import HostPort, Settings
from rankecho.launch.echo import EchoProcess

LOOPBACK_ANY_PORT = HostPort("127.0.0.1", 0)
TMPFS_BYTES = 24 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs for store-fault tests (fill it with ``echo_helpers.disk_filled``): filling it is
    fast and touches no real disk. Needs root (mount); elsewhere the test skips with why."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(where)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def local_settings(db_path: Path, **overrides: object) -> Settings:
    """Settings for a test Echo: loopback, free ports, ``TEST_TOKEN``, no MCP listener."""
    values: dict[str, object] = {
        "db_path": db_path,
        "token": TEST_TOKEN,
        "otlp_grpc": LOOPBACK_ANY_PORT,
        "otlp_http": LOOPBACK_ANY_PORT,
        "mcp_http": None,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@contextmanager
def inproc_echo(db_path: Path, **overrides: object) -> Iterator[Echo]:
    """A started in-process Echo on ``db_path`` with :func:`local_settings` (plus ``overrides``); the
    one in-process Echo of the tests (the fixture below, module-scoped fixtures, tests that need two)."""
    with Echo(local_settings(db_path, **overrides)) as echo:
        yield echo


@pytest.fixture
def echo_inproc(tmp_path: Path) -> Iterator[Echo]:
    """A started in-process :class:`rankecho.echo.app.Echo` on ``tmp_path/echo.db``.

    Use ``echo_inproc.grpc_address`` / ``.http_address`` ("127.0.0.1:PORT"), ``.reader.query(sql)``
    for reads on the same DuckDB instance, ``.stats`` for counters; the token is ``TEST_TOKEN``.
    For other settings use ``inproc_echo(path, queue_rows=10)`` in the test itself.
    """
    with inproc_echo(tmp_path / "echo.db") as echo:
        yield echo


@pytest.fixture
def echo_process(tmp_path: Path) -> Iterator[EchoProcess]:
    """A real ``rankecho serve`` child on ``tmp_path/echo.db``, started and ready.

    ``echo_process.listening`` holds the printed addresses (``otlp_grpc``, ``otlp_http``, ``mcp_http``),
    ``echo_process.db`` the store path, ``echo_process.token`` the token (``TEST_TOKEN``); stopped with
    SIGTERM at the end (``.kill()`` is kill -9, ``.stop()`` SIGTERM-and-wait).
    """
    with EchoProcess(tmp_path / "echo.db", token=TEST_TOKEN) as echo:
        yield echo
