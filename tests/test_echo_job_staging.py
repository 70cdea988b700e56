"""Job ids in the typed analysis tables: staging copies ``rankecho.job.id`` into ``collectives.job_id``
and ``host_activity.job_id`` ('' without one), and migration 005 backfills a v2 store's rows."""

from __future__ import annotations

from pathlib import Path

import duckdb
from conftest import local_settings
from echo_helpers import TEST_TOKEN, grpc_export, rows
from test_analysis_staging import RESOURCE, activity, collective

from rankecho.echo.app import Echo
from rankecho.echo.store.migrate import available, migrate
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request

JOB = {**RESOURCE, c.JOB_ID: "torchelastic:r1", c.JOB_SOURCE: "torchelastic"}
OTHER = {**RESOURCE, c.NODE_NAME: "node-b", c.SERVICE_INSTANCE_ID: "node-b/1/2"}  # an older agent


def runq_activity() -> list[Point]:
    """activity() plus a woken-then-queued sleep: staged as two rows, the second '<id>/runq'."""
    sleep = Point(c.M_OFFCPU, 1_790_000_000_000_000_100, 10.0,
                  {c.OFFCPU_STATE: "sleeping", c.CALL_IN_FLIGHT: "", c.TID: 4243, c.PREEMPTED_BY: "other",
                   c.RUNQ_MS: 4.0, c.EVENT_ID: "q"})  # fmt: skip
    return [*activity(), sleep]


def export_two_jobs(echo: Echo) -> None:
    grpc_export(echo.grpc_address, metrics_request(JOB, [collective(1), *runq_activity()]), TEST_TOKEN)
    old = [collective(2, **{c.EVENT_ID: "old-2"})]
    grpc_export(echo.grpc_address, metrics_request(OTHER, old), TEST_TOKEN)


def test_staging_copies_the_job_id_and_leaves_unknown_as_empty(tmp_path: Path) -> None:
    with Echo(local_settings(tmp_path / "s.db")) as echo:
        export_two_jobs(echo)
        assert rows(echo, "SELECT event_id, job_id FROM collectives ORDER BY 1") == [
            ("coll-1", "torchelastic:r1"), ("old-2", "")]
        assert rows(echo, "SELECT event_id, job_id FROM host_activity ORDER BY 1") == [
            ("m", "torchelastic:r1"), ("o", "torchelastic:r1"), ("q", "torchelastic:r1"),
            ("q/runq", "torchelastic:r1"), ("s", "torchelastic:r1")]


def test_migration_005_backfills_job_ids_of_a_v2_store(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    with Echo(local_settings(fresh)) as echo:
        export_two_jobs(echo)
    old = tmp_path / "v2.db"
    with duckdb.connect(str(fresh), read_only=True) as src, duckdb.connect(str(old)) as con:
        v1, v2 = available()[:2]
        con.execute(v1.sql)
        con.execute(v2.sql)
        con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
                    "applied_ns BIGINT NOT NULL)")  # fmt: skip
        con.execute("INSERT INTO schema_version VALUES (1, ?, 0), (2, ?, 0)", [v1.name, v2.name])
        for table in ("events", "collectives", "host_activity"):  # the v2 columns of the fresh store's rows
            columns = ", ".join(r[0] for r in con.execute(f"DESCRIBE {table}").fetchall())
            con.register("copied", src.sql(f"SELECT {columns} FROM {table}").to_arrow_table())
            con.execute(f"INSERT INTO {table} SELECT * FROM copied")
            con.unregister("copied")
        assert migrate(con) == available()[-1].version
        got = con.execute("SELECT event_id, job_id FROM host_activity UNION ALL "
                          "SELECT event_id, job_id FROM collectives ORDER BY 1").fetchall()
    with duckdb.connect(str(fresh), read_only=True) as src:
        assert got == src.execute("SELECT event_id, job_id FROM host_activity UNION ALL "
                                  "SELECT event_id, job_id FROM collectives ORDER BY 1").fetchall()
    assert ("q/runq", "torchelastic:r1") in got and ("old-2", "") in got


def test_a_store_that_skipped_005_gets_it(tmp_path: Path) -> None:
    """Numbered on parallel branches: a store migrated to v6 before v5 was merged still gets v5."""
    fresh = tmp_path / "fresh.db"
    with Echo(local_settings(fresh)) as echo:
        export_two_jobs(echo)
    path = tmp_path / "s.db"
    with duckdb.connect(str(fresh), read_only=True) as src, duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
                    "applied_ns BIGINT NOT NULL)")  # fmt: skip
        for m in available()[:6]:  # v1-v6 without v5: the store of a branch that had v6 first
            if m.version != 5:
                con.execute(m.sql)
                con.execute("INSERT INTO schema_version VALUES (?, ?, 0)", [m.version, m.name])
        for table in ("events", "collectives", "host_activity"):  # that store's columns of the fresh rows
            columns = ", ".join(r[0] for r in con.execute(f"DESCRIBE {table}").fetchall())
            con.register("copied", src.sql(f"SELECT {columns} FROM {table}").to_arrow_table())
            con.execute(f"INSERT INTO {table} SELECT * FROM copied")
            con.unregister("copied")
        assert migrate(con) == available()[-1].version
        assert 5 in {r[0] for r in con.execute("SELECT version FROM schema_version").fetchall()}
        assert con.execute("SELECT event_id, job_id FROM collectives ORDER BY 1").fetchall() == [
            ("coll-1", "torchelastic:r1"), ("old-2", "")]
