"""The cause rule of the straggler analysis (rk_cause_excess, rk_top_cause in echo/queries/layers), on
hand-made windows: what a late rank spent per cause class against its on-time peers' median."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest

from rankecho.echo.queries import LAYERS

CLASSES = ("allocator", "slow_gpu", "memcpy", "cpu_contention", "sleeping", "host_compute")


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for name in ("rk_expected_contention", "rk_cause_excess", "rk_top_cause"):
        con.execute(LAYERS[name].sql)
    return con


def window(**ms: float) -> dict[str, float]:
    return {c: float(ms.get(c, 0.0)) for c in CLASSES}


def verdict(con: duckdb.DuckDBPyConnection, mine: dict[str, float], peers: dict[str, float] | None) -> Any:
    return con.execute(
        "SELECT rk_cause_excess($m, $p) AS x, rk_top_cause(rk_cause_excess($m, $p))", {"m": mine, "p": peers}
    ).fetchall()[0]


@pytest.mark.parametrize(
    ("mine", "peers", "top", "expected"),
    [
        # the machine preempts every rank a fifth of its runnable time; this one computed 80 ms more
        (window(cpu_contention=30, host_compute=120), window(cpu_contention=10, host_compute=40),
         "host_compute", {"cpu_contention": 0.0, "host_compute": 100.0}),
        # a noisy neighbour on the rank's own core: no longer on the CPU than its peers, 148 ms more off it
        (window(cpu_contention=150, host_compute=40), window(cpu_contention=2, host_compute=40),
         "cpu_contention", {"cpu_contention": 148.0, "host_compute": 0.0}),
        # peers on the CPU under a millisecond and preempted about as long (a shaky ratio), yet the rank
        # computed no longer than they did and was kept off its core for 95 ms
        (window(cpu_contention=94.7, host_compute=0.9, slow_gpu=15.7),
         window(cpu_contention=0.9, host_compute=0.8, slow_gpu=16.0),
         "cpu_contention", {"cpu_contention": 93.6875, "host_compute": 0.2125}),
    ],
)  # fmt: skip
def test_contention_counts_only_beyond_what_the_peers_preemption_predicts(
    con: Any, mine: dict[str, float], peers: dict[str, float], top: str, expected: dict[str, float]
) -> None:
    excess, got = verdict(con, mine, peers)
    assert got == top
    assert {k: excess[k] for k in expected} == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    ("mine", "expected"),
    [
        (window(allocator=290, host_compute=40), "allocator"),
        (window(slow_gpu=60, host_compute=40), "slow_gpu"),
        (window(sleeping=100, host_compute=40), "sleeping"),
        (window(memcpy=70, host_compute=40), "memcpy"),
    ],
)
def test_each_class_wins_when_it_holds_the_excess(con: Any, mine: dict[str, float], expected: str) -> None:
    assert verdict(con, mine, window(host_compute=40, sleeping=1))[1] == expected


def test_without_peers_the_ranks_own_time_is_the_excess(con: Any) -> None:
    excess, top = verdict(con, window(sleeping=30, host_compute=20), None)
    assert top == "sleeping" and excess["sleeping"] == 30 and excess["host_compute"] == 20
