"""The day benchmark's core (bench/day.py) on a tiny real sample: a real Echo stores 8 ranks' agent mix for a
few seconds, then three simulated hours are replayed from it with a retention of one hour. The store must
stop growing once retention is reached, raw rows older than the retention must be gone, the rollups of
the deleted collectives must remain, and no copy may repeat another's times or sequence numbers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from bench.day import NS, Replay, day, new_store, take_sample

MINUTE_NS = 60 * NS


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("day-sample")
    db, info = take_sample(tmp, ranks=8, seconds=5, stragglers=1)
    assert info["acked"] > 0 and info["failed"] == 0
    return db


@pytest.fixture(scope="module")
def replayed(sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], Path]]:
    store = tmp_path_factory.mktemp("day") / "day.db"
    result = day(store, sample, hours=3, retention_h=1, every_min=30, batch=120, progress=lambda _: None)
    yield result, store


def test_the_store_stops_growing_once_retention_is_reached(replayed: tuple[dict[str, Any], Path]) -> None:
    result, _ = replayed
    points = result["points"]
    hours = [p["hour"] for p in points]
    # A pass every ~30 simulated minutes (whole sample copies: the sample's length varies with the
    # generator's stalls, so the last pass may be a short one).
    assert hours == sorted(hours) and 2.9 <= hours[-1] <= 3.0 and len(points) >= 6
    before = [p for p in points if p["hour"] <= 1.0]
    steady = [p for p in points if p["hour"] >= 1.45 and p["rows_written"] > 0.5 * points[0]["rows_written"]]
    assert all(p["rows_deleted"] == 0 for p in points[:1])
    assert len(steady) >= 3 and all(p["rows_deleted"] > 0 for p in steady)
    # Past the retention, each pass deletes about what was written since the last one: the raw rows
    # stay at one hour's worth, and the blocks in use stop growing (free blocks are reused).
    rows = [p["rows_collectives"] for p in steady]
    assert max(rows) <= 1.05 * min(rows) and max(rows) <= 1.1 * before[-1]["rows_collectives"]
    used = [p["used_bytes"] for p in steady]
    assert max(used) <= min(used) * 1.25
    # The file keeps freed blocks for reuse: it reaches its high-water mark in the first passes, then stays.
    files = [p["file_bytes"] for p in steady]
    assert max(files[2:]) <= 1.1 * max(files[:2])


def test_rows_older_than_the_retention_are_gone_and_rollups_remain(
    replayed: tuple[dict[str, Any], Path], sample: Path
) -> None:
    result, store = replayed
    with duckdb.connect(str(sample), read_only=True) as con:
        (per_copy,) = con.execute("SELECT count(*) FROM collectives").fetchone() or (0,)
    with duckdb.connect(str(store), read_only=True) as con:
        (start,) = con.execute("SELECT min(first_enter_ns) FROM collective_rollup").fetchone() or (None,)
        newest = max(
            (con.execute(f"SELECT max({c}) FROM {t}").fetchone() or (0,))[0]
            for t, c in (("collectives", "enter_ns"), ("host_activity", "start_ns"))
        )
        cutoff = int(newest) - 3600 * NS
        minute = cutoff - cutoff % MINUTE_NS - MINUTE_NS  # typed rows go by whole minutes below the cutoff
        for table, column in (("collectives", "enter_ns"), ("host_activity", "start_ns"),
                              ("events_generic", "timestamp_ns")):  # fmt: skip
            (oldest,) = con.execute(f"SELECT min({column}) FROM {table}").fetchone() or (None,)
            assert oldest is not None and oldest >= minute, table
        rolled = con.execute("SELECT count(*), sum(calls) FROM collective_rollup").fetchone()
        rollups, calls = rolled or (0, 0)
        (kept,) = con.execute("SELECT count(*) FROM collectives").fetchone() or (0,)
        (repeats,) = con.execute(
            "SELECT count(*) FROM (SELECT enter_ns, rank, comm_id FROM collectives GROUP BY ALL "
            "HAVING count(*) > 1)").fetchone() or (1,)  # fmt: skip
        (seqs,) = con.execute(
            "SELECT count(*) FROM (SELECT comm_id, rank, seq FROM collectives GROUP BY ALL "
            "HAVING count(*) > 1)").fetchone() or (1,)  # fmt: skip
    assert start is not None and start < minute  # the rollups reach back before the raw rows
    assert rollups > 0 and result["points"][-1]["rows_collective_rollup"] == rollups
    # every collective written is counted once: raw or rolled up
    assert per_copy > 0 and calls + kept == result["copies"] * per_copy
    assert repeats == 0 and seqs == 0


def test_a_replayed_copy_shifts_times_sequences_and_stored_ids(sample: Path, tmp_path: Path) -> None:
    con, replay = new_store(tmp_path / "two.db", sample)
    with con:
        assert isinstance(replay, Replay)
        replay.append(1)
        replay.append(1)
        bound = replay.start_ns + replay.length_ns
        first, second = (
            con.execute(
                f"SELECT min(enter_ns), min(seq), count(*) FROM collectives WHERE enter_ns {op} {bound}"
            ).fetchone() or (0, 0, 0)
            for op in ("<", ">=")
        )
        assert second[0] - first[0] == replay.length_ns
        assert second[1] - first[1] == replay.seq_span and first[2] == second[2]
        dup = con.execute("SELECT count(*) - count(DISTINCT event_id) FROM events_generic").fetchone()
        (ids,) = dup or (1,)
        assert ids == 0
