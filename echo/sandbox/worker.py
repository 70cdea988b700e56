"""The analysis worker: a child process that runs callers' SQL under hard OS limits.

Started by :class:`echo.sandbox.pool.Sandbox` as
``python -m rankecho.echo.sandbox.worker CAP THREADS SPILL_DIR``. It reads only private copies of the
store (:mod:`rankecho.echo.store.snapshot`); the first worker to read a copy prunes it in place
(:func:`rankecho.echo.guard.catalog.prune`: everything the guard's policy does not allow is dropped,
the migrations table ``schema_version`` among them), under a file lock, once. It then opens an
in-memory DuckDB, attaches the copy as ``store`` (READ_ONLY, so a file name never appears in an error:
the catalog is always ``store``), defines the analysis macros, then seals the instance (no files, URLs
or extensions; settings locked). So the instance holds the allowed relations, the analysis macros and
nothing else: a name that slips past the guard finds nothing to read. Once set up it caps its own
address space (``RLIMIT_AS`` = what it uses now + ``CAP_BYTES``), so an allocation DuckDB's
``memory_limit`` does not see (lists folded from constants, one huge string, the conversion to Python)
fails inside this process instead of growing Echo. The parent also watches this process's RSS and kills
it past the cap, and kills it at the deadline; this process only ever loses its own memory.

Each request runs in a READ ONLY transaction with an interrupt timer; rows go back in frames of about
64 KiB, cut at the row and byte caps here, so no more than the caps ever crosses the pipe.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import resource
import shutil
import sys
import threading
from typing import Any, BinaryIO

import duckdb

from rankecho.echo.guard.catalog import prune
from rankecho.echo.guard.check import project_policy
from rankecho.echo.guard.instance import seal
from rankecho.echo.sandbox.protocol import read_frame, write_frame
from rankecho.echo.store.reader import ANALYSIS_PRELUDE, row_bytes

CHUNK_BYTES = 64 * 1024
DUCKDB_SHARE = 0.6
"""DuckDB's own memory_limit, as a share of the cap: its buffers spill or fail cleanly before the OS
limit is reached; the rest is headroom for what DuckDB does not account."""
SPILL_FACTOR = 4
"""Disk DuckDB may spill to, in multiples of the cap (a sort bigger than memory still finishes; a query
cannot fill the disk)."""


def _vm_size() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class Worker:
    def __init__(self, cap_bytes: int, threads: int, spill: str) -> None:
        self.cap_bytes = cap_bytes
        self.threads = threads
        self.spill = spill
        self.db: str | None = None
        self.con: duckdb.DuckDBPyConnection | None = None

    def open(self, db: str) -> duckdb.DuckDBPyConnection:
        """The sealed instance reading ``db``; reopened when the parent names another snapshot."""
        if self.con is not None and self.db == db:
            return self.con
        self.close()
        prune_copy(db)
        config: dict[str, str | bool | int | float | list[str]] = {
            "threads": self.threads,
            "temp_directory": self.spill,  # private, removed by the parent; never the working directory
            "max_temp_directory_size": f"{SPILL_FACTOR * self.cap_bytes // (1 << 20)}MiB",
        }
        con = duckdb.connect(":memory:", config=config)
        con.execute("ATTACH ? AS store (READ_ONLY)", [db])
        con.execute("USE store")
        for statement in ANALYSIS_PRELUDE:
            con.execute(statement)
        seal(con, f"{int(self.cap_bytes * DUCKDB_SHARE) // (1 << 20)}MiB")
        self.con, self.db = con, db
        return con

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
        self.con, self.db = None, None

    def run(self, request: dict[str, Any], out: BinaryIO) -> None:
        try:
            cur = self.open(str(request["db"]))  # not a cursor: USE and the temp macros are per connection
        except (duckdb.Error, OSError) as exc:
            write_frame(out, {"error": "query", "message": f"cannot read the store snapshot: {exc}"})
            return
        timer = threading.Timer(float(request["timeout_s"]), cur.interrupt)
        timer.daemon = True
        try:
            cur.execute("BEGIN TRANSACTION READ ONLY")
            timer.start()
            cur.execute(request["sql"], request.get("params"))
            description = cur.description or []
            columns, types = [d[0] for d in description], [str(d[1]) for d in description]
            write_frame(out, {"columns": columns, "types": types})
            write_frame(out, {"done": True, "truncated_by": _stream(cur, request, out)})
        except duckdb.InterruptException:
            write_frame(out, {"error": "timeout", "message": "interrupted"})
        except (duckdb.OutOfMemoryException, MemoryError):
            write_frame(out, {"error": "memory", "message": "out of memory"})
        except duckdb.Error as exc:
            write_frame(out, {"error": "query", "message": str(exc)})
        finally:
            timer.cancel()
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                self.close()


def prune_copy(db: str) -> None:
    """Drop from the store copy ``db`` everything the guard's policy does not allow, once: the first
    worker does it (read-write, before anyone attaches the copy) and leaves ``db.pruned``; the others
    wait on ``db.lock`` and find the marker."""
    with open(db + ".lock", "a", encoding="ascii") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(db + ".pruned"):
            return
        with duckdb.connect(db, config={"enable_external_access": False}) as con:
            (name,) = con.execute("SELECT current_database()").fetchone() or ("",)
            prune(con, project_policy(), str(name))
            con.execute("CHECKPOINT")
        with open(db + ".pruned", "w", encoding="ascii"):
            pass


def plain(value: Any) -> Any:
    """``value`` with time zones as fixed offsets (zoneinfo's pickle is not on the parent's allowlist),
    inside lists, tuples and dicts too; everything else as DuckDB returned it."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dt.datetime | dt.time) and value.tzinfo is not None:
        offset = value.utcoffset()
        if not isinstance(value.tzinfo, dt.timezone) and offset is not None:
            return value.replace(tzinfo=dt.timezone(offset))
        return value
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    return value


