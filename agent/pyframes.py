"""Python frames of CPython 3.10-3.12 processes: what the BPF walk needs, and what its output means.

The BPF side (``bpf/pyframes.h``) records, per frame, a code object's address and the byte offset of the
instruction being run; it needs per process the address of ``_PyRuntime`` and the version's struct
offsets (:func:`detect` -> :meth:`PyProcess.target`, the ``py_targets`` value). This module turns those
pairs into ``<file basename>:<function>:<line>`` by reading the code object from ``/proc/PID/mem``
(``co_name``, ``co_filename``, ``co_firstlineno``, ``co_linetable``). Other versions (3.13+, 3.9-) are
detected and get no frames. Nothing here keeps state: the agent's memory of its processes (which run
CPython, the names already decoded: a training loop runs the same few code objects forever) is
agent/pyframe_cache.py. See docs/python-frames.md.

Usage::

    proc = detect(pid)                       # None: not CPython; proc.supported False: no frames
    bpf["py_targets"][ctypes.c_uint32(pid)] = proc.target()
    code = read_code(pid, LAYOUTS[proc.version], frame.code)    # frame: an RkPyFrame rk_py_walk filled
    name = frame_name(proc.version, code, frame.offset)
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

HEADER_FILE = Path(__file__).parent / "bpf" / "pyframes.h"
MAX_FRAMES = 24
"""``RK_PY_MAX_FRAMES`` of the header (compile with ``-DRK_PY_MAX_FRAMES=`` to change both)."""
NONE = 0xFFFF
FRAME_SHIM = 1
STATUS_OK, STATUS_NO_TARGET, STATUS_NO_THREAD, STATUS_READ_FAIL = 0, 1, 2, 3
PTHREAD_TID = 0x2D0
"""glibc 2.36 x86-64 ``struct pthread.tid`` (3.10 only; :func:`detect` re-measures it per process)."""
UNKNOWN_LINE = 0
"""The line written for an instruction the table gives no line (or a code object that cannot be read)."""


@dataclass(frozen=True)
class Layout:
    """One CPython version's offsets (bytes, x86-64 release builds); ``NONE`` where it has no such field."""

    interp_head: int
    tstate_head: int
    ts_native_tid: int
    ts_thread_id: int
    ts_frame: int
    cframe_current: int
    f_code: int
    f_back: int
    f_instr: int
    f_owner: int
    code_adaptive: int
    co_filename: int
    co_name: int
    co_firstlineno: int
    co_linetable: int
    str_ascii: int  # sizeof(PyASCIIObject): where a compact ASCII string's bytes start
    str_compact: int  # sizeof(PyCompactUnicodeObject): where other compact strings' data start
    frame_size: int  # bytes the BPF walk reads per frame: through the last field it uses
    ts_next: int = 8


LAYOUTS: dict[tuple[int, int], Layout] = {
    (3, 10): Layout(32, 8, NONE, 176, 24, NONE, 32, 24, 96, NONE, NONE, 104, 112, 40, 120, 48, 72, 100),
    (3, 11): Layout(40, 16, 160, 152, 56, 8, 32, 48, 56, NONE, 184, 112, 120, 72, 136, 48, 72, 64),
    (3, 12): Layout(40, 72, 144, 136, 56, 0, 0, 8, 56, 70, 192, 112, 120, 68, 136, 40, 56, 72),
}
"""Measured with ``offsetof`` against 3.10.13, 3.11.2/3.11.7 and 3.12.1; patch releases keep these."""


class RkPyTarget(ctypes.Structure):
    """``struct rk_py_target``."""

    _fields_ = [("runtime", ctypes.c_uint64), ("version", ctypes.c_uint16)] + [
        (name, ctypes.c_uint16) for name in (
            "interp_head", "tstate_head", "ts_next", "ts_native_tid", "ts_thread_id", "pthread_tid",
            "ts_frame", "cframe_current", "f_code", "f_back", "f_instr", "f_owner", "code_adaptive",
            "frame_size", "pad")
    ]


class RkPyFrame(ctypes.Structure):
    """``struct rk_py_frame``."""

    _fields_ = [("code", ctypes.c_uint64), ("offset", ctypes.c_int32), ("flags", ctypes.c_uint32)]


class RkPyStack(ctypes.Structure):
    """``struct rk_py_stack``."""

    _fields_ = [("n", ctypes.c_uint32), ("status", ctypes.c_uint16), ("truncated", ctypes.c_uint16),
                ("frames", RkPyFrame * MAX_FRAMES)]


