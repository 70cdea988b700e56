"""The agent's memory of the Python processes it traces: which pids run a supported CPython, and the
names of the frames already decoded.

agent/pyframes.py reads CPython's internals and keeps no state; this module is the one place that does,
so each process is detected once (and an unsupported version said once in the log, not per record), a
training loop's few code objects are read from ``/proc/PID/mem`` once, and everything a process left is
dropped at its exit (a reused pid must not inherit its code objects). See docs/python-frames.md.

Usage::

    proc = DECODER.register(pid)             # None: no CPython, or an unsupported one (logged once)
    bpf["py_targets"][ctypes.c_uint32(pid)] = proc.target()
    frames = python_frames(pid, raw)         # raw: RkPyStack (or its bytes) filled by rk_py_walk
    forget(pid)                              # on exit
"""

from __future__ import annotations

import ctypes
import logging
import struct

from rankecho.agent.pyframes import (
    FRAME_SHIM,
    LAYOUTS,
    MAX_FRAMES,
    CodeInfo,
    PyProcess,
    RkPyStack,
    detect,
    frame_name,
    read_code,
)

log = logging.getLogger("rankecho.agent")


class FrameDecoder:
    """Names the frames of :class:`RkPyStack` records, caching per process, code object and offset; one per
    agent. Call :meth:`forget` when a process exits (a reused pid must not inherit its code objects)."""

    def __init__(self) -> None:
        self._procs: dict[int, PyProcess | None] = {}
        self._codes: dict[tuple[int, int], CodeInfo] = {}
        self._names: dict[tuple[int, int, int], str] = {}
        self._told: set[tuple[int, int]] = set()

    def register(self, pid: int) -> PyProcess | None:
        """Detect ``pid`` (once): a supported CPython gives its :class:`PyProcess`; another version is said
        once per version in the log and gives None, like a process that runs no CPython."""
        if pid not in self._procs:
            proc = detect(pid)
            if proc is not None and not proc.supported:
                if proc.version not in self._told:
                    self._told.add(proc.version)
                    log.warning("CPython %d.%d (pid %d, %s): Python frames are read for 3.10-3.12 only; "
                                "its stacks carry native frames only", *proc.version, pid, proc.path)
                proc = None
            self._procs[pid] = proc
        return self._procs[pid]

    def frames(self, pid: int, raw: RkPyStack | bytes) -> list[str]:
        """The named Python frames of ``raw``, innermost first (shim frames dropped)."""
        stack = raw if isinstance(raw, RkPyStack) else RkPyStack.from_buffer_copy(
            bytes(raw)[:ctypes.sizeof(RkPyStack)])
        proc = self.register(pid)
        if proc is None:  # a failed read keeps the frames read before it
            return []
        out = []
        for frame in stack.frames[:min(stack.n, MAX_FRAMES)]:
            if frame.flags & FRAME_SHIM:
                continue
            key = (pid, frame.code, frame.offset)
            name = self._names.get(key)
            if name is None:
                code = self._code(proc, frame.code)
                if code is None:  # not cached: the process may be gone, or the read raced a write
                    out.append(f"?:{frame.code:#x}:0")
                    continue
                name = self._names[key] = frame_name(proc.version, code, frame.offset)
            out.append(name)
        return out

    def _code(self, proc: PyProcess, addr: int) -> CodeInfo | None:
        key = (proc.pid, addr)
        if key not in self._codes:
            try:
                self._codes[key] = read_code(proc.pid, LAYOUTS[proc.version], addr)
            except (OSError, ValueError, struct.error):
                return None
        return self._codes[key]

    def forget(self, pid: int) -> None:
        """Drop everything known about ``pid`` (call on process exit)."""
        self._procs.pop(pid, None)
        self._codes = {k: v for k, v in self._codes.items() if k[0] != pid}
        self._names = {k: v for k, v in self._names.items() if k[0] != pid}


DECODER = FrameDecoder()
"""The agent's decoder; :func:`python_frames` and :func:`forget` use it."""


def python_frames(pid: int, raw: RkPyStack | bytes) -> list[str]:
    """``<file basename>:<function>:<line>`` for each Python frame in ``raw``, innermost first."""
    return DECODER.frames(pid, raw)


def forget(pid: int) -> None:
    """Forget a process that exited."""
    DECODER.forget(pid)
