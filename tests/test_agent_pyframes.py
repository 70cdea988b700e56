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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_agent_helpers import requires_ebpf

from rankecho.agent import pyframes

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
BPF_ARRAY(walk_ns, __u64, 1024); /* histogram of the walk's own time, 25 ns buckets */
int on_call_timed(struct pt_regs *ctx) {
    __u64 id = bpf_get_current_pid_tgid();
    int zero = 0;
    struct rk_py_stack *s = scratch.lookup(&zero);
    if (!s)
        return 0;
    __u64 t0 = bpf_ktime_get_ns();
    rk_py_walk(id >> 32, (__u32)id, s);
    __u64 bucket = (bpf_ktime_get_ns() - t0) / 25;
    int b = bucket > 1023 ? 1023 : bucket;
    walk_ns.atomic_increment(b);
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
            decoder = pyframes.FrameDecoder()
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
@pytest.mark.parametrize("version", ["3.10.13", "3.11.7"])
def test_the_main_thread_is_found_behind_many_newer_threads(version: str) -> None:
    """Thread states are listed newest first, so the main thread's is the last of 22 here."""
    got = capture(interpreter(version), "go 5 0 0 20")
    for chain in ("main", "loader"):
        assert got.seen(chain) == [got.report["expected"][chain]] * 5, chain


@requires_ebpf
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

TINY = (".globl tiny_call\n.type tiny_call,@function\ntiny_call:\npush %rbp\nmov %rsp,%rbp\npop %rbp\nret\n"
        ".section .note.GNU-stack,\"\",@progbits\n")
"""A C-callable function whose first instruction the kernel emulates (``push %rbp``), so a hit costs the
uprobe and the program, not a single-step (libc's ``nanosleep`` begins with ``sub $8,%rsp``)."""

TIMED = """
import ctypes, sys, time
sys.path.insert(0, {dir!r})
import pyframes_prog as p
p.report = lambda chain, fn: None
p.probed = ctypes.CDLL({lib!r}).tiny_call
def nest(k):
    return p.train_step() if k == 0 else nest(k - 1)
def loop(n):
    for _ in range(n):
        nest({depth})
print("ready", flush=True)
while sys.stdin.readline() == "round\\n":
    runs = []
    for _ in range(7):
        t = time.perf_counter_ns()
        loop(2000)
        runs.append((time.perf_counter_ns() - t) / 2000)
    print(sorted(runs)[3], flush=True)
"""
"""Prints the median ns per call of 7 runs of 2,000 calls each time it reads ``round``."""

CONFIGS = (None, "on_call_empty", "on_call_walk", "on_call_timed")


def _rounds(python: str, lib: str, depth: int, bpf: Any, rounds: int) -> dict[str | None, list[float]]:
    """ns per call under each configuration (unprobed, empty uprobe, walk, walk timed in BPF), taken in turn
    in one process ``rounds`` times, so load that comes and goes hits all alike."""
    text = TIMED.format(dir=str(PROG.parent), lib=lib, depth=depth)
    proc = subprocess.Popen([python, "-c", text], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out: dict[str | None, list[float]] = {fn: [] for fn in CONFIGS}
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "ready\n"
        found = pyframes.detect(proc.pid)
        assert found is not None
        bpf[b"py_targets"][ctypes.c_uint32(proc.pid)] = found.target()
        for _ in range(rounds):
            for fn in CONFIGS:
                if fn is not None:
                    bpf.attach_uprobe(name=lib.encode(), sym=b"tiny_call", fn_name=fn.encode(), pid=proc.pid)
                proc.stdin.write("round\n")
                proc.stdin.flush()
                out[fn].append(float(proc.stdout.readline()))
                if fn is not None:
                    bpf.detach_uprobe(name=lib.encode(), sym=b"tiny_call", pid=proc.pid)
        return out
    finally:
        proc.kill()
        proc.wait()


def _quantile(hist: list[int], q: float) -> int:
    """The upper edge (ns) of the 25 ns bucket holding quantile ``q`` of a histogram."""
    total, seen = sum(hist), 0
    for i, count in enumerate(hist):
        seen += count
        if seen >= q * total:
            return (i + 1) * 25
    return len(hist) * 25


def measure(versions: list[str], rounds: int = 15) -> None:
    """Print, per version and depth, the median over rounds of: ns per call unprobed, what an empty
    uprobe adds, and what the walk adds over the empty uprobe (with the rounds' quartiles)."""
    import statistics
    import tempfile

    bpf = load_bpf()
    with tempfile.TemporaryDirectory() as tmp:
        lib = str(Path(tmp) / "libtiny.so")
        (Path(tmp) / "tiny.s").write_text(TINY)
        subprocess.run(["gcc", "-shared", "-o", lib, str(Path(tmp) / "tiny.s")], check=True)
        try:
            for version, depth in ((v, d) for v in versions for d in (0, 18)):
                bpf[b"walk_ns"].clear()
                got = _rounds(str(python_path(version)), lib, depth, bpf, rounds)
                none, empty, walk, _ = (got[fn] for fn in CONFIGS)
                hist = [int(bpf[b"walk_ns"][ctypes.c_int(i)].value) for i in range(1024)]
                probe = [e - n for n, e in zip(none, empty, strict=True)]
                added = sorted(w - e for e, w in zip(empty, walk, strict=True))
                q = statistics.quantiles(added, n=4)
                med = statistics.median
                print(f"{version}, {depth + 6} frames: {med(none):.0f} ns/call unprobed, empty uprobe "
                      f"+{med(probe):.0f} ns, walk +{med(added):.0f} ns over it (quartiles {q[0]:.0f}.."
                      f"{q[2]:.0f}); in BPF the walk took {_quantile(hist, 0.5)} ns median, "
                      f"{_quantile(hist, 0.9)} ns p90 over {sum(hist)} hits", flush=True)
        finally:
            bpf.cleanup()


if __name__ == "__main__":
    measure(sys.argv[1:] or ["3.10.13", "3.11.7", "3.12.1", "system"])
