"""Python frames from real eBPF: a bcc program built from agent/bpf/pyframes.h, a uprobe on libc's
``nanosleep``, and a Python program (tests/agent_fixtures/pyframes_prog.py) calling it through ctypes from
named functions on its main thread and a loader thread, under each CPython version installed here.
The decoded frames must be exactly the program's own call chain with its lines (it prints them, found
with ``inspect``). The capture cost per hit: ``python tests/agent_fixtures/pyframes_cost.py``.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_agent_helpers import requires_ebpf

from rankecho.agent import pyframe_cache, pyframes

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
"""

OFFCPU_TEXT = """
#include <uapi/linux/ptrace.h>
PYFRAMES_H
struct hit { __u32 tid; __u32 ret; struct rk_py_stack s; };
BPF_RINGBUF_OUTPUT(hits, 64);
TRACEPOINT_PROBE(sched, sched_switch) {
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    if (args->prev_state == 0 || !py_targets.lookup(&tgid))
        return 0;
    struct hit *h = hits.ringbuf_reserve(sizeof(struct hit));
    if (!h)
        return 0;
    h->tid = (__u32)id;
    h->ret = rk_py_walk(tgid, (__u32)id, &h->s);
    hits.ringbuf_submit(h, 0);
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


def load_bpf(text: str = BPF_TEXT) -> Any:
    from bcc import BPF

    return BPF(text=text.replace("PYFRAMES_H", pyframes.header_text()).encode())


@dataclass
class Hit:
    """One record: its decoded frames, status, truncated flag and the positions of frames marked shim."""

    frames: list[str]
    status: int
    truncated: int
    shims: list[int]


@dataclass
class Capture:
    """What one run under one interpreter gave: the program's report and each thread's hits."""

    report: dict[str, Any]
    hits: dict[int, list[Hit]]

    def of(self, chain: str) -> list[Hit]:
        return self.hits.get(self.report["tids"][chain], [])

    def seen(self, chain: str) -> list[list[str]]:
        return [hit.frames for hit in self.of(chain)]


def capture(python: str, go: str = f"go {CALLS}", text: str = BPF_TEXT) -> Capture:
    """Run the program under ``python`` with ``text`` loaded (the uprobe on ``nanosleep`` attached when it
    has ``on_call``), sending ``go``."""
    bpf = load_bpf(text)
    try:
        with running(python) as prog:
            proc = pyframes.detect(prog.pid)
            assert proc is not None and proc.supported, proc
            bpf[b"py_targets"][ctypes.c_uint32(prog.pid)] = proc.target()
            if "on_call(" in text:
                bpf.attach_uprobe(name=libc_path(prog.pid).encode(), sym=b"nanosleep", fn_name=b"on_call",
                                  pid=prog.pid)
            raws: list[tuple[int, bytes]] = []

            def keep(_cpu: int, data: int, size: int) -> int:
                raws.append((ctypes.c_uint32.from_address(data).value, ctypes.string_at(data, size)[8:]))
                return 0

            bpf[b"hits"].open_ring_buffer(keep)
            prog.send(go)
            report = prog.receive()
            bpf.ring_buffer_consume()
            decoder = pyframe_cache.FrameDecoder()
            hits: dict[int, list[Hit]] = {}
            for tid, raw in raws:
                stack = pyframes.RkPyStack.from_buffer_copy(raw)
                shims = [i for i in range(stack.n) if stack.frames[i].flags & pyframes.FRAME_SHIM]
                hits.setdefault(tid, []).append(
                    Hit(decoder.frames(prog.pid, raw), stack.status, stack.truncated, shims))
            prog.send("exit")
            return Capture(report, hits)
    finally:
        bpf.cleanup()


@requires_ebpf
@pytest.mark.ebpf
@pytest.mark.parametrize("version", ["3.10.13", "3.11.7", "3.12.1", "system"])
def test_frames_are_the_python_call_chain_with_lines_on_both_threads(version: str) -> None:
    got = capture(interpreter(version))
    expected = got.report["expected"]
    assert [f.split(":")[1] for f in expected["main"]] == [
        "allocate_cache", "forward", "train_step", "nest", "main_loop", "main", "<module>"]
    assert [f.split(":")[1] for f in expected["loader"][:3]] == ["read_shard", "fetch_batch", "loader_loop"]
    assert all(hit.status == pyframes.STATUS_OK for hits in got.hits.values() for hit in hits)
    for chain in ("main", "loader"):
        seen = got.seen(chain)
        assert len(seen) == CALLS, (chain, len(seen))
        for frames in seen:
            assert frames == expected[chain], (chain, frames)
    # 3.12 puts a shim frame where C enters the interpreter: below the generator resumed by next() and
    # below each thread's first frame; they were marked in BPF and dropped in user space.
    shims = {chain: got.of(chain)[0].shims for chain in ("main", "loader")}
    assert shims == ({"main": [7], "loader": [2, 7]} if version == "3.12.1" else {"main": [], "loader": []})


@requires_ebpf
@pytest.mark.ebpf
def test_a_deeper_stack_keeps_its_innermost_frames_and_says_truncated() -> None:
    got = capture(interpreter("3.12.1"), f"go 5 0 {pyframes.MAX_FRAMES + 6}")
    expected = got.report["expected"]["main"]
    assert len(expected) > pyframes.MAX_FRAMES
    hits = got.of("main")
    assert len(hits) == 5
    innermost = expected[:pyframes.MAX_FRAMES]
    for hit in hits:
        assert (hit.frames, hit.status, hit.truncated) == (innermost, pyframes.STATUS_OK, 1)


@requires_ebpf
@pytest.mark.ebpf
@pytest.mark.parametrize("version", ["3.10.13", "3.11.7"])
def test_the_main_thread_is_found_behind_many_newer_threads(version: str) -> None:
    """Thread states are listed newest first, so the main thread's is the last of 22 here."""
    got = capture(interpreter(version), "go 5 0 0 20")
    for chain in ("main", "loader"):
        assert got.seen(chain) == [got.report["expected"][chain]] * 5, chain


