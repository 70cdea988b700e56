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


class LibraryError(ValueError):
    """A ``--nccl-lib``/``--cuda-lib`` that cannot be traced; the message names the flag and the fix."""


_ELF_CLASS = {1: ("I", "IIIIIIIIII", "IIIBBH", (0, 3, 5)), 2: ("Q", "IIQQQQIIQQ", "IBBHQQ", (0, 1, 3))}
"""Per ELF class (32/64-bit): address word, section header and symbol layouts, and where a symbol
keeps its name, info and section index."""
SHT_DYNSYM = 11
ET_DYN = 3
STT_FUNC, STT_GNU_IFUNC = 2, 10


def exported_functions(path: str) -> set[str]:
    """Names of the functions a shared library exports (its defined ``.dynsym`` functions), read from the
    file without loading it (a wrong file must not run its constructors in the agent). Raises OSError
    when unreadable, ValueError when it is not an ELF shared library."""
    with open(path, "rb") as f:
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] not in _ELF_CLASS or ident[5] not in (1, 2):
            raise ValueError("not an ELF file")
        word, shdr, sym, (i_name, i_info, i_shndx) = _ELF_CLASS[ident[4]]
        end = "<" if ident[5] == 1 else ">"
        header = f"{end}HHI{word}{word}{word}IHHHHHH"
        head = struct.unpack(header, f.read(struct.calcsize(header)))
        if head[0] != ET_DYN:
            raise ValueError("an ELF file but not a shared library")
        shoff, shentsize, shnum = head[5], head[10], head[11]
        sym_size = struct.calcsize(f"{end}{sym}")

        def section(i: int) -> tuple[int, ...]:
            f.seek(shoff + i * shentsize)
            return struct.unpack(f"{end}{shdr}", f.read(struct.calcsize(f"{end}{shdr}")))

        def read(offset: int, size: int) -> bytes:
            f.seek(offset)
            return f.read(size)

        names: set[str] = set()
        for sec in (section(i) for i in range(shnum)):
            if sec[1] != SHT_DYNSYM:
                continue
            strtab = section(sec[6])
            strings, table = read(strtab[4], strtab[5]), read(sec[4], sec[5])
            for off in range(0, len(table) - sym_size + 1, sym_size):
                entry = struct.unpack_from(f"{end}{sym}", table, off)
                if entry[i_shndx] != 0 and entry[i_info] & 0xF in (STT_FUNC, STT_GNU_IFUNC):
                    start = entry[i_name]
                    names.add(strings[start: strings.index(b"\0", start)].decode(errors="replace"))
        return names


def check_library(path: str, kind: str) -> None:
    """Raise :class:`LibraryError` unless ``path`` is an ELF shared library exporting at least one of
    the ``kind`` ("nccl" or "cuda") functions rankecho traces: what ``--nccl-lib``/``--cuda-lib`` must
    name. (A wrong one used to attach nothing while the agent still sent its own points.)"""
    flag, expected = f"--{kind}-lib", "libnccl.so.2" if kind == "nccl" else "libcudart.so.12"
    fix = (f"pass the {expected} your job loads (see /proc/PID/maps of a rank), or drop {flag} to trace "
           "every one the agent finds")
    try:
        exported = exported_functions(path)
    except FileNotFoundError:
        raise LibraryError(f"{flag} {path} does not exist; {fix}") from None
    except OSError as err:
        raise LibraryError(f"{flag} {path}: cannot read it ({err.strerror}); {fix}") from None
    except ValueError as err:  # what the file is instead
        raise LibraryError(f"{flag} {path} is {err}; {fix}") from None
    except (struct.error, IndexError):
        raise LibraryError(f"{flag} {path} is a damaged ELF file; {fix}") from None
    traced = {f.symbol for f in TRACED if f.lib == kind}
    if not exported & traced:
        raise LibraryError(f"{flag} {path} exports none of the {len(traced)} {kind} functions rankecho "
                           f"traces (e.g. {sorted(traced)[0]}); {fix}")


def library_problem(path: str, kind: str) -> str | None:
    """Why ``path`` is not a library of ``kind`` the agent can trace (:func:`check_library`'s message),
    or None: what ``agent check`` reports for --nccl-lib / --cuda-lib."""
    try:
        check_library(path, kind)
    except LibraryError as err:
        return str(err)
    return None
