"""Address -> function name for the agent's stacks, through bcc's symbol caches in a helper process.

Why a helper process: bcc before 0.33 (Debian 12 ships 0.26) closes an uninitialised file descriptor
when it destroys a symbol cache's perf-map module (``ModulePath`` with ``enter_ns`` false,
iovisor/bcc#5193): freeing or refreshing a cache closes a random descriptor of the process that holds
it. Inside the agent that was its BPF program's descriptor (``bpf.cleanup()`` then failed with EBADF);
in a helper it can only break the helper, which the agent restarts.

The helper (``python -m rankecho.agent.symbols``) keeps one cache per process incarnation (pid, start
ticks), refreshes a cache when an address resolves to nothing (a library ``dlopen``ed after the cache
was built; at most every ``REFRESH_S``) and frees it when told the process exited. bcc's ``BPF.sym``
instead keeps one cache per pid forever, which a reused pid would inherit.

Protocol, one JSON array per line, after the helper's first line ``ready``: ``["resolve", pid, start,
[addr, ...]]`` -> ``[name or null, ...]``; ``["forget", pid]`` -> ``[]``.

Usage::

    symbols = SymbolClient()
    symbols.resolve(pid, start_ticks, [0x401136, 0x7f...])   # ["main", None]
    symbols.forget(pid); symbols.close()
"""

from __future__ import annotations

import ctypes as ct
import json
import logging
import os
import select
import subprocess
import sys
import time
from typing import IO, Any

REFRESH_S = 5.0
"""Least time between two refreshes of one process's symbol cache (a stack walked into garbage yields
new unknown addresses; a refresh re-reads every mapping)."""
REPLY_TIMEOUT_S = 10.0
"""How long the agent waits for an answer before restarting the helper (the first lookup in a large
library loads its symbol table: ~5 ms for a 23 MB libpython here, far longer on a loaded machine)."""
READY_TIMEOUT_S = 60.0
"""How long the helper may take to start (interpreter and libbcc; seconds on a loaded machine)."""
READY = "ready"

log = logging.getLogger("rankecho.agent")


class BccSymbols:
    """bcc symbol caches, one per process incarnation (pid, start ticks); runs in the helper."""

    def __init__(self) -> None:
        from bcc.libbcc import bcc_symbol, lib

        self._lib: Any = lib
        self._symbol = bcc_symbol
        self._caches: dict[tuple[int, int], int] = {}
        self._refreshed: dict[tuple[int, int], float] = {}

    def _cache(self, pid: int, start: int) -> int:
        key = (pid, start)
        cache = self._caches.get(key)
        if cache is None:
            self.forget(pid)  # an earlier process under the same pid
            cache = self._caches[key] = int(self._lib.bcc_symcache_new(pid, None))  # default options
            self._refreshed[key] = time.monotonic()
        return cache

    def resolve(self, pid: int, start: int, addr: int) -> str | None:
        cache = self._cache(pid, start)
        name = self._lookup(cache, addr)
        now = time.monotonic()
        if name is None and now - self._refreshed[(pid, start)] >= REFRESH_S:
            self._lib.bcc_symcache_refresh(ct.c_void_p(cache))
            self._refreshed[(pid, start)] = now
            name = self._lookup(cache, addr)
        return name

    def _lookup(self, cache: int, addr: int) -> str | None:
        sym = self._symbol()
        if self._lib.bcc_symcache_resolve(ct.c_void_p(cache), addr, ct.byref(sym)) < 0:
            return None
        name = sym.demangle_name or sym.name  # bytes copied out before the demangled name is freed
        self._lib.bcc_symbol_free_demangle_name(ct.byref(sym))
        return bytes(name).decode(errors="replace") if name else None

    def forget(self, pid: int) -> None:
        for key in [k for k in self._caches if k[0] == pid]:
            self._lib.bcc_free_symcache(ct.c_void_p(self._caches.pop(key)), pid)
            self._refreshed.pop(key, None)


def serve(inp: IO[str], out: IO[str]) -> None:
    """The helper's loop: answer requests until the agent closes the pipe."""
    symbols = BccSymbols()
    out.write(READY + "\n")
    out.flush()
    for line in inp:
        req = json.loads(line)
        if req[0] == "resolve":
            pid, start, addrs = int(req[1]), int(req[2]), req[3]
            reply: list[str | None] = [symbols.resolve(pid, start, int(a)) for a in addrs]
        else:
            symbols.forget(int(req[1]))
            reply = []
        out.write(json.dumps(reply) + "\n")
        out.flush()


class SymbolClient:
    """The agent's end: starts the helper on first use and again whenever it dies or stalls."""

    def __init__(self, argv: list[str] | None = None) -> None:
        self._argv = argv or [sys.executable, "-m", "rankecho.agent.symbols"]
        self._proc: subprocess.Popen[str] | None = None
        self._ready = False
        self.restarts = 0

    def start(self) -> None:
        """Start the helper now (~0.5 s of interpreter and bcc start-up), not on the first stack, which
        arrives on the loop that drains the ring buffer."""
        self._helper()

    def _helper(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:
                self.restarts += 1
                log.warning("the symbol helper exited (%s); restarting it", self._proc.returncode)
            pipe = subprocess.PIPE
            self._proc = subprocess.Popen(self._argv, stdin=pipe, stdout=pipe, text=True, bufsize=1)
            self._ready = False
        return self._proc

    def _line(self, proc: subprocess.Popen[str], timeout_s: float) -> str:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        return proc.stdout.readline() if ready else ""

    def _ask(self, req: list[Any]) -> list[Any] | None:
        proc = self._helper()
        assert proc.stdin is not None
        try:
            if not self._ready:
                self._ready = self._line(proc, READY_TIMEOUT_S).strip() == READY
                if not self._ready:
                    raise OSError("the symbol helper did not start")
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
            line = self._line(proc, REPLY_TIMEOUT_S)
            reply = json.loads(line) if line else None
        except (OSError, ValueError) as err:
            log.warning("symbol helper: %s; restarting it", err)
            reply = None
        if not isinstance(reply, list):
            self._stop()  # stalled or broken: the next request starts a fresh one
            return None
        return reply

    def resolve(self, pid: int, start: int, addrs: list[int]) -> list[str | None] | None:
        """Names of ``addrs`` in process ``pid`` (None where no symbol covers one); None when the helper
        failed (nothing is known then: the caller must not remember the addresses as unknown)."""
        reply = self._ask(["resolve", pid, start, addrs])
        if reply is None or len(reply) != len(addrs):
            return None
        return [str(n) if n is not None else None for n in reply]

    def forget(self, pid: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._ask(["forget", pid])

    def _stop(self) -> None:
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        self.restarts += 1

    def close(self) -> None:
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def main() -> int:
    os.nice(5)  # symbolising is never urgent next to the job
    serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
