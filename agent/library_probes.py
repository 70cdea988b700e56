"""Which libraries carry the agent's probes: each NCCL/CUDA runtime file attached once, and the processes
traced because they map one.

discovery.py finds what processes map and probes.py attaches to one file; between them sits a decision
with its own state: a file is attached once however many processes map it, a library named by hand
(``--nccl-lib``/``--cuda-lib``) is the only one of its kind attached, and a file that fails is logged
and skipped at a rescan but fatal when named by hand. The main loop (agent/runner.py) only says when.

Usage::

    libs = LibraryProbes(proc_root="/proc", pids=[])
    libs.attach_given(bpf, "nccl", ["/opt/nccl/lib/libnccl.so.2"])   # LibraryError when it cannot
    for pid in libs.scan(bpf): ...           # the processes that map an attached library
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from rankecho.agent import discovery, probes

log = logging.getLogger("rankecho.agent")


class LibraryProbes:
    """The attached library files by (device, inode), and the hand-named ones per kind."""

    def __init__(self, proc_root: str, pids: Sequence[int]) -> None:
        self._proc_root = proc_root
        self._pids = pids
        self.attached: dict[discovery.LibKey, discovery.LibFile] = {}
        self.explicit: dict[str, set[discovery.LibKey]] = {"nccl": set(), "cuda": set()}
        """Per kind, the files named by hand: when any is, no other file of that kind is attached."""

    def attach_given(self, bpf: Any, kind: str, paths: Sequence[str]) -> None:
        """Attach the ``--{kind}-lib`` files; raises :class:`discovery.LibraryError` naming the fix."""
        for path in paths:
            key = discovery.file_key(path)
            if key is None:
                raise discovery.LibraryError(f"--{kind}-lib {path} does not exist")
            self.explicit[kind].add(key)
            try:
                self._attach(bpf, discovery.LibFile(kind, os.path.abspath(path), key))
            except Exception as err:
                raise discovery.LibraryError(f"--{kind}-lib {path}: no probe attached ({err}); pass "
                                             f"the library the job loads, or drop --{kind}-lib") from err

    def scan(self, bpf: Any) -> set[int]:
        """Attach what the processes (``--pid``, else all) map now and may be attached; the pids of the
        processes that map an attached library."""
        libs, procs = discovery.scan(self._proc_root, pids=self._pids or None)
        wanted: set[int] = set()
        for pid, keys in procs.items():
            for key in keys:
                lib = libs[key]
                restricted = self.explicit[lib.kind]
                if restricted and key not in restricted:
                    continue
                try:
                    self._attach(bpf, lib)
                except Exception as err:
                    log.warning("cannot attach to %s: %s", lib.path, err)
                    continue
                wanted.add(pid)
        return wanted

    def _attach(self, bpf: Any, lib: discovery.LibFile) -> None:
        if lib.key in self.attached:
            return
        done = probes.attach_library(bpf, lib.path, lib.kind)
        self.attached[lib.key] = lib
        endbr = sum(a.skip > 0 for a in done)
        log.info("attached %d probes to %s (%d past endbr64)", len(done), lib.path, endbr)
        warning = probes.stepped_warning(lib.path, done)
        if warning:
            log.warning("%s", warning)
