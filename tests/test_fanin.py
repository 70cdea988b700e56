"""The fan-in proof: 8 concurrent producers x 250 events into a fresh Echo, two cluster ids, chain
markers every 25th event, stragglers every 100th, checked with the proof's own SQL text.

Two ``rankecho stress`` processes run at once (4 producers each, clusters ``cluster-a``/``cluster-b``,
nodes ``node-a-0..3``/``node-b-0..3``), against a real ``rankecho serve`` over gRPC with a token.
Set ``RANKECHO_KEEP_DB=1`` to keep the final DB at ``/tmp/echo-fanin-demo.db`` (``RANKECHO_KEEP_DB=PATH``
keeps it at PATH); open it with ``rankecho query --db /tmp/echo-fanin-demo.db "SQL"``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from echo_helpers import TEST_TOKEN as TOKEN

from rankecho.echo.queries import FANIN
from rankecho.launch.echo import EchoProcess
from rankecho.launch.stress import StressProcess

KEEP_DB_DEFAULT = Path("/tmp/echo-fanin-demo.db")


def keep_db_path() -> Path | None:
    value = os.environ.get("RANKECHO_KEEP_DB", "")
    if value in ("", "0"):
        return None
    return KEEP_DB_DEFAULT if value == "1" else Path(value)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "fanin.db"
    yield path
    if (keep := keep_db_path()) is not None and path.exists():
        shutil.copyfile(path, keep)


@pytest.mark.parametrize("client", ["raw", "sdk"])
def test_all_events_land_chains_survive_and_stragglers_surface(db: Path, client: str) -> None:
    with EchoProcess(db, token=TOKEN) as echo:
        runs = [
            StressProcess(echo.otlp_grpc, TOKEN, cluster, node, producers=4, events=250, client=client)
            for cluster, node in (("cluster-a", "node-a"), ("cluster-b", "node-b"))
        ]
        for run in runs:
            run.start()
        summaries = [run.finish() for run in runs]
    assert [(s["sent"], s["acked"], s["failed"], s["exit_code"]) for s in summaries] == [
        (1000, 1000, 0, 0)
    ] * 2

    expected_stragglers: dict[str, int] = {}
    for run in runs:
        expected_stragglers.update(run.plan().stragglers_per_node())
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute(FANIN["total"].sql).fetchall() == [(2000,)]
        per_node = con.execute(FANIN["per_node_events"].sql).fetchall()
        assert per_node == [("cluster-a", f"node-a-{p}", 250) for p in range(4)] + [
            ("cluster-b", f"node-b-{p}", 250) for p in range(4)
        ]
        assert con.execute(FANIN["chains"].sql).fetchall() == [(80,)]
        stragglers = dict(con.execute(FANIN["stragglers"].sql).fetchall())
        assert stragglers == expected_stragglers
        assert sum(stragglers.values()) == 18
        quantiles = con.execute(FANIN["health_quantiles"].sql).fetchall()
        assert len(quantiles) == 8 and all(0.55 <= median <= p95 < 1.0 for _, median, p95 in quantiles)
        assert con.execute(FANIN["duplicates"].sql).fetchall() == [(0,)]