@requires_ebpf
@pytest.mark.ebpf
@pytest.mark.parametrize("version", ["3.10.13", "3.12.1"])
def test_a_thread_that_blocks_shows_its_frames_at_switch_out(version: str) -> None:
    """From ``sched_switch`` (the context of the task going off the CPU), as the agent's off-CPU capture
    runs it: each 2 ms sleep of either thread is seen with the frames that called it."""
    got = capture(interpreter(version), "go 10 2000000", OFFCPU_TEXT)
    expected = got.report["expected"]
    for chain in ("main", "loader"):
        in_sleep = [frames for frames in got.seen(chain) if frames[:1] == expected[chain][:1]]
        assert len(in_sleep) >= 10, (chain, got.seen(chain))
        assert all(frames == expected[chain] for frames in in_sleep), (chain, in_sleep)


@requires_ebpf
@pytest.mark.ebpf
def test_the_bpf_layouts_match_the_python_mirrors() -> None:
    bpf = load_bpf()
    try:
        assert ctypes.sizeof(bpf[b"py_targets"].Leaf) == ctypes.sizeof(pyframes.RkPyTarget)
        assert ctypes.sizeof(pyframes.RkPyStack) == 8 + 16 * pyframes.MAX_FRAMES
    finally:
        bpf.cleanup()


LINES_CHECK = """
import importlib.util, sys, types, json, email.message, json.decoder, inspect
spec = importlib.util.spec_from_file_location("pf", sys.argv[1])
pf = importlib.util.module_from_spec(spec)
sys.modules["pf"] = pf
spec.loader.exec_module(pf)
lookup = pf.line_310 if sys.version_info[:2] == (3, 10) else pf.line_311
def codes(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from codes(c)
checked = wrong = 0
for mod in (email.message, json.decoder, inspect):
    for co in codes(compile(open(mod.__file__).read(), mod.__file__, "exec")):
        for start, end, line in co.co_lines():
            for offset in range(start, end, 2):
                checked += 1
                wrong += lookup(co.co_linetable, co.co_firstlineno, offset) != line
print(json.dumps([checked, wrong]))
"""


@pytest.mark.parametrize("version", ["3.10.13", "3.11.7", "3.12.1", "system"])
def test_line_tables_decode_as_the_interpreter_does(version: str) -> None:
    """The decoders, run inside each interpreter on its own code objects, agree with ``co_lines()`` on
    every instruction of three stdlib modules."""
    done = subprocess.run([interpreter(version), "-c", LINES_CHECK, pyframes.__file__], capture_output=True,
                          text=True, check=True)
    checked, wrong = json.loads(done.stdout)
    assert checked > 10_000 and wrong == 0


NAMES = """
import json, sys
def größe(): pass
def 名前(): pass
print(json.dumps({n: id(f.__code__) for n, f in (("größe", größe), ("名前", 名前))}), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("version", ["3.10.13", "3.11.7", "3.12.1"])
def test_code_objects_are_read_from_the_process_with_non_ascii_names(version: str, tmp_path: Path) -> None:
    script = tmp_path / "módulo.py"
    script.write_text(NAMES, encoding="utf-8")
    proc = subprocess.Popen([interpreter(version), str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, encoding="utf-8")
    try:
        assert proc.stdout is not None
        codes = json.loads(proc.stdout.readline())
        found = pyframes.detect(proc.pid)
        assert found is not None
        for line, (name, addr) in enumerate(codes.items(), start=3):
            code = pyframes.read_code(proc.pid, pyframes.LAYOUTS[found.version], addr)
            assert (code.filename, code.name, code.firstlineno) == ("módulo.py", name, line)
    finally:
        proc.kill()
        proc.wait()


def test_a_newer_cpython_is_detected_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    python = interpreter("3.13.0")
    decoder = pyframe_cache.FrameDecoder()
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


def test_records_decode_in_user_space_and_forget_drops_the_process(tmp_path: Path) -> None:
    """Without eBPF: a record built by hand from a live process's code objects names them; a frame whose
    code object cannot be read says so and is not cached; a shim frame is dropped; forget clears it all."""
    script = tmp_path / "módulo.py"
    script.write_text(NAMES, encoding="utf-8")
    with subprocess.Popen([interpreter("3.12.1"), str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, encoding="utf-8") as proc:
        try:
            assert proc.stdout is not None
            codes = list(json.loads(proc.stdout.readline()).values())
            stack = pyframes.RkPyStack(n=3)
            stack.frames[0] = pyframes.RkPyFrame(codes[0], 0, 0)
            stack.frames[1] = pyframes.RkPyFrame(0x10, 0, 0)
            stack.frames[2] = pyframes.RkPyFrame(codes[1], 0, pyframes.FRAME_SHIM)
            decoder = pyframe_cache.FrameDecoder()
            for raw in (stack, bytes(stack)):
                assert decoder.frames(proc.pid, raw) == ["módulo.py:größe:3", "?:0x10:0"]
            assert (proc.pid, 0x10, 0) not in decoder._names and (proc.pid, codes[0], 0) in decoder._names
            decoder.forget(proc.pid)
            assert not decoder._names and not decoder._codes and proc.pid not in decoder._procs
        finally:
            proc.kill()
