"""A second Echo on a held store, by every name the store can have: the same path, a relative path, a
symlink, a hard link. Each exits 3 naming the holder's pid and leaves no file behind.

Found (issue 9): through a symlink or a hard link the second Echo got past the sidecar lock, died in
DuckDB's own lock error with a traceback (exit 1) and left a stray ``.lock`` file.

And a ``--db`` that cannot hold a store (not a DuckDB file, a directory, a missing directory): exit 2
with one line naming the fix, nothing created (issue 19).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from rankecho.echo.store.lock import StoreLock, StoreLockedError, is_locked, read_holder
from rankecho.launch.echo import EchoProcess
from tests.echo_helpers import TEST_TOKEN, run_serve


def listing(*dirs: Path) -> set[Path]:
    return {p for d in dirs for p in d.iterdir()}


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[EchoProcess]:
    store = tmp_path / "store"
    store.mkdir()
    echo = EchoProcess(store / "echo.db", TEST_TOKEN, log=tmp_path / "holder.log").start()
    yield echo
    echo.stop()


@pytest.mark.parametrize("how", ["path", "relative", "symlink", "hard link"])
def test_second_echo_by_any_name_exits_3_naming_the_holder(
    holder: EchoProcess, tmp_path: Path, how: str
) -> None:
    store, other = holder.db.parent, tmp_path / "other"
    other.mkdir()
    name, cwd = str(holder.db), tmp_path
    if how == "relative":
        name, cwd = "store/../store/echo.db", tmp_path
    elif how == "symlink":
        (other / "link.db").symlink_to(holder.db)
        name = str(other / "link.db")
    elif how == "hard link":
        os.link(holder.db, other / "hard.db")
        name = str(other / "hard.db")
    before = listing(store, other)
    done = run_serve(name, cwd)
    assert holder.proc is not None
    assert done.returncode == 3, done.stderr[-2000:]
    assert f"pid {holder.proc.pid}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert listing(store, other) == before, "the refused Echo left files behind"
    assert is_locked(Path(name) if how != "relative" else cwd / name)


def test_hard_link_lock_names_the_holder_in_process(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    db.write_bytes(b"not yet a store")  # the inode lock needs the file only to exist
    with StoreLock(db):
        os.link(db, tmp_path / "b.db")
        with pytest.raises(StoreLockedError) as info:
            StoreLock(tmp_path / "b.db").acquire()
        assert f"pid {os.getpid()}" in str(info.value)
        assert read_holder(tmp_path / "b.db") == os.getpid()
        assert not (tmp_path / "b.db.lock").exists()
    assert not is_locked(tmp_path / "b.db")


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its content (None for a directory)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("not a store", ["exists but is not a DuckDB store", "move that file aside"]),
        ("empty file", ["is not a DuckDB store (it is empty)"]),
        ("directory", ["is a directory", "echo.db/echo.db"]),
        ("missing directory", ["mistyped for --db", "does not exist", "mkdir -p", "--create-dirs"]),
        ("newer store", ["store schema is v999", "upgrade rankecho"]),
    ],
)
def test_a_db_that_cannot_hold_a_store_exits_2_naming_the_fix(
    tmp_path: Path, case: str, expect: list[str]
) -> None:
    """Found (issue 19): a file that is not a DuckDB store or a directory gave a traceback, exit 1 and a
    stray ``.lock``; a mistyped directory was created silently (and Echo served from it); a store from a
    newer rankecho gave a traceback and exit 1."""
    db = tmp_path / "echo.db"
    if case == "not a store":
        db.write_text("node,rank\nn1,0\n")
    elif case == "empty file":
        db.write_bytes(b"")
    elif case == "directory":
        db.mkdir()
    elif case == "newer store":
        with duckdb.connect(str(db)) as con:
            con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
                        "applied_ns BIGINT NOT NULL)")  # fmt: skip
            con.execute("INSERT INTO schema_version VALUES (999, '999_future.sql', 0)")
    else:
        db = tmp_path / "mistyped" / "echo.db"
    before = tree(tmp_path)
    done = run_serve(str(db), tmp_path, timeout=30)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    for words in expect:
        assert words in done.stderr, done.stderr
    assert tree(tmp_path) == before, "the refused Echo created or changed files"


def test_create_dirs_creates_the_missing_directory(tmp_path: Path) -> None:
    db = tmp_path / "a" / "b" / "echo.db"
    echo = EchoProcess(db, TEST_TOKEN, log=tmp_path / "echo.log", extra_args=("--create-dirs",)).start()
    assert echo.stop() == 0
    assert db.is_file()
