"""Where each injected fault runs, as a frame of a call stack: the ground truth's answer to "which function
was the late rank in". The C rank (sim/src/simrank.c, simrank_faults.c) and the Python rank (sim/pyrank.py)
give every fault kind its own function of the same name; for the Python rank the frame also carries the
file and the line of the call where the time goes (``pyrank.py:allocate_cache:NN``), found here in
pyrank.py's source so it stays true when the file changes. Frames are written as shared/stacks.py writes
them: a native frame is its function name, a Python frame ``<file basename>:<function>:<line>``.

    fault_frame("alloc_stall", "c")       # "allocate_cache"
    fault_frame("alloc_stall", "python")  # "pyrank.py:allocate_cache:88"
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PYRANK = Path(__file__).resolve().parent / "pyrank.py"
FAULT_SITES = {
    "host_compute": ("spin_host_compute", "spin_until"),
    "dataloader_stall": ("stall_dataloader", "wait_off_cpu"),
    "cpu_contention": ("contend_cpu", "spin_until"),
    "slow_gpu": ("forward", "cudaStreamSynchronize"),  # the loss sync waits for the slowed kernels
    "alloc_stall": ("allocate_cache", "cudaMalloc"),
    "memcpy_stall": ("stall_memcpy", "cudaMemcpy"),
    "hang": ("hang_rank", "wait_off_cpu"),
    "crash": ("crash_rank", "_exit"),
    "desync": ("desync_rank", "ncclAllReduce"),
}
"""fault kind -> (the function it runs in, in both rank programs; the call in it where the time goes)."""


def fault_function(kind: str) -> str:
    return FAULT_SITES[kind][0]


@cache
def python_frames(source: Path = PYRANK) -> dict[str, str]:
    """fault kind -> the Python rank's frame for it: the first line in the function that calls the site."""
    funcs = {n.name: n for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef)}
    out = {}
    for kind, (func, call) in FAULT_SITES.items():
        lines = [n.lineno for n in ast.walk(funcs[func]) if isinstance(n, ast.Call) and _callee(n) == call]
        if not lines:
            raise ValueError(f"{source.name}: {func} has no call to {call} (update sim/faultsites.py)")
        out[kind] = f"{source.name}:{func}:{min(lines)}"
    return out


def fault_frame(kind: str, program: str) -> str:
    """The frame a stack taken while ``kind`` delays the rank holds: ``program`` "c" or "python"."""
    return python_frames()[kind] if program == "python" else fault_function(kind)


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
