"""Stack naming, deduplication and the per-class stacks of the pre-call breakdown, on synthetic records.

The symbol lookup is a table here (the real one, bcc in a helper process, is exercised by
tests/test_agent_stacks.py and the helper test below, which needs root for bcc)."""

from __future__ import annotations

import os
import struct

from test_agent_helpers import requires_ebpf
from test_agent_tracker import MS, Rank

from rankecho.agent.events import (
    FN,
    HEADER,
    KIND,
    PY_STACK_SIZE,
    SCAN_KEEP,
    STACK_DEPTH,
    STACK_SIZE,
    STACK_SOURCE,
    StackRecord,
    decode,
)
from rankecho.agent.probes import HEADER_FILE
from rankecho.agent.stacks import StackKeeper, addresses, merge_python, normalise, truncated
from rankecho.agent.symbols import SymbolClient
from rankecho.agent.window import WindowKeeper
from rankecho.shared import contract as c
from rankecho.shared.stacks import split_frames, stack_id

SYMS = {0x1000: "cudaMalloc", 0x1fff: "allocate_cache.constprop.0", 0x2fff: "run_step.isra.0",
        0x3fff: "main", 0x4fff: "__libc_start_call_main"}


def table(pid: int, start: int, addrs: list[int]) -> list[str | None]:
    return [SYMS.get(a) for a in addrs]


def rec(ips: tuple[int, ...], ret: int = 0, ts: int = 5, source: STACK_SOURCE = STACK_SOURCE.CALL,
        fn: FN = FN.MALLOC, pid: int = 100) -> StackRecord:  # fmt: skip
    return StackRecord(pid, pid, ts, source, fn, ips, ret)


def test_clone_suffixes_are_dropped() -> None:
    assert normalise("run_step.constprop.0") == "run_step"
    assert normalise("f.part.1.isra.0") == "f"
    assert normalise("g.cold") == "g"
    assert normalise("h.isra.3.cold") == "h"
    assert normalise("cudaMalloc") == "cudaMalloc"


def test_the_entry_caller_is_inserted_only_when_the_walk_skipped_it() -> None:
    # cudaMalloc without push %rbp: the walk gave its IP then run_step's caller; [SP] held allocate_cache's.
    assert addresses(rec((0x1000, 0x3000), ret=0x2000)) == [0x1000, 0x2000, 0x3000]
    # push %rbp entry: the kernel already added the caller.
    assert addresses(rec((0x1000, 0x2000, 0x3000), ret=0x2000)) == [0x1000, 0x2000, 0x3000]
    assert addresses(rec((0x1000, 0x3000))) == [0x1000, 0x3000]  # not at an entry: nothing to insert


def test_one_frame_and_full_depth_walks_are_truncated() -> None:
    assert truncated(rec((0x1000,)))
    assert truncated(rec(tuple(range(1, STACK_DEPTH + 1))))
    assert not truncated(rec((0x1000, 0x2000, 0x3000)))


def test_frames_are_named_by_content_and_shipped_once() -> None:
    released: list[int] = []
    keeper = StackKeeper(table, released.append)
    first = keeper.stack(rec((0x1000, 0x3000, 0x4000, 0x5000), ret=0x2000), start=7)
    assert first is not None
    assert first.frames == ("cudaMalloc", "allocate_cache", "run_step", "main", "__libc_start_call_main")
    assert first.id == stack_id(first.frames) and first.new and not first.truncated
    again = keeper.stack(rec((0x1000, 0x3000, 0x4000, 0x5000), ret=0x2000, ts=9), start=7)
    assert again is not None and again.id == first.id and not again.new
    # Another process with the same frames: the same id (content, not addresses), not shipped again.
    other = keeper.stack(rec((0x1000, 0x3000, 0x4000, 0x5000), ret=0x2000, pid=200), start=3)
    assert other is not None and other.id == first.id and not other.new
    garbage = keeper.stack(rec((0x1000, 0x9000, 0x3000)), start=7)  # a "caller" no symbol covers
    assert garbage is not None and garbage.frames == ("cudaMalloc",) and garbage.truncated
    unknown = keeper.stack(rec((0x9000,)), start=7)
    assert unknown is not None and unknown.frames == ("[unknown]",) and unknown.truncated and unknown.new
    keeper.forget(100)
    assert released == [100]
    # A failed lookup (the symbol helper down) names nothing and caches nothing.
    down = StackKeeper(lambda pid, start, addrs: None)
    assert down.stack(rec((0x1000, 0x3000)), start=7) is None
    assert down.stack(rec((0x1000, 0x3000)), start=7) is None