def _stream(cur: duckdb.DuckDBPyConnection, request: dict[str, Any], out: BinaryIO) -> str | None:
    """Send rows in ~64 KiB frames; stop at the caps. Returns which cap cut the result, if any."""
    rows_left, bytes_left = int(request["max_rows"]), int(request["max_bytes"])
    chunk: list[tuple[Any, ...]] = []
    chunk_bytes = 0
    cut: str | None = None
    while cut is None:
        batch = cur.fetchmany(256)
        if not batch:
            break
        for row in batch:
            size = row_bytes(row)
            if size > bytes_left:
                cut = "max_bytes"
                break
            if rows_left <= 0:
                cut = "max_rows"
                break
            chunk.append(tuple(plain(v) for v in row))
            rows_left, bytes_left, chunk_bytes = rows_left - 1, bytes_left - size, chunk_bytes + size
            if chunk_bytes >= CHUNK_BYTES:
                write_frame(out, {"rows": chunk})
                chunk, chunk_bytes = [], 0
    if chunk:
        write_frame(out, {"rows": chunk})
    return cut


def main(argv: list[str]) -> int:
    cap_bytes, threads, spill = int(argv[0]), int(argv[1]), argv[2]
    worker = Worker(cap_bytes, threads, spill)
    warm = duckdb.connect(":memory:", config={"threads": threads, "temp_directory": spill})
    warm.execute("SELECT sum(range) FROM range(100000)").fetchall()  # start DuckDB's threads now
    warm.close()
    limit = _vm_size() + cap_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    write_frame(stdout, {"ready": True, "address_space_limit": limit})
    try:
        while True:
            try:
                request = read_frame(stdin, 1 << 20)
            except EOFError:
                return 0
            worker.run(request, stdout)
    finally:
        shutil.rmtree(spill, ignore_errors=True)  # the parent removes it too, if it outlives this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