@dataclass(frozen=True)
class PyProcess:
    """A CPython process: its version, where ``_PyRuntime`` is, and the file that defines it."""

    pid: int
    version: tuple[int, int]
    runtime: int
    path: str
    pthread_tid: int = PTHREAD_TID

    @property
    def supported(self) -> bool:
        return self.version in LAYOUTS

    def target(self) -> RkPyTarget:
        """The ``py_targets`` value for this process (raises KeyError for an unsupported version)."""
        lay = LAYOUTS[self.version]
        offsets = {name: getattr(lay, name) for name, _ in RkPyTarget._fields_ if hasattr(lay, name)}
        return RkPyTarget(runtime=self.runtime, version=self.version[0] * 100 + self.version[1],
                          pthread_tid=self.pthread_tid, **offsets)


# --- finding _PyRuntime ------------------------------------------------------------------------------

_VERSION_RE = re.compile(r"(?:libpython|/python)(\d)\.(\d+)[^/]*$")
ET_EXEC = 2
PT_LOAD = 1
SHT_DYNSYM = 11


def elf_symbol(path: str, name: str) -> tuple[int, bool, int] | None:
    """``(value, is_pie_or_shared, first PT_LOAD vaddr)`` of a defined ``.dynsym`` symbol of a 64-bit
    little-endian ELF file, or None. Read from the file (x86-64 only, like the offsets)."""
    with open(path, "rb") as f:
        def at(offset: int, size: int) -> bytes:
            f.seek(offset)
            return f.read(size)

        head = at(0, 64)
        if head[:6] != b"\x7fELF\x02\x01":
            return None
        (e_type,), (phoff, shoff) = struct.unpack_from("<H", head, 16), struct.unpack_from("<QQ", head, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
        phdrs, shdrs = at(phoff, phentsize * phnum), at(shoff, shentsize * shnum)
        loads = [struct.unpack_from("<IIQQ", phdrs, i * phentsize) for i in range(phnum)]
        first_vaddr = min((p[3] for p in loads if p[0] == PT_LOAD), default=0) & ~0xFFF
        sections = [struct.unpack_from("<IIQQQQIIQQ", shdrs, i * shentsize) for i in range(shnum)]
        want = name.encode() + b"\0"
        for sh in (sh for sh in sections if sh[1] == SHT_DYNSYM):
            strings, table = at(sections[sh[6]][4], sections[sh[6]][5]), at(sh[4], sh[5])
            for off in range(0, len(table) - 23, 24):
                st_name, _, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", table, off)
                if shndx and strings[st_name:st_name + len(want)] == want:
                    return value, e_type != ET_EXEC, first_vaddr
    return None


def _mappings(pid: int) -> list[tuple[int, int, int, str]]:
    """``(start, end, file offset, path)`` of the file-backed mappings of a process."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                lo, hi = parts[0].split("-")
                out.append((int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5].rstrip("\n")))
    return out


def detect(pid: int) -> PyProcess | None:
    """The CPython interpreter running in ``pid`` (libpython or the executable that defines
    ``_PyRuntime``), or None when it runs none or cannot be read (gone, no permission)."""
    try:
        maps = _mappings(pid)
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    candidates = [*sorted({m[3] for m in maps if "libpython" in m[3]}), exe]
    for path in candidates:
        match = _VERSION_RE.search(path.removesuffix(" (deleted)"))
        if not match:
            continue
        starts = [m for m in maps if m[3] == path]
        if not starts:
            continue
        base = min(starts)
        sym = None
        for file in (f"/proc/{pid}/map_files/{base[0]:x}-{base[1]:x}", f"/proc/{pid}/root{path}"):
            try:
                sym = elf_symbol(file, "_PyRuntime")
                break
            except OSError:
                continue
        if sym is None:
            continue
        value, relocated, first_vaddr = sym
        runtime = value + (base[0] - base[2] - first_vaddr if relocated else 0)
        proc = PyProcess(pid, (int(match[1]), int(match[2])), runtime, path)
        if proc.version == (3, 10):
            proc = PyProcess(pid, proc.version, runtime, path, _pthread_tid_offset(proc))
        return proc
    return None


def _pthread_tid_offset(proc: PyProcess) -> int:
    """Where glibc keeps the tid in ``struct pthread``: found in the main thread's (tid == pid), oldest
    in the thread list; the glibc 2.36 value when the interpreter is not up yet or it is not found."""
    lay = LAYOUTS[proc.version]
    try:
        with open(f"/proc/{proc.pid}/mem", "rb", buffering=0) as mem:
            fd = mem.fileno()
            interp = _u64(fd, proc.runtime + lay.interp_head)
            ts, main = _u64(fd, interp + lay.tstate_head), 0
            for _ in range(64):
                if not ts:
                    break
                main, ts = ts, _u64(fd, ts + lay.ts_next)
            pthread = _u64(fd, main + lay.ts_thread_id) if main else 0
            if not pthread:
                return PTHREAD_TID
            block = os.pread(mem.fileno(), 0x800, pthread)
    except OSError:
        return PTHREAD_TID
    want = struct.pack("<I", proc.pid)
    if block[PTHREAD_TID:PTHREAD_TID + 4] == want:
        return PTHREAD_TID
    hits = [off for off in range(0x100, len(block) - 3, 4) if block[off:off + 4] == want]
    return hits[0] if hits else PTHREAD_TID


def _read(fd: int, addr: int, size: int) -> bytes:
    data = os.pread(fd, size, addr)
    if len(data) != size:
        raise OSError(f"short read of {size} bytes at {addr:#x}")
    return data


def _u64(fd: int, addr: int) -> int:
    return int.from_bytes(_read(fd, addr, 8), "little")


# --- decoding frames ---------------------------------------------------------------------------------

MAX_STRING = 1 << 16
MAX_TABLE = 1 << 20


@dataclass(frozen=True)
class CodeInfo:
    """What a code object contributes to a frame name."""

    filename: str  # basename of co_filename
    name: str  # co_name
    firstlineno: int
    linetable: bytes  # co_linetable as stored (PEP 626 table on 3.10, location table on 3.11+)


def line_310(table: bytes, firstlineno: int, offset: int) -> int | None:
    """Line of the instruction at byte ``offset`` from a 3.10 ``co_linetable`` (PEP 626: pairs of
    unsigned byte-length, signed line delta; -128 = no line), as ``PyCode_Addr2Line`` walks it."""
    line, end = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        start, end = end, end + table[i]
        delta = table[i + 1] - 256 if table[i + 1] > 127 else table[i + 1]
        current = None if delta == -128 else line + delta
        if delta != -128:
            line += delta
        if start <= offset < end:
            return current
    return None


def _varint(table: bytes, i: int) -> tuple[int, int]:
    value, shift = table[i] & 63, 6
    while table[i] & 64:
        i += 1
        value |= (table[i] & 63) << shift
        shift += 6
    return value, i + 1


def line_311(table: bytes, firstlineno: int, offset: int) -> int | None:
    """Line of the instruction at byte ``offset`` from a 3.11+ location table (``Objects/locations.md``:
    entries of 1-8 code units, each with a line delta in one of five forms)."""
    unit, line, at, i = offset // 2, firstlineno, 0, 0
    while i < len(table):
        head = table[i]
        code, length = (head >> 3) & 15, (head & 7) + 1
        i += 1
        current: int | None = line
        if code == 15:
            current = None
        elif code == 14 or code == 13:
            raw, i = _varint(table, i)
            line += -(raw >> 1) if raw & 1 else raw >> 1
            current = line
            if code == 14:
                for _ in range(3):
                    _, i = _varint(table, i)
        elif code >= 10:
            line += code - 10
            current = line
            i += 2
        else:
            i += 1
        if at <= unit < at + length:
            return current
        at += length
    return None


def _read_str(fd: int, lay: Layout, addr: int) -> str:
    """A compact str object's text, control characters replaced (frames are joined with newlines)."""
    return _CONTROL.sub("?", _read_raw_str(fd, lay, addr))


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _read_raw_str(fd: int, lay: Layout, addr: int) -> str:
    head = _read(fd, addr, 40)
    length, = struct.unpack_from("<q", head, 16)
    state, = struct.unpack_from("<I", head, 32)
    kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not compact or not 0 <= length <= MAX_STRING or kind not in (1, 2, 4):
        return "?"
    if ascii_:
        return _read(fd, addr + lay.str_ascii, length).decode("ascii", "replace")
    data = _read(fd, addr + lay.str_compact, length * kind)
    return data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], "replace")