def test_a_stack_record_round_trips_and_its_depth_matches_the_c_header() -> None:
    assert f"#define RK_STACK_DEPTH {STACK_DEPTH}" in HEADER_FILE.read_text()
    head = HEADER.pack(11, 0, 3, 0x2000, 0, 0, 100, 101, KIND.STACK, FN.MALLOC, STACK_SOURCE.CALL, 0)
    py = struct.pack("<IHH", 2, 0, 0) + bytes(PY_STACK_SIZE - 8)  # the Python walk's part, at the end
    scanned = struct.pack("<2Q", 0x3000, 0x3500) + bytes(8 * (SCAN_KEEP - 2))
    raw = head + struct.pack("<3Q", 0x1000, 0x3000, 0x4000) + bytes(8 * (STACK_DEPTH - 3)) + scanned + py
    assert len(raw) == STACK_SIZE
    ips = (0x1000, 0x3000, 0x4000)
    expected = StackRecord(100, 101, 11, STACK_SOURCE.CALL, FN.MALLOC, ips, 0x2000, (0x3000, 0x3500), py)
    assert decode(raw) == expected


def test_return_addresses_found_above_sp_go_between_the_walk_frames_they_lie_between() -> None:
    """Sampled in the vDSO called from libc's clock_gettime called from spin_host_compute: the walk gives
    vdso, libc, before, main (spin_host_compute kept %rbp for libc and left no link); the scan above SP
    found libc's return, spin_host_compute's, before's: spin_host_compute goes between libc and before."""
    vdso, libc, spin, before, main = 0x10, 0x20, 0x30, 0x40, 0x50
    walk, scan = (vdso, libc, before, main), (libc, spin, before)
    sampled = StackRecord(1, 1, 0, STACK_SOURCE.SAMPLE, FN.NONE, walk, 0, scan)
    assert addresses(sampled) == [vdso, libc, spin, before, main]
    write = StackRecord(1, 1, 0, STACK_SOURCE.OFFCPU, FN.NONE, (0x11, before, main), 0, (spin,))
    assert addresses(write) == [0x11, spin, before, main]  # a syscall wrapper: the scan ends early
    past = StackRecord(1, 1, 0, STACK_SOURCE.OFFCPU, FN.NONE, (0x11, before), 0, (before, 0x99))
    assert addresses(past) == [0x11, before]  # beyond the walk's last frame: nothing to place it by


def test_an_unnamed_word_from_the_scan_is_dropped_but_an_unnamed_walk_frame_cuts() -> None:
    """A stale return address in a frame's locals (unnamed: no symbol covers it) found by the scan
    between backward and run_step must not cut the walk's own run_step and main (CI once saw a spin
    sample end at backward); an unnamed frame the walk itself gave still ends the stack there."""
    names = {0x10: None, 0x2f: "clock_gettime", 0x3f: "spin_host_compute", 0x4f: "backward",
             0x5f: "run_step", 0x6f: "main", 0x77: None}
    keeper = StackKeeper(lambda pid, start, addrs: [names.get(a) for a in addrs])
    vdso, libc, spin, back, step, main, stale = 0x10, 0x30, 0x40, 0x50, 0x60, 0x70, 0x78
    sampled = StackRecord(1, 1, 0, STACK_SOURCE.SAMPLE, FN.NONE, (vdso, libc, back, step, main), 0,
                          (libc, spin, back, stale))
    info = keeper.stack(sampled, 1)
    assert info is not None and not info.truncated
    assert info.frames == ("[unknown]", "clock_gettime", "spin_host_compute", "backward", "run_step", "main")
    garbage = StackRecord(1, 2, 0, STACK_SOURCE.SAMPLE, FN.NONE, (vdso, libc, back, stale, main), 0, ())
    info = keeper.stack(garbage, 1)
    assert info is not None and info.truncated
    assert info.frames == ("[unknown]", "clock_gettime", "backward")


def test_python_frames_take_over_where_the_interpreter_begins() -> None:
    native = ["cudaMalloc", "ffi_call_unix64", "[unknown]", "_PyEval_EvalFrameDefault"]
    python = ["pyrank.py:allocate_cache:87", "pyrank.py:run_step:120", "pyrank.py:main:200"]
    assert merge_python(native, python) == ["cudaMalloc", *python]
    assert merge_python(["[unknown]", "[unknown]"], python) == ["[unknown]", *python]  # innermost stays
    assert merge_python(native, []) == native  # no Python walk: the native stack as it is
    c_program = ["cudaMalloc", "allocate_cache", "run_step", "main"]
    assert merge_python(c_program, python) == [*c_program, *python]


