"""Copy a store file that is not a private snapshot, in a process of its own: ``python copier.py SRC DST``.

Run by :class:`rankecho.echo.sandbox.pool.Sandbox` for ``rankecho query`` and ``rankecho mcp --db``,
whose store file the analysis workers must not change (they prune what they read). A separate process,
because POSIX drops every lock a process holds on a file when the process closes any descriptor of
it: copying in the caller's process would drop the read lock DuckDB holds there (``mcp --db`` reads
the same file), and let a writer in. Standard library only, so it starts in milliseconds.

Takes a shared lock on SRC first (DuckDB holds an exclusive one while it writes a file), so a store
that a running Echo writes is refused (exit status 3) instead of copied half-written; then copies SRC
and its WAL, if any, to DST and DST.wal.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import sys

FLOCK = struct.Struct("hhqqi4x")
"""Linux's struct flock (x86-64 and arm64): type, whence, start, length, pid."""
WRITTEN = 3


def main(argv: list[str]) -> int:
    source, target = argv[0], argv[1]
    with open(source, "rb") as held:
        try:
            fcntl.fcntl(held, fcntl.F_OFD_SETLK, FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0))
        except OSError:
            return WRITTEN
        shutil.copyfile(source, target)
        if os.path.exists(source + ".wal"):
            shutil.copyfile(source + ".wal", target + ".wal")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
