"""A rank-like Python program for tests/test_agent_pyframes.py, run under each CPython version.

The main thread calls libc's ``nanosleep`` (``probed``) through ctypes from ``train_step -> forward ->
allocate_cache``, a loader thread from ``loader_loop -> fetch_batch -> read_shard``. Each chain reports,
once, the frames a probe on ``nanosleep`` must see: the calling line (found with ``inspect`` from the
``# PROBED`` marker) and the callers' current lines. Protocol on stdin/stdout (one JSON line each way):
prints ``{"pid": ...}``, waits for ``go N [NS [DEPTH [IDLE]]]``, runs N calls per thread (each sleeping
NS ns; the main chain below DEPTH ``nest`` frames; IDLE more threads waiting), prints the expected
frames and thread ids, then waits for ``exit`` so the test can still read the process's memory.
"""

import ctypes
import inspect
import json
import os
import sys
import threading
from collections.abc import Iterator
from types import FrameType

libc = ctypes.CDLL("libc.so.6")
ZERO = (ctypes.c_long * 2)(0, 0)
probed = libc.nanosleep
"""The C function the test probes (its cost measurement swaps in a cheaper one)."""
expected: dict[str, list[str]] = {}
tids: dict[str, int] = {}


def name(code: object, line: int) -> str:
    return f"{os.path.basename(code.co_filename)}:{code.co_name}:{line}"  # type: ignore[attr-defined]


def report(chain: str, fn: object) -> None:
    """What a probe in ``fn``'s ``# PROBED`` call sees: that line, then each caller at its current line."""
    if chain in expected:
        return
    lines, start = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    probed = start + next(i for i, text in enumerate(lines) if "# PROBED" in text)
    frames = [name(fn.__code__, probed)]  # type: ignore[attr-defined]
    caller: FrameType | None = sys._getframe(2)
    while caller is not None:
        frames.append(name(caller.f_code, caller.f_lineno))
        caller = caller.f_back
    expected[chain] = frames
    tids[chain] = threading.get_native_id()


def allocate_cache() -> None:
    report("main", allocate_cache)
    probed(ZERO, None)  # PROBED


def forward() -> None:
    allocate_cache()


def train_step() -> None:
    forward()


def read_shard() -> int:
    report("loader", read_shard)
    return int(probed(ZERO, None))  # PROBED


def fetch_batch() -> Iterator[int]:
    """A generator, resumed from C (``next``): on 3.12 that puts a shim frame below it."""
    while True:
        yield read_shard()


def loader_loop(n: int) -> None:
    batches = fetch_batch()
    for _ in range(n):
        next(batches)


def nest(depth: int) -> None:
    if depth:
        nest(depth - 1)
    else:
        train_step()


def main_loop(n: int, depth: int = 0) -> None:
    for _ in range(n):
        nest(depth)


def main() -> None:
    print(json.dumps({"pid": os.getpid()}), flush=True)
    words = sys.stdin.readline().split()
    n, ZERO[1] = int(words[1]), int(words[2]) if len(words) > 2 else 0  # calls, then ns each sleeps
    depth = int(words[3]) if len(words) > 3 else 0
    idle = threading.Event()  # IDLE more Python threads, started before the loader (so walked first)
    for _ in range(int(words[4]) if len(words) > 4 else 0):
        threading.Thread(target=idle.wait, daemon=True).start()
    loader = threading.Thread(target=loader_loop, args=(n,), name="loader")
    loader.start()
    main_loop(n, depth)
    loader.join()
    print(json.dumps({"expected": expected, "tids": tids}), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
