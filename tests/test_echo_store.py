"""Schema and migrations, the store lock, and the ops endpoints of a running Echo."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import httpx
import pytest
from echo_helpers import TEST_TOKEN, grpc_export, node_request

from rankecho.echo.app import Echo
from rankecho.echo.ingest.rows import ARROW_SCHEMA
from rankecho.echo.store.lock import StoreLock, StoreLockedError, is_locked
from rankecho.echo.store.migrate import SchemaTooNewError, available, migrate


def test_migrations_apply_once_in_order_and_record_the_version(tmp_path: Path) -> None:
    versions = [m.version for m in available()]
    assert versions == sorted(versions) and versions[0] == 1
    with duckdb.connect(str(tmp_path / "s.db")) as con:
        assert migrate(con) == versions[-1]
        assert migrate(con) == versions[-1]  # idempotent
        assert con.execute("SELECT version FROM schema_version ORDER BY 1").fetchall() == [
            (v,) for v in versions
        ]
        # v7: events is a view over the stored rows, and no table keeps a per-row index (zone maps on
        # the time columns serve time ranges; an ART index would live in memory and grow with the store).
        views = con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'events'").fetchall()
        assert views == [(1,)]
        assert con.execute("SELECT table_name FROM duckdb_indexes()").fetchall() == []
        columns = [r[0] for r in con.execute("DESCRIBE events").fetchall()]
        for seed_column in ("timestamp_ns", "cluster_id", "node_id", "metric_name", "rank", "nranks",
                            "value_double", "value_int", "attrs_json"):  # fmt: skip
            assert seed_column in columns


def test_a_store_newer_than_this_echo_is_refused(tmp_path: Path) -> None:
    with duckdb.connect(str(tmp_path / "s.db")) as con:
        migrate(con)
        con.execute("INSERT INTO schema_version VALUES (999, '999_future.sql', 0)")
        with pytest.raises(SchemaTooNewError, match="upgrade rankecho"):
            migrate(con)


def test_lock_is_exclusive_and_names_the_holder(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with StoreLock(db):
        assert is_locked(db)
        with pytest.raises(StoreLockedError) as info:
            StoreLock(db).acquire()
        assert f"pid {os.getpid()}" in str(info.value)
    assert not is_locked(db)


def scrape(base: str) -> dict[str, str]:
    """``/metrics`` as {series: value}."""
    text = httpx.get(f"{base}/metrics").text
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))


def test_ops_endpoints(echo_inproc: Echo) -> None:
    base = f"http://{echo_inproc.http_address}"
    assert httpx.get(f"{base}/healthz").status_code == 200
    assert httpx.get(f"{base}/readyz").status_code == 200
    request = node_request("n1", 40)
    grpc_export(echo_inproc.grpc_address or "", request, TEST_TOKEN)
    grpc_export(echo_inproc.grpc_address or "", request, TEST_TOKEN)
    lines = scrape(base)
    assert lines['rankecho_echo_received_total{signal="metric"}'] == "80"
    assert lines["rankecho_echo_committed_total"] == "40"
    assert lines["rankecho_echo_duplicates_skipped_total"] == "40"
    assert lines["rankecho_echo_queue_rows"] == "0"
    assert lines["rankecho_echo_commit_seconds_count"] == "2"
    assert lines['rankecho_echo_batch_rows_bucket{le="100"}'] == "2"
    httpx.post(f"{base}/v1/metrics", content=b"x", headers={"Content-Type": "application/x-protobuf"})
    lines = scrape(base)
    assert lines['rankecho_echo_rejected_total{reason="unauthenticated",what="request"}'] == "1"
    assert lines['rankecho_echo_requests_total{outcome="unauthenticated"}'] == "1"
    assert lines['rankecho_echo_requests_total{outcome="ok"}'] == "2"
    assert httpx.get(f"{base}/nope").status_code == 404
    echo_inproc.writer.stop()
    assert httpx.get(f"{base}/readyz").status_code == 503


def test_the_writers_arrow_schema_matches_the_events_table(tmp_path: Path) -> None:
    with duckdb.connect(str(tmp_path / "s.db")) as con:
        migrate(con)
        table_types = {name: kind for name, kind, *_ in con.execute("DESCRIBE events").fetchall()}
        con.register("empty", ARROW_SCHEMA.empty_table())
        arrow_types = {
            name: kind for name, kind, *_ in con.execute("DESCRIBE SELECT * FROM empty").fetchall()
        }
    assert {name: table_types[name] for name in ARROW_SCHEMA.names} == arrow_types
