"""Finding the processes to trace: every process that maps libnccl.so* or libcudart.so*.

Reads ``<proc_root>/<pid>/maps`` (``proc_root`` is injectable for tests). Paths inside containers are
reached through ``<proc_root>/<pid>/root``, and a library file is identified by (device, inode) so the
agent attaches once per file however many processes or mount namespaces map it. Usage::

    libs, procs = scan("/proc")              # {LibKey: LibFile}, {pid: {LibKey, ...}}
    new = [f for k, f in libs.items() if k not in attached]
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass

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
