"""Finding the processes to trace: every process that maps libnccl.so* or libcudart.so*.

Reads ``<proc_root>/<pid>/maps`` (``proc_root`` is injectable for tests). Paths inside containers are
reached through ``<proc_root>/<pid>/root``, and a library file is identified by (device, inode) so the
agent attaches once per file however many processes or mount namespaces map it. A library named by
hand (--nccl-lib, --cuda-lib) is checked with :func:`library_problem`. Usage::

    libs, procs = scan("/proc")              # {LibKey: LibFile}, {pid: {LibKey, ...}}
    new = [f for k, f in libs.items() if k not in attached]
"""

from __future__ import annotations

import os
import struct
from collections.abc import Collection
from dataclasses import dataclass

from rankecho.agent.traced import TRACED

LIB_PREFIXES = {"libnccl.so": "nccl", "libcudart.so": "cuda"}
LIB_WHAT = {"nccl": "the path of an NCCL library (libnccl.so*)",
            "cuda": "the path of the CUDA runtime (libcudart.so*)"}

LibKey = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True)
class LibFile:
    kind: str  # "nccl" or "cuda"
    path: str
    """A path this agent can open and attach to (through /proc/PID/root for other mount namespaces)."""
    key: LibKey


def lib_kind(path: str) -> str | None:
    name = os.path.basename(path)
    for prefix, kind in LIB_PREFIXES.items():
        if name.startswith(prefix):
            return kind
    return None


def file_key(path: str) -> LibKey | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def mapped_libraries(proc_root: str, pid: int) -> list[str]:
    """Distinct NCCL/CUDA runtime paths in the process's maps, as that process names them."""
    try:
        with open(os.path.join(proc_root, str(pid), "maps")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5]
        if path.startswith("/") and not path.endswith(" (deleted)") and lib_kind(path) and path not in found:
            found.append(path)
    return found


def resolve(proc_root: str, pid: int, path: str) -> LibFile | None:
    """Turn a path seen in a process's maps into an attachable file (host path when it is the same)."""
    kind = lib_kind(path)
    inside = os.path.join(proc_root, str(pid), "root") + path
    key = file_key(inside)
    if kind is None or key is None:
        return None
    attach_path = path if file_key(path) == key else inside
    return LibFile(kind, attach_path, key)


def list_pids(proc_root: str) -> list[int]:
    try:
        return [int(n) for n in os.listdir(proc_root) if n.isdigit()]
    except OSError:
        return []


def scan(
    proc_root: str = "/proc",
    only: Collection[LibKey] | None = None,
    pids: Collection[int] | None = None,
) -> tuple[dict[LibKey, LibFile], dict[int, set[LibKey]]]:
    """Libraries mapped by processes, and which process maps which. ``only`` restricts to those files
    (the ``--nccl-lib``/``--cuda-lib`` overrides); ``pids`` restricts to those processes (``--pid``)."""
    libs: dict[LibKey, LibFile] = {}
    procs: dict[int, set[LibKey]] = {}
    own = os.getpid()
    for pid in pids if pids is not None else list_pids(proc_root):
        if pid == own:
            continue
        for path in mapped_libraries(proc_root, pid):
            lib = resolve(proc_root, pid, path)
            if lib is None or (only is not None and lib.key not in only):
                continue
            libs.setdefault(lib.key, lib)
            procs.setdefault(pid, set()).add(lib.key)
    return libs, procs


def library_problem(path: str, kind: str) -> str | None:
    """Why ``path`` is not a library of ``kind`` ("nccl" or "cuda") the agent can trace, or None: it must
    be an ELF shared object whose dynamic symbols define at least one function rankecho traces for that
    kind. The one check behind ``agent check`` and the agent's own refusal of a wrong --nccl-lib or
    --cuda-lib (which would otherwise report "ready", or run and send nothing but its own points)."""
    flag, what = f"--{kind}-lib {path}", LIB_WHAT[kind]
    try:
        defined = defined_functions(path)
    except OSError as err:
        return f"{flag}: cannot read it ({err.strerror}); pass {what}"
    except ValueError as err:
        return f"{flag} is {err}; pass {what}"
    wanted = sorted(f.symbol for f in TRACED if f.lib == kind)
    if not defined & set(wanted):
        names = ", ".join(wanted[:3])
        return f"{flag} defines none of the {kind} functions rankecho traces ({names}, ...); pass {what}"
    return None


def defined_functions(path: str) -> set[str]:
    """Functions defined in the dynamic symbol table of a 64-bit little-endian ELF shared object (the
    agent's platforms); ValueError saying what the file is instead. Reads only the headers and .dynsym."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF":
            raise ValueError("not an ELF file")
        if head[4:6] != b"\x02\x01" or struct.unpack_from("<H", head, 16)[0] != 3:  # ELFCLASS64, LSB, ET_DYN
            raise ValueError("not a 64-bit little-endian ELF shared library")
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        try:  # (name, type, flags, addr, offset, size, link, info, align, entsize) per section
            sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
            dynsym = next((sec for sec in sections if sec[1] == 11), None)  # SHT_DYNSYM
            if dynsym is None:
                return set()
            f.seek(sections[dynsym[6]][4])
            names = f.read(sections[dynsym[6]][5])
            f.seek(dynsym[4])
            syms = f.read(dynsym[5])
            found = set()
            for off in range(0, len(syms) - 23, 24):
                name, info, _, shndx = struct.unpack_from("<IBBH", syms, off)
                if shndx != 0 and info & 0xF in (2, 10):  # defined STT_FUNC / STT_GNU_IFUNC
                    found.add(names[name : names.index(b"\0", name)].decode(errors="replace"))
        except (struct.error, IndexError, ValueError):
            raise ValueError("a damaged ELF file") from None
        return found
