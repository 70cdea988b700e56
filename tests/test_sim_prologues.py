"""The simulator's builds keep callers in stack walks: every function the fake libcudart/libnccl export
begins with ``push %rbp`` (after ``endbr64`` in the CET build), so a uprobe's user stack at its entry keeps
the caller (the kernel adds the return address only for such entries, docs/sim.md); the rank program's
step phases and fault injectors are real functions of their own name with a frame, and the no-frame-pointer
rank build really has none.

The machine code is read from the built files (a small ELF64 reader below: pyelftools is not a
dependency; agent/prologue.py names the first instruction).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rankecho.agent.prologue import classify
from rankecho.sim.faultsites import FAULT_SITES
from rankecho.sim.launcher import SIM_ROOT, build_libs

LIBS = [f"{d}/{lib}" for d in ("build", "build-endbr") for lib in ("libcudart.so.12", "libnccl.so.2")]
PHASES = ("run_step", "fetch_batch", "forward", "backward", "optimizer_step", "allocate_cache",
          "stall_dataloader", "spin_host_compute", "contend_cpu", "hang_rank", "crash_rank", "desync_rank",
          "stall_memcpy")
SHT_SYMTAB, SHT_DYNSYM, STT_FUNC = 2, 11, 2


def functions(path: Path, table: int) -> dict[str, bytes]:
    """Defined functions of an x86-64 ELF file's ``.dynsym`` (``table`` 11) or ``.symtab`` (2): name ->
    their first 16 bytes of code."""
    data = path.read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", f"{path}: not a little-endian ELF64 file"
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 0x28)[0], *struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out: dict[str, bytes] = {}
    for sec in sections:
        if sec[1] != table:
            continue
        strtab = sections[sec[6]]
        for off in range(sec[4], sec[4] + sec[5], 24):
            name, info, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", data, off)
            if info & 0xF != STT_FUNC or shndx == 0:
                continue
            text = sections[shndx]  # the section holding the code: address -> file offset
            start = text[4] + value - text[3]
            label = data[strtab[4] + name: data.index(b"\0", strtab[4] + name)].decode()
            out[label] = data[start: start + 16]
    return out


@pytest.fixture(scope="module")
def built() -> Path:
    build_libs()
    return SIM_ROOT


@pytest.mark.parametrize("lib", LIBS)
def test_every_exported_library_function_begins_with_push_rbp(built: Path, lib: str) -> None:
    exported = functions(built / lib, SHT_DYNSYM)
    assert len(exported) > 10 and ("cudaMalloc" in exported or "ncclAllReduce" in exported)
    endbr = lib.startswith("build-endbr/")
    wrong = {}
    for name, code in exported.items():
        site = classify(code)
        if site.first != "push %rbp" or site.skip != (4 if endbr else 0):
            wrong[name] = f"{'endbr64; ' if site.skip else ''}{site.first}"
    assert wrong == {}, f"{lib}: these entries lose their caller in a uprobe stack: {wrong}"


def test_rank_phases_are_framed_functions_of_their_own_name(built: Path) -> None:
    assert {func for func, _ in FAULT_SITES.values()} <= set(PHASES)  # the ground truth names real frames
    for program in ("simrank", "simrank-dlopen"):
        funcs = functions(built / "build" / program, SHT_SYMTAB)
        clones = sorted(n for n in funcs if n.split(".")[0] in PHASES and "." in n)
        assert clones == [], f"{program}: GCC cloned phases (a stack would show {clones})"
        for phase in PHASES:
            assert phase in funcs, f"{program} has no function {phase}"
            assert classify(funcs[phase]).first == "push %rbp", (program, phase, classify(funcs[phase]))


def test_the_nofp_rank_build_has_the_phases_but_no_frame_pointers(built: Path) -> None:
    funcs = functions(built / "build" / "simrank-nofp", SHT_SYMTAB)
    assert set(PHASES) <= set(funcs)
    # Without frame pointers %rbp is an ordinary register: phases that need no saved registers do not
    # push it first, and none sets it up as a frame (mov %rsp,%rbp right after the push).
    framed = [p for p in PHASES if funcs[p][:4] == b"\x55\x48\x89\xe5"]
    assert framed == [], framed
