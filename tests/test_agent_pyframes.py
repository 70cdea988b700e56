"""Python frames from real eBPF: a bcc program built from agent/bpf/pyframes.h, a uprobe on libc's
``nanosleep``, and a Python program (tests/agent_fixtures/pyframes_prog.py) calling it through ctypes from
named functions on its main thread and a loader thread, under each CPython version installed here.
The decoded frames must be exactly the program's own call chain with its lines (it prints them, found
with ``inspect``). Run ``python tests/test_agent_pyframes.py`` to measure the capture cost per hit.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankecho.agent import pyframes
from rankecho.agent.check import check_bcc

PROG = Path(__file__).parent / "agent_fixtures" / "pyframes_prog.py"
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
CALLS = 40

BPF_TEXT = """
#include <uapi/linux/ptrace.h>
PYFRAMES_H
struct hit { __u32 tid; __u32 ret; struct rk_py_stack s; };
BPF_RINGBUF_OUTPUT(hits, 64);
int on_call(struct pt_regs *ctx) {
    __u64 id = bpf_get_current_pid_tgid();
    struct hit *h = hits.ringbuf_reserve(sizeof(struct hit));
    if (!h)
        return 0;
    h->tid = (__u32)id;
    h->ret = rk_py_walk(id >> 32, (__u32)id, &h->s);
    hits.ringbuf_submit(h, 0);
    return 0;
}
int on_call_empty(struct pt_regs *ctx) { return 0; }
BPF_PERCPU_ARRAY(scratch, struct rk_py_stack, 1);
int on_call_walk(struct pt_regs *ctx) {
    __u64 id = bpf_get_current_pid_tgid();
    int zero = 0;
    struct rk_py_stack *s = scratch.lookup(&zero);
    if (s)
        rk_py_walk(id >> 32, (__u32)id, s);
    return 0;
}
"""


def python_path(version: str) -> Path:
    """pyenv's ``version``, or Debian's python3 for "system"."""
    return Path("/usr/bin/python3") if version == "system" else PYENV / version / "bin" / "python3"


def interpreter(version: str) -> str:
    path = python_path(version)
    if not path.exists():
        pytest.skip(f"CPython {version} is not installed here ({path}; `pyenv install {version}` adds it)")
    return str(path)


needs_ebpf = pytest.mark.skipif(os.geteuid() != 0 or not check_bcc().ok,
                                reason="real eBPF needs root and bcc (" + check_bcc().fix + ")")


@dataclass
class Prog:
    """A running pyframes_prog.py."""

    proc: subprocess.Popen[str]
    pid: int

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the program ended early: {self.proc.stderr.read() if self.proc.stderr else ''}"
        return dict(json.loads(line))


@contextmanager
def running(python: str, *args: str) -> Iterator[Prog]:
    proc = subprocess.Popen([python, str(PROG), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield Prog(proc, int(json.loads(proc.stdout.readline())["pid"]))
    finally:
        proc.kill()
        proc.wait()


def libc_path(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return next(line.split()[-1] for line in f if "/libc.so" in line or "/libc-" in line)


def load_bpf() -> Any:
    from bcc import BPF

    return BPF(text=BPF_TEXT.replace("PYFRAMES_H", pyframes.header_text()).encode())


def capture(python: str) -> tuple[dict[str, Any], dict[int, list[list[str]]], int]:
    """Run the program under ``python`` with the probe on: (its report, decoded frames per tid, hits
    whose walk found no thread state)."""
    bpf = load_bpf()
    try:
        with running(python) as prog:
            proc = pyframes.detect(prog.pid)
            assert proc is not None and proc.supported, proc
            bpf[b"py_targets"][ctypes.c_uint32(prog.pid)] = proc.target()
            bpf.attach_uprobe(name=libc_path(prog.pid).encode(), sym=b"nanosleep", fn_name=b"on_call",
                              pid=prog.pid)
            raws: list[tuple[int, bytes]] = []

            def keep(_cpu: int, data: int, size: int) -> int:
                raws.append((ctypes.c_uint32.from_address(data).value, ctypes.string_at(data, size)[8:]))
                return 0

            bpf[b"hits"].open_ring_buffer(keep)
            prog.send(f"go {CALLS}")
            report = prog.receive()
            bpf.ring_buffer_consume()
            decoder = pyframes.FrameDecoder()
            frames: dict[int, list[list[str]]] = {}
            for tid, raw in raws:
                frames.setdefault(tid, []).append(decoder.frames(prog.pid, raw))
            missing = sum(1 for _, raw in raws if pyframes.RkPyStack.from_buffer_copy(raw).status)
            prog.send("exit")
            return report, frames, missing
    finally:
        bpf.cleanup()


@needs_ebpf
@pytest.mark.parametrize("version", ["3.10.13", "3.11.7", "3.12.1", "system"])
def test_frames_are_the_python_call_chain_with_lines_on_both_threads(version: str) -> None:
    report, frames, missing = capture(interpreter(version))
    tids, expected = report["tids"], report["expected"]
    assert expected["main"][:3] == [
        f"pyframes_prog.py:allocate_cache:{expected['main'][0].rsplit(':', 1)[1]}",
        f"pyframes_prog.py:forward:{expected['main'][1].rsplit(':', 1)[1]}",
        f"pyframes_prog.py:train_step:{expected['main'][2].rsplit(':', 1)[1]}",
    ] and expected["main"][-1].startswith("pyframes_prog.py:<module>:")
    assert [f.split(":")[1] for f in expected["loader"][:3]] == ["read_shard", "fetch_batch", "loader_loop"]
    assert missing == 0
    for chain in ("main", "loader"):
        seen = frames[tids[chain]]
        assert len(seen) == CALLS, (chain, len(seen))
        for got in seen:
            assert got == expected[chain], (chain, got)


@needs_ebpf
def test_the_bpf_layouts_match_the_python_mirrors() -> None:
    bpf = load_bpf()
    try:
        assert ctypes.sizeof(bpf[b"py_targets"].Leaf) == ctypes.sizeof(pyframes.RkPyTarget)
        assert ctypes.sizeof(pyframes.RkPyStack) == 8 + 16 * pyframes.MAX_FRAMES
    finally:
        bpf.cleanup()


def test_a_newer_cpython_is_detected_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    python = interpreter("3.13.0")
    decoder = pyframes.FrameDecoder()
    with running(python) as first, running(python) as second, caplog.at_level(logging.WARNING):
        proc = pyframes.detect(first.pid)
        assert proc is not None and proc.version == (3, 13) and not proc.supported
        assert proc.path.endswith("libpython3.13.so.1.0") and proc.runtime > 0
        assert decoder.register(first.pid) is None and decoder.register(second.pid) is None
        assert decoder.frames(first.pid, bytes(ctypes.sizeof(pyframes.RkPyStack))) == []
    told = [r.getMessage() for r in caplog.records if "3.10-3.12 only" in r.getMessage()]
    assert len(told) == 1 and "CPython 3.13" in told[0]


def test_a_process_that_runs_no_python_is_not_a_target() -> None:
    with subprocess.Popen(["sleep", "30"]) as proc:
        try:
            assert pyframes.detect(proc.pid) is None
        finally:
            proc.kill()
    assert pyframes.detect(2**22 + 7) is None  # no such pid


def test_runtime_address_is_where_the_interpreter_keeps_its_state() -> None:
    """``_PyRuntime`` found from outside equals what ctypes finds inside, for a shared libpython
    (pyenv) and a non-PIE executable (Debian's python3)."""
    probe = ("import ctypes,json,os,sys; print(json.dumps({'pid': os.getpid(), 'at': "
             "ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, '_PyRuntime'))}), flush=True); "
             "sys.stdin.readline()")
    for version in ("3.11.7", "system"):
        python = interpreter(version)
        proc = subprocess.Popen([python, "-c", probe], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stdout is not None
            told = json.loads(proc.stdout.readline())
            found = pyframes.detect(told["pid"])
            assert found is not None and found.runtime == told["at"], (version, found, told)
        finally:
            proc.kill()
            proc.wait()


def test_forget_drops_a_process() -> None:
    decoder = pyframes.FrameDecoder()
    with running(interpreter("3.11.7")) as prog:
        assert decoder.register(prog.pid) is not None
        decoder.forget(prog.pid)
        assert prog.pid not in decoder._procs


# --- cost per hit (not a test: `python tests/test_agent_pyframes.py [version ...]`) ---------------------

TIMED = """
import ctypes, sys, time
sys.path.insert(0, {dir!r})
import pyframes_prog as p
p.report = lambda chain, fn: None
for _ in range(3):
    best = []
    for _ in range(15):
        t = time.perf_counter_ns()
        p.main_loop(2000)
        best.append((time.perf_counter_ns() - t) / 2000)
    best.sort()
    print(best[len(best) // 2], flush=True)
sys.stdin.readline()
"""


def _median_per_call(python: str, bpf: Any, fn: str | None) -> float:
    proc = subprocess.Popen([python, "-c", TIMED.format(dir=str(PROG.parent))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        if fn is not None:
            found = pyframes.detect(proc.pid)
            assert found is not None
            bpf[b"py_targets"][ctypes.c_uint32(proc.pid)] = found.target()
            bpf.attach_uprobe(name=libc_path(proc.pid).encode(), sym=b"nanosleep", fn_name=fn.encode(),
                              pid=proc.pid)
        assert proc.stdout is not None
        medians = [float(proc.stdout.readline()) for _ in range(3)]
        if fn is not None:
            bpf.detach_uprobe(name=libc_path(proc.pid).encode(), sym=b"nanosleep", pid=proc.pid)
        return min(medians)
    finally:
        proc.kill()
        proc.wait()


def measure(versions: list[str]) -> None:
    bpf = load_bpf()
    try:
        for version in versions:
            python = str(python_path(version))
            none, empty, walk = (_median_per_call(python, bpf, fn)
                                 for fn in (None, "on_call_empty", "on_call_walk"))
            print(f"{version}: {none:.0f} ns/call unprobed, empty uprobe +{empty - none:.0f} ns, "
                  f"walk of 6 frames +{walk - empty:.0f} ns over the empty uprobe")
            time.sleep(0.1)
    finally:
        bpf.cleanup()


if __name__ == "__main__":
    measure(sys.argv[1:] or ["3.10.13", "3.11.7", "3.12.1", "system"])
