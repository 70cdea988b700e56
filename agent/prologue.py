"""What a uprobe costs at a function's first instruction, read from the library file.

A uprobe replaces the probed instruction with a breakpoint. After the BPF program runs, the kernel
must execute the original instruction: a few kinds it *emulates* in place (``push`` of a register,
``jmp``/``call``/``jcc`` with a relative target, ``nop``: measured ~0.4 us per hit here); every other
instruction it *single-steps* in an out-of-line slot, which takes a second trap (~11-15 us per hit on
a VM). Functions built with frame pointers begin with ``push %rbp`` (emulated); -O2 builds without
them often begin with ``sub $n,%rsp`` or a ``test``/``mov`` (single-stepped).

A leading ``endbr64`` (CET builds) is itself single-stepped, but it changes neither registers nor
stack, so the agent probes 4 bytes in. Nothing else can be stepped over: moving past an instruction
that adjusts the stack would misplace stack arguments and the return address.

    code = read_code("/usr/lib/libnccl.so.2", file_offset)
    site = classify(code)   # Prologue(skip=4, stepped=False, first="push %rbp")
"""

from __future__ import annotations

from dataclasses import dataclass

ENDBR64 = b"\xf3\x0f\x1e\xfa"
STEP_COST = "~11-15 us per call instead of ~0.5 us"
STEP_FIX = ("libraries built with -fno-omit-frame-pointer begin most functions with push %rbp, which the "
            "kernel emulates; the cost matters for functions called thousands of times a second")

_REGS = ("rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", *(f"r{i}" for i in range(8, 16)))
_REG_REG = {0x85: "test", 0x89: "mov"}  # with REX.W and a register-direct ModRM byte


@dataclass(frozen=True)
class Prologue:
    skip: int
    """Bytes the probe is moved past: 4 for a leading endbr64, else 0."""
    stepped: bool
    """True when the probed instruction is single-stepped (the slow path)."""
    first: str
    """The probed instruction, named when recognised (``push %rbp``, ``sub $0x28,%rsp``), else its bytes."""


def read_code(path: str, offset: int, n: int = 16) -> bytes:
    """``n`` bytes of ``path`` at file offset ``offset`` (short at end of file)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def _emulated(code: bytes) -> bool:
    """Instructions the x86-64 uprobe code runs without single-stepping (Linux >= 6.x)."""
    if not code:
        return False
    b0 = code[0]
    b1 = code[1] if len(code) > 1 else -1
    if 0x50 <= b0 <= 0x57 or (b0 == 0x41 and 0x50 <= b1 <= 0x57):  # push %reg
        return True
    if b0 in (0xE8, 0xE9, 0xEB) or 0x70 <= b0 <= 0x7F:  # call/jmp rel, jcc rel8
        return True
    if b0 == 0x0F and (0x80 <= b1 <= 0x8F or b1 == 0x1F):  # jcc rel32, multi-byte nop
        return True
    return b0 == 0x90 or (b0 == 0x66 and b1 in (0x90, 0x0F))  # nop, 66-prefixed nops


def _name(code: bytes) -> str:
    if code[:1] and 0x50 <= code[0] <= 0x57:
        return f"push %{_REGS[code[0] - 0x50]}"
    if code[:1] == b"\x41" and len(code) > 1 and 0x50 <= code[1] <= 0x57:
        return f"push %{_REGS[code[1] - 0x50 + 8]}"
    if len(code) > 2 and code[0] & 0xF8 == 0x48 and code[1] in _REG_REG and code[2] >> 6 == 3:
        rex, modrm = code[0], code[2]
        src, dst = (modrm >> 3 & 7) | (rex & 4) << 1, (modrm & 7) | (rex & 1) << 3
        return f"{_REG_REG[code[1]]} %{_REGS[src]},%{_REGS[dst]}"
    if code[:3] == b"\x48\x83\xec" and len(code) > 3:
        return f"sub ${code[3]:#x},%rsp"
    if code[:3] == b"\x48\x81\xec" and len(code) > 6:
        return f"sub ${int.from_bytes(code[3:7], 'little'):#x},%rsp"
    return "bytes " + code[:4].hex(" ")


def classify(code: bytes) -> Prologue:
    """Where to probe a function whose code starts with ``code``, and whether that hit is slow."""
    skip = len(ENDBR64) if code.startswith(ENDBR64) else 0
    rest = code[skip:]
    return Prologue(skip, not _emulated(rest), _name(rest))
