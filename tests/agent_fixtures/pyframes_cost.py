"""The cost of a Python-frames capture per hit, for docs/python-frames.md (not a test; needs root and bcc).

    python tests/agent_fixtures/pyframes_cost.py [version ...]     # pyenv versions or "system"

A Python chain (tests/agent_fixtures/pyframes_prog.py's ``train_step -> forward -> allocate_cache``, under
0 or 18 extra ``nest`` frames) calls a C function whose first instruction the kernel emulates. One process
takes turns: unprobed, an empty uprobe, the walk into a per-CPU buffer, and the walk timed inside BPF.
"""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_agent_pyframes import BPF_TEXT, PROG, load_bpf, python_path

from rankecho.agent import pyframes

COST_TEXT = BPF_TEXT + """
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
    bpf = load_bpf(COST_TEXT)
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