def test_ids_land_on_points_and_the_breakdown_names_each_class_stack() -> None:
    keeper = StackKeeper(table)
    r = Rank(0, 2, stacks=keeper, raw_interval_ns=0)
    r.init()
    r.step(10 * MS, 12 * MS)
    # A long cudaMalloc: its entry stack precedes the call record.
    r.t.handle(rec((0x1000, 0x3000, 0x4000), ret=0x2000, ts=20 * MS))
    r.call(FN.MALLOC, 20 * MS, 50 * MS, a2=1 << 20)
    # Two on-CPU samples of the main thread in the window, one outside it.
    for ts in (55 * MS, 60 * MS, 500 * MS):
        r.t.handle(rec((0x2fff, 0x4000), ts=ts, source=STACK_SOURCE.SAMPLE, fn=FN.NONE))
    r.t.handle(rec((0x1000, 0x3000, 0x4000), ts=70 * MS, fn=FN.ALL_REDUCE))
    r.step(70 * MS, 72 * MS)
    points = [p for _, p in r.points]
    stacks = {p.attributes[c.STACK_ID]: split_frames(str(p.attributes[c.STACK_FRAMES])) for p in points
              if p.metric_name == c.M_STACK}
    assert len(stacks) == 3  # the malloc stack, the sampled stack, the collective's
    malloc = next(p for p in points if p.metric_name == c.M_CUDA_MALLOC)
    assert stacks[str(malloc.attributes[c.STACK_ID])] == ["cudaMalloc", "allocate_cache", "run_step", "main"]
    coll = [p for p in points if p.metric_name == c.M_COLLECTIVE][-1]
    assert coll.attributes[f"{c.PRE_PREFIX}allocator{c.PRE_STACK_SUFFIX}"] == malloc.attributes[c.STACK_ID]
    assert stacks[str(coll.attributes[c.STACK_ID])] == ["cudaMalloc", "run_step", "main"]  # the table's names
    assert stacks[str(coll.attributes[c.PRE_ONCPU_STACK])] == ["run_step", "main"]
    assert coll.attributes[c.PRE_ONCPU_SAMPLES] == 2


def test_the_class_stack_is_the_one_with_most_time() -> None:
    w = WindowKeeper(0)
    w.call(1, 1, "malloc", 0, 5 * MS, lambda: None, "short")
    w.call(1, 1, "malloc", 6 * MS, 8 * MS, lambda: None, "short")
    w.call(1, 1, "free", 10 * MS, 18 * MS, lambda: None, "long")
    w.offcpu(1, 1, 20 * MS, 30 * MS, True, None, "", 0, lambda: None, "sleep")
    b = w.close(1, 1, 0, 40 * MS, False)
    assert b.stacks == {"allocator": "long", "sleeping": "sleep"}
    attrs = b.attributes()
    assert attrs[f"{c.PRE_PREFIX}allocator_stack"] == "long"
    assert c.PRE_ONCPU_STACK not in attrs


@requires_ebpf
def test_the_symbol_helper_names_this_process_functions() -> None:
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    addr = ctypes.cast(libc.getpid, ctypes.c_void_p).value
    assert addr is not None
    client = SymbolClient()
    try:
        names = client.resolve(os.getpid(), 1, [addr, 8])
        assert names[0] is not None and "getpid" in names[0] and names[1] is None
        client.forget(os.getpid())
        assert client.resolve(os.getpid(), 2, [addr])[0] == names[0]  # a fresh cache after forget
    finally:
        client.close()
    assert client.restarts == 0




def test_no_stack_per_kernel_launch_and_the_flags_reach_the_program() -> None:
    from rankecho.agent.probes import ProbeConfig, cflags, program_text
    from rankecho.agent.settings import from_args
    from rankecho.agent.traced import stack_policy
    from rankecho.cli import build_parser

    assert stack_policy(FN.LAUNCH_KERNEL) == 0 and stack_policy(FN.GROUP_START) == 0
    assert stack_policy(FN.ALL_REDUCE) == 2
    assert stack_policy(FN.MALLOC) == 1 and stack_policy(FN.EVENT_SYNC) == 1
    launch = program_text().split("int enter_cudaLaunchKernel", 1)[1].split("\n}\n", 1)[0]
    assert "take_stack" not in launch
    s = from_args(build_parser().parse_args(["agent", "--sample-hz", "99"]), {})
    assert s.stacks and s.sample_hz == 99 and "-DSTACKS" in cflags(s.probe_config)
    off = from_args(build_parser().parse_args(["agent", "--no-stacks"]), {})
    assert not off.stacks and off.sample_hz == 0 and "-DSTACKS" not in cflags(off.probe_config)
    assert "-DSTACKS" not in cflags(ProbeConfig(stacks=False))
