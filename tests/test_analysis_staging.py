"""The typed analysis tables: filled by the writer in the commit that stores the events, once per event
(resends included), backfilled when an older store is migrated, tolerant of malformed attributes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import local_settings
from echo_helpers import TEST_TOKEN, grpc_export, rows

from rankecho.echo.app import Echo
from rankecho.echo.store.migrate import available, migrate
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request

T0 = 1_790_000_000_000_000_000  # 2026-09-21: Echo refuses times ahead of its clock
RESOURCE = {c.CLUSTER_NAME: "c1", c.NODE_NAME: "node-a", c.RANK: 3, c.NRANKS: 8, c.PROCESS_PID: 4242,
            c.PROCESS_START_NS: 777, c.SERVICE_INSTANCE_ID: "node-a/1/2"}  # fmt: skip


def collective(seq: int, **extra: Any) -> Point:
    attrs: dict[str, Any] = {
        c.OP: "ncclAllReduce", c.COMM_ID: "abc", c.SEQ: seq, c.SEQ_ALIGNED: True, c.COMM_RANK: 3,
        c.COMM_NRANKS: 8, c.BYTES: 1024, c.ENTER_NS: T0 + seq * 1000, c.RETURN_NS: T0 + seq * 1000 + 10,
        c.COMPLETE_NS: T0 + seq * 1000 + 500, c.CAUSAL_CHAIN_ID: f"abc:{seq}", c.TID: 4243,
        c.EVENT_ID: f"coll-{seq}",
    }  # fmt: skip
    attrs.update(extra)
    return Point(c.M_COLLECTIVE, T0 + seq * 1000, 0.5, attrs)


def activity() -> list[Point]:
    return [
        Point(
            c.M_CUDA_SYNC, T0 + 5, 2.5, {c.CUDA_CALL: "cudaStreamSynchronize", c.TID: 4243, c.EVENT_ID: "s"}
        ),
        Point(c.M_CUDA_MALLOC, T0 + 6, 1.0, {c.CUDA_CALL: "cudaMalloc", c.TID: 4243, c.EVENT_ID: "m"}),
        Point(
            c.M_OFFCPU,
            T0 + 7,
            3.0,
            {
                c.OFFCPU_STATE: "preempted",
                c.CALL_IN_FLIGHT: "",
                c.TID: 4244,
                c.PREEMPTED_BY: "other",
                c.EVENT_ID: "o",
            },
        ),
        Point(c.M_HEALTH, T0 + 8, 0.9, {c.EVENT_ID: "h"}),  # not an interval: not staged
    ]


def test_the_commit_that_stores_a_collective_also_stores_its_typed_copy(echo_inproc: Echo) -> None:
    grpc_export(echo_inproc.grpc_address, metrics_request(RESOURCE, [collective(7)]), TEST_TOKEN)
    got = rows(
        echo_inproc,
        "SELECT event_id, cluster_id, node_id, rank, pid, process_start_ns, agent_instance, tid, op, "
        "comm_id, seq, seq_aligned, comm_rank, comm_nranks, bytes, in_group, enter_ns, return_ns, "
        "complete_ns, causal_chain_id, stream_key > 0, inst_key > 0 FROM collectives",
    )
    expected = ("coll-7", "c1", "node-a", 3, 4242, 777, "node-a/1/2", 4243, "ncclAllReduce", "abc", 7,
                True, 3, 8, 1024, False, T0 + 7000, T0 + 7010, T0 + 7500, "abc:7", True, True)  # fmt: skip
    assert got == [expected]


def test_intervals_are_staged_with_their_end_and_category(echo_inproc: Echo) -> None:
    grpc_export(echo_inproc.grpc_address, metrics_request(RESOURCE, activity()), TEST_TOKEN)
    got = rows(
        echo_inproc,
        "SELECT event_id, kind, cuda_call, state, preempted_by, tid, start_ns, end_ns, pid, category "
        "FROM host_activity ORDER BY event_id",
    )
    assert got == [
        ("m", "malloc", "cudaMalloc", None, None, 4243, T0 + 6, T0 + 6 + 1_000_000, 4242, "allocator"),
        ("o", "offcpu", "", "preempted", "other", 4244, T0 + 7, T0 + 7 + 3_000_000, 4242, "cpu_contention"),
        (
            "s",
            "sync",
            "cudaStreamSynchronize",
            None,
            None,
            4243,
            T0 + 5,
            T0 + 5 + 2_500_000,
            4242,
            "slow_gpu",
        ),
    ]


@pytest.mark.parametrize(
    ("state", "in_flight", "preempted_by", "category"),
    [
        ("sleeping", "", None, "sleeping"),  # blocked outside CUDA: data loader, I/O, a lock
        ("sleeping", "cudaStreamSynchronize", None, None),  # the sync's own interval counts it
        ("preempted", "cudaMalloc", "other", None),  # inside the allocator call: counted there
        ("preempted", "", "job", None),  # another rank took the core: host compute
        ("preempted", "", "other", "cpu_contention"),
    ],
)
def test_off_cpu_intervals_are_categorised_by_why_the_thread_was_off(
    echo_inproc: Echo, state: str, in_flight: str, preempted_by: str | None, category: str | None
) -> None:
    attrs = {c.OFFCPU_STATE: state, c.CALL_IN_FLIGHT: in_flight, c.TID: 4244, c.EVENT_ID: "x"}
    if preempted_by:
        attrs[c.PREEMPTED_BY] = preempted_by
    grpc_export(
        echo_inproc.grpc_address, metrics_request(RESOURCE, [Point(c.M_OFFCPU, T0, 1.0, attrs)]), TEST_TOKEN
    )
    assert rows(echo_inproc, "SELECT category FROM host_activity") == [(category,)]


def test_a_resend_is_staged_once_and_new_points_beside_it_still_are(echo_inproc: Echo) -> None:
    address = echo_inproc.grpc_address
    grpc_export(address, metrics_request(RESOURCE, [collective(1), collective(2)]), TEST_TOKEN)
    grpc_export(address, metrics_request(RESOURCE, [collective(1), collective(2)]), TEST_TOKEN)
    grpc_export(address, metrics_request(RESOURCE, [collective(2), collective(3)]), TEST_TOKEN)
    assert rows(echo_inproc, "SELECT event_id, count(*) FROM collectives GROUP BY ALL ORDER BY 1") == [
        ("coll-1", 1),
        ("coll-2", 1),
        ("coll-3", 1),
    ]
    assert rows(echo_inproc, "SELECT count(*) FROM events") == [(3,)]


def test_malformed_attributes_become_null_and_the_event_is_kept(echo_inproc: Echo) -> None:
    bad = collective(9, **{c.SEQ: "nine", c.COMPLETE_NS: "soon", c.SEQ_ALIGNED: "maybe"})
    grpc_export(echo_inproc.grpc_address, metrics_request(RESOURCE, [bad]), TEST_TOKEN)
    assert rows(echo_inproc, "SELECT seq, complete_ns, seq_aligned, enter_ns, inst_key FROM collectives") == [
        (None, None, False, T0 + 9000, None)
    ]
    assert rows(echo_inproc, "SELECT count(*) FROM events") == [(1,)]


def test_migrating_a_v1_store_backfills_the_analysis_tables(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with duckdb.connect(str(path)) as con:
        v1 = available()[0]
        con.execute(v1.sql)
        con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
                    "applied_ns BIGINT NOT NULL)")  # fmt: skip
        con.execute("INSERT INTO schema_version VALUES (1, ?, 0)", [v1.name])
    with Echo(local_settings(path)) as echo:  # an Echo of this version opens it: migration 002 runs
        grpc_export(echo.grpc_address, metrics_request(RESOURCE, [collective(1), *activity()]), TEST_TOKEN)
    # the same events written into a fresh v1 store by hand, then migrated: backfill == staging
    other = tmp_path / "hand.db"
    with duckdb.connect(str(path), read_only=True) as src, duckdb.connect(str(other)) as con:
        con.execute(v1.sql)
        con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
                    "applied_ns BIGINT NOT NULL)")  # fmt: skip
        con.execute("INSERT INTO schema_version VALUES (1, ?, 0)", [v1.name])
        events = src.sql("SELECT * FROM events").to_arrow_table()
        con.register("copied", events)
        con.execute("INSERT INTO events SELECT * FROM copied")
        assert migrate(con) == available()[-1].version
        # the migrated events stay rows of events_generic (their typed copies say so); Echo's commit kept
        # them only in the typed tables, with their other attributes in attr_sets
        typed = "SELECT * EXCLUDE (attrs_id, in_generic) FROM {} ORDER BY event_id"
        staged = con.execute(typed.format("collectives")).fetchall()
        intervals = con.execute(typed.format("host_activity")).fetchall()
        assert con.execute("SELECT bool_and(in_generic) FROM host_activity").fetchall() == [(True,)]
        migrated = con.execute("SELECT * FROM events ORDER BY event_id").fetchall()
    with duckdb.connect(str(path), read_only=True) as src:
        assert staged == src.execute(typed.format("collectives")).fetchall()
        assert intervals == src.execute(typed.format("host_activity")).fetchall()
        # the off-CPU interval rebuilds exactly; the CUDA calls came without rankecho.enter_ns/return_ns,
        # which a typed row would add, so they keep their rows as sent
        assert src.execute("SELECT event_id FROM host_activity WHERE NOT in_generic").fetchall() == [("o",)]
        ingested = src.execute("SELECT * FROM events ORDER BY event_id").fetchall()
    assert len(staged) == 1 and len(intervals) == 3
    assert [r[:-1] for r in migrated] == [r[:-1] for r in ingested]  # the view rebuilds every event
    assert [json.loads(r[-1]) for r in migrated] == [json.loads(r[-1]) for r in ingested]


@pytest.mark.parametrize(
    ("in_flight", "held_by", "expected"),
    [
        # woken, then kept off the CPU by another workload for 4 of its 10 ms: a sleep, then contention
        ("", "other", [("x", "offcpu", 0, 6, "sleeping"), ("x/runq", "runq", 6, 10, "cpu_contention")]),
        # the same inside a sync: the sync counts the time; the wait is kept for the GPU rule
        ("cudaStreamSynchronize", "other", [("x", "offcpu", 0, 6, None), ("x/runq", "runq", 6, 10, None)]),
        # behind another rank of the job: the node's ranks sharing cores, not split
        ("", "job", [("x", "offcpu", 0, 10, "sleeping")]),
    ],
)
def test_a_woken_threads_run_queue_wait_behind_another_workload_is_its_own_row(
    echo_inproc: Echo, in_flight: str, held_by: str, expected: list[tuple[Any, ...]]
) -> None:
    attrs = {c.OFFCPU_STATE: "sleeping", c.CALL_IN_FLIGHT: in_flight, c.TID: 4244, c.EVENT_ID: "x",
             c.RUNQ_MS: 4.0, c.PREEMPTED_BY: held_by}  # fmt: skip
    grpc_export(
        echo_inproc.grpc_address, metrics_request(RESOURCE, [Point(c.M_OFFCPU, T0, 10.0, attrs)]), TEST_TOKEN
    )
    got = rows(
        echo_inproc,
        f"SELECT event_id, kind, (start_ns - {T0}) // 1000000, (end_ns - {T0}) // 1000000, category "
        "FROM host_activity ORDER BY event_id",
    )
    assert got == expected