def read_code(pid: int, lay: Layout, addr: int) -> CodeInfo:
    """The parts of the code object at ``addr`` that name a frame, read from ``/proc/PID/mem``."""
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        fd = mem.fileno()
        code = _read(fd, addr, lay.co_linetable + 8)
        first, = struct.unpack_from("<i", code, lay.co_firstlineno)
        fields = (("file", lay.co_filename), ("name", lay.co_name), ("table", lay.co_linetable))
        ptr = {name: struct.unpack_from("<Q", code, off)[0] for name, off in fields}
        size, = struct.unpack_from("<q", _read(fd, ptr["table"], 24), 16)
        table = _read(fd, ptr["table"] + 32, size) if 0 < size <= MAX_TABLE else b""
        filename = _read_str(fd, lay, ptr["file"])
        return CodeInfo(filename.rsplit("/", 1)[-1], _read_str(fd, lay, ptr["name"]), first, table)


def frame_name(version: tuple[int, int], code: CodeInfo, offset: int) -> str:
    """``<file basename>:<function>:<line>`` of the frame running ``code`` at byte ``offset``."""
    lookup = line_310 if version == (3, 10) else line_311
    line = code.firstlineno if offset < 0 else lookup(code.linetable, code.firstlineno, offset)
    return f"{code.filename}:{code.name}:{UNKNOWN_LINE if line is None else line}"


def header_text() -> str:
    """The BPF fragment, for programs that inline their includes (as agent/probes.py does)."""
    return HEADER_FILE.read_text()
