"""Run callers' SQL in worker processes with hard limits, so no query can grow Echo or stall ingest.

:class:`Sandbox` has the :class:`rankecho.echo.store.reader.Reader` ``query`` signature. Each query is guarded
(:func:`rankecho.echo.guard.check_sql`), then handed to one of ``workers`` child processes
(:mod:`rankecho.echo.sandbox.worker`) that reads a private copy of the store: a snapshot of the live
store (:mod:`rankecho.echo.store.snapshot`), or, for a store file no Echo holds (``rankecho query``,
``rankecho mcp --db``), a copy made here, in a private temporary directory, again whenever the file
changes. Workers prune the copy to what the guard's policy allows before they read it, and never change
the caller's file. While it waits for the answer, this side:

- kills the worker when its RSS passes ``memory_bytes`` (polled every ``POLL_S``; the worker's own
  ``RLIMIT_AS`` catches what grows faster than that);
- kills it at ``timeout_s + margin_s`` (the worker interrupts DuckDB itself at ``timeout_s``; the
  margin is for work the interrupt cannot stop, which acts only between vectors);
- reads frames whose size it bounds before reading them; rows were cut at the caps in the worker.

A killed worker is replaced on the next query. Memory used by queries is the workers' alone: Echo's own
process only ever holds the capped results.

Usage::

    sandbox = Sandbox(lambda: Path("echo.db"), SandboxLimits(memory_bytes=1 << 30))
    sandbox.query("SELECT count(*) FROM events", timeout_s=10).rows
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankecho.echo.guard import check_sql
from rankecho.echo.sandbox.protocol import HEADER, FrameError, decode, encode
from rankecho.echo.store.reader import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ROWS,
    DEFAULT_TIMEOUT_S,
    QueryBusyError,
    QueryError,
    QueryResourceError,
    QueryResult,
    QueryTimeoutError,
)
from rankecho.echo.store.snapshot import SnapshotError, Snapshots, is_private_copy

POLL_S = 0.02
START_TIMEOUT_S = 30.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class SandboxLimits:
    memory_bytes: int = 1 << 30
    """Most memory (RSS) one worker may use; past it the worker is killed and the query refused."""
    workers: int = 2
    """Queries that run at once; more wait (inside their own timeout) for a free worker."""
    margin_s: float = 2.0
    """Past ``timeout_s`` + this, a worker that has not answered is killed."""
    threads: int = 2
    """DuckDB threads per worker."""


class _Process:
    """One live worker and the bytes read from it but not yet consumed."""

    def __init__(self, limits: SandboxLimits) -> None:
        env = dict(os.environ, MALLOC_ARENA_MAX="2", PYTHONDONTWRITEBYTECODE="1")
        self.spill = tempfile.mkdtemp(prefix="rankecho-analysis-")
        """DuckDB's temp_directory for this worker (removed when the worker goes)."""
        worker = [sys.executable, "-m", "rankecho.echo.sandbox.worker"]
        self.proc = subprocess.Popen(
            [*worker, str(limits.memory_bytes), str(limits.threads), self.spill],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.buffer = bytearray()
        self.peak_rss = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss(self) -> int:
        try:
            with open(f"/proc/{self.proc.pid}/statm", encoding="ascii") as statm:
                return int(statm.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            return 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, message: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode(message))
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        shutil.rmtree(self.spill, ignore_errors=True)


class _Stopped(Exception):
    def __init__(self, why: str) -> None:
        self.why = why


class Sandbox:
    """Thread-safe; at most ``limits.workers`` queries run at once."""

    def __init__(
        self,
        source: Callable[[], Path],
        limits: SandboxLimits = SandboxLimits(),
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_rows: int = DEFAULT_MAX_ROWS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        check: Callable[[str], str] = check_sql,
    ) -> None:
        self.source = source
        self.limits = limits
        self.timeout_s = timeout_s
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.check = check
        self.kills = 0
        """Workers killed so far (memory or deadline); tests and /metrics read it."""
        self.busy = 0
        """Queries holding a worker slot now (a test waits on it instead of sleeping)."""
        self._slots = threading.Semaphore(limits.workers)
        self._idle: list[_Process] = []
        self._lock = threading.Lock()
        self._closed = False
        self._copies: dict[Path, Snapshots] = {}
        """Private copies of store files that are not already private copies, by file."""

    # -- workers ----------------------------------------------------------------------------------
    def _take(self, deadline: float) -> _Process:
        if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise QueryBusyError(
                f"all {self.limits.workers} analysis workers stayed busy past the timeout: try again, "
                "or run fewer queries at once"
            )
        with self._lock:
            self.busy += 1
            while self._idle:
                proc = self._idle.pop()
                if proc.alive():
                    return proc
                proc.kill()
        try:
            proc = _Process(self.limits)
            self._expect(proc, time.monotonic() + START_TIMEOUT_S, lambda m: "ready" in m)
            return proc
        except BaseException:
            self._release()
            raise

    def _give_back(self, proc: _Process, reusable: bool) -> None:
        if reusable and proc.alive() and not self._closed:
            with self._lock:
                self._idle.append(proc)
        else:
            proc.kill()
        self._release()

    def _release(self) -> None:
        with self._lock:
            self.busy -= 1
        self._slots.release()

    def close(self) -> None:
        """Kill every idle worker (running queries finish or are killed at their deadline) and delete the
        copies this sandbox made."""
        self._closed = True
        with self._lock:
            idle, self._idle = self._idle, []
            copies, self._copies = list(self._copies.values()), {}
        for proc in idle:
            proc.kill()
        for snapshots in copies:
            snapshots.remove_all()

    def _readable(self, path: Path) -> Path:
        """A copy of ``path`` the workers may prune: ``path`` itself when it is a snapshot's copy, else a
        copy made here (refreshed when the file changes), never the caller's file."""
        if is_private_copy(path):
            return path
        with self._lock:
            snapshots = self._copies.get(path)
            if snapshots is None:
                directory = Path(tempfile.mkdtemp(prefix="rankecho-store-"))
                snapshots = Snapshots(path, contextlib.nullcontext, directory, copy_files=_copy_elsewhere)
                self._copies[path] = snapshots
        return snapshots.current()

    # -- reading ----------------------------------------------------------------------------------
    def _read(self, proc: _Process, size: int, deadline: float) -> bytes:
        assert proc.proc.stdout is not None
        fd = proc.proc.stdout.fileno()
        while len(proc.buffer) < size:
            now = time.monotonic()
            if now >= deadline:
                raise _Stopped("deadline")
            rss = proc.rss()
            proc.peak_rss = max(proc.peak_rss, rss)
            if rss > self.limits.memory_bytes:
                raise _Stopped("memory")
            ready, _, _ = select.select([fd], [], [], min(POLL_S, deadline - now))
            if ready:
                data = os.read(fd, 1 << 20)
                if not data:
                    raise _Stopped("died")
                proc.buffer += data
        out = bytes(proc.buffer[:size])
        del proc.buffer[:size]
        return out

    def _frame(self, proc: _Process, deadline: float, limit: int) -> dict[str, Any]:
        (size,) = HEADER.unpack(self._read(proc, HEADER.size, deadline))
        if size > limit:
            raise _Stopped("oversized")
        message = decode(self._read(proc, size, deadline))
        if not isinstance(message, dict):
            raise FrameError("the analysis worker sent something other than a message")
        return message

    def _expect(self, proc: _Process, deadline: float, ok: Callable[[dict[str, Any]], bool]) -> None:
        try:
            message = self._frame(proc, deadline, 1 << 16)
        except (_Stopped, FrameError):
            proc.kill()
            raise QueryError("the analysis worker did not start: check that DuckDB imports") from None
        if not ok(message):
            proc.kill()
            raise QueryError("the analysis worker did not start")

    # -- queries ----------------------------------------------------------------------------------
    def query(
        self,
        sql: str,
        params: Sequence[Any] | dict[str, Any] | None = None,
        timeout_s: float | None = None,
        max_rows: int | None = None,
        max_bytes: int | None = None,
    ) -> QueryResult:
        """Run ``sql`` in a worker; raises Refused, QueryTimeoutError or QueryError (QueryResourceError:
        stopped at the memory cap; QueryBusyError: no worker became free within the timeout)."""
        statement = self.check(sql)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        row_cap = self.max_rows if max_rows is None else max_rows
        byte_cap = self.max_bytes if max_bytes is None else max_bytes
        started = time.monotonic()
        deadline = started + timeout + self.limits.margin_s
        db = str(self._readable(self.source()))  # may wait (briefly) for a fresh copy of the store
        proc = self._take(started + timeout)
        reusable = False
        try:
            request = {
                "db": db,
                "sql": statement,
                "params": params,
                "timeout_s": max(0.001, timeout - (time.monotonic() - started)),
                "max_rows": row_cap,
                "max_bytes": byte_cap,
            }
            answer, reusable = self._exchange(proc, request, deadline, byte_cap, timeout)
        finally:
            self._give_back(proc, reusable)
        if isinstance(answer, Exception):
            raise answer
        result = answer
        result.elapsed_ms = (time.monotonic() - started) * 1000
        return result

    def _exchange(
        self, proc: _Process, request: dict[str, Any], deadline: float, byte_cap: int, timeout: float
    ) -> tuple[QueryResult | QueryError | QueryTimeoutError, bool]:
        """The result, or the error to raise; and whether the worker may serve another query."""
        frame_limit = 8 * byte_cap + (1 << 20)
        try:
            proc.send(request)
            head = self._frame(proc, deadline, frame_limit)
            if "error" in head:
                return self._error(head, timeout)
            result = QueryResult(list(head["columns"]), [], types=list(head["types"]))
            while True:
                message = self._frame(proc, deadline, frame_limit)
                if "rows" in message:
                    result.rows.extend(tuple(row) for row in message["rows"])
                elif "done" in message:
                    cut = message.get("truncated_by")
                    result.truncated, result.truncated_by = cut is not None, cut
                    return result, True
                else:
                    return self._error(message, timeout)
        except FrameError as exc:
            self.kills += 1
            return QueryError(f"query failed: a value in the result cannot be returned ({exc})"), False
        except (_Stopped, BrokenPipeError) as stop:
            self.kills += 1
            why = stop.why if isinstance(stop, _Stopped) else "died"
            if why == "deadline":
                return QueryTimeoutError(_timeout_text(timeout)), False
            return QueryResourceError(self._memory_text()), False

    def _error(
        self, message: dict[str, Any], timeout: float
    ) -> tuple[QueryError | QueryTimeoutError, bool]:
        """A clean error answer; the worker is reused after a DuckDB error, replaced after the others
        (an interrupted or out-of-memory DuckDB is not worth trusting with the next query)."""
        kind = message.get("error")
        if kind == "timeout":
            return QueryTimeoutError(_timeout_text(timeout)), False
        if kind == "memory":
            return QueryResourceError(self._memory_text()), False
        return QueryError(f"query failed: {message.get('message', 'unknown error')}"), True

    def _memory_text(self) -> str:
        return (
            f"query needed more than {self.limits.memory_bytes >> 20} MiB and was stopped: aggregate "
            "before returning rows, narrow the time window, and keep range()/repeat() sizes small"
        )


COPIER = Path(__file__).resolve().with_name("copier.py")


def _copy_elsewhere(source: Path, target: Path, wal_length: int) -> None:
    """Copy a store file no snapshot owns, in a process of its own (see :mod:`echo.sandbox.copier`)."""
    del wal_length  # the copier copies the whole WAL: no writer holds the file
    try:
        done = subprocess.run(
            [sys.executable, "-I", str(COPIER), str(source), str(target)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SnapshotError("copying the store for analysis took over 600 s") from None
    if done.returncode == 3:
        raise SnapshotError(
            "the store file is open for writing by another process (a running Echo?): query it through "
            "that Echo's run_analysis, or stop it first"
        )
    if done.returncode:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["unknown error"]
        raise SnapshotError(f"copying the store for analysis failed ({last[0][:200]})")


def _timeout_text(timeout: float) -> str:
    return f"query ran past {timeout:g} s and was stopped: narrow it (WHERE timestamp_ns ..., LIMIT)"
