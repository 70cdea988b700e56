"""Whether ``--db`` names a place Echo can keep a store, checked before anything is created there.

Found (issue 19): ``--db`` on a directory or on a file that is not a DuckDB store died in DuckDB with a
traceback (exit 1) and left a stray ``.lock``; a read-only directory said only ``[Errno 30] ...
echo.db.lock``; a mistyped ``--db /mistyped/dir/echo.db`` silently created the mistyped directory.
:func:`check_store_path` refuses each of those with one paragraph naming the problem and the fix
(``rankecho serve`` exits 2), before the lock, the store or any directory exists.

Usage::

    check_store_path(Path("/data/echo.db"), create_dirs=False)   # raises StorePathError
"""

from __future__ import annotations

import os
from pathlib import Path

from rankecho.echo.store.lock import real_path

DUCKDB_MAGIC = b"DUCK"
"""Every DuckDB database file carries these bytes at offset 8 (after the header checksum)."""
_MAGIC_AT = 8


class StorePathError(ValueError):
    """``--db`` cannot hold a store; the message names the problem and the fix (bad input: exit 2)."""


def _unwritable(where: str, directory: Path, db_path: Path) -> StorePathError:
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    what = "is on a read-only file system" if read_only else f"is not writable by uid {os.getuid()}"
    return StorePathError(
        f"{where} {what}: Echo writes the store, its write-ahead log (.wal) and its lock file (.lock) in "
        f"{directory}. Mount a writable volume there (Kubernetes: a PersistentVolumeClaim, with the pod's "
        "securityContext.fsGroup set so Echo's user can write it), or choose another --db path than "
        f"{db_path}"
    )


def check_store_path(db_path: Path, create_dirs: bool = False) -> None:
    """Raise :class:`StorePathError` unless ``db_path`` is an existing DuckDB store Echo may write, or a
    free name in a writable directory. A missing directory is created only with ``create_dirs``."""
    real = real_path(db_path)
    if real.is_dir():
        raise StorePathError(
            f"--db {db_path} is a directory: --db names the store file itself, for example "
            f"--db {Path(db_path) / 'echo.db'}"
        )
    directory = real.parent
    if not directory.exists():
        if not create_dirs:
            raise StorePathError(
                f"the directory {directory} for --db {db_path} does not exist: check --db for a typo, "
                f"create the directory first (mkdir -p {directory}), or pass --create-dirs to let Echo "
                "create it"
            )
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorePathError(
                f"cannot create the directory {directory} for --db {db_path} ({exc.strerror}): create it "
                "yourself on a writable volume, or choose another --db path"
            ) from None
    if not directory.is_dir():
        raise StorePathError(
            f"{directory} in --db {db_path} is not a directory: choose a --db path inside a directory"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise _unwritable(f"the store's directory {directory}", directory, db_path)
    if real.exists():
        _check_is_store(real, db_path)


def _check_is_store(real: Path, db_path: Path) -> None:
    if not real.is_file():
        raise StorePathError(f"--db {db_path} is not a regular file: give the path of a DuckDB store file")
    if not os.access(real, os.R_OK | os.W_OK):
        raise _unwritable(f"the store file {real}", real.parent, db_path)
    try:
        with real.open("rb") as f:
            head = f.read(_MAGIC_AT + len(DUCKDB_MAGIC))
    except OSError as exc:
        raise StorePathError(f"cannot read --db {db_path} ({exc.strerror}): check its permissions") from None
    if head[_MAGIC_AT:] != DUCKDB_MAGIC:
        raise StorePathError(
            f"--db {db_path} exists but is not a DuckDB store{' (it is empty)' if not head else ''}: check "
            "--db for a typo, or move that file aside so Echo creates a new store under that name"
        )
