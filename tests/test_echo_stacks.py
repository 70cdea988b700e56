"""Call stacks in Echo's store (docs/stacks.md): staging of ``rankecho.stack`` points and the stack ids on
collectives and raw intervals, migration 006 on an older store, retention of the stacks table.

The scenario here (also used by tests/test_analysis_stacks.py and tests/test_mcp_stacks.py): a 4-rank
job whose rank 3 stalls in cudaMalloc (``allocate_cache``) every third step, sent as the agent sends it
(docs/contract.md) to a real Echo over OTLP/gRPC: collectives with the pre-call breakdown and its stack
ids, raw intervals with their stacks, each distinct stack shipped once per node as a ``rankecho.stack``
point (node-1's allocator stack only after the events that cite it), and one id never shipped."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import local_settings
from echo_helpers import TEST_TOKEN, grpc_export, rows

from rankecho.echo.app import Echo
from rankecho.echo.store.migrate import available, migrate
from rankecho.echo.store.retention import Retention, RetentionPolicy
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request
from rankecho.shared.stacks import join_frames, stack_id

T0 = 1_790_000_000_000_000_000  # 2026-09-21: Echo refuses times ahead of its clock
STEP_NS = 100_000_000
STEPS = 30
WORLD = 4
LATE_RANK = 3
LATE_NS = 40_000_000
COMM = "w0rld"
JOB = "torchelastic:stacks"

ALLOC = [
    "cudaMalloc",
    "allocate_cache",
    "train.py:forward:88",
    "train.py:train_step:120",
    "train.py:main:200",
]
FETCH = ["__clock_nanosleep", "fetch_batch", "train.py:train_step:110", "train.py:main:200"]
FORWARD = ["forward", "train.py:train_step:115", "train.py:main:200"]
ENTER = ["ncclAllReduce", "train.py:train_step:130", "train.py:main:200"]
NEVER_SHIPPED = ["mystery", "[unknown]"]
ALLOC_LEAD = "cudaMalloc <- allocate_cache <- train.py:forward:88 <- train.py:train_step:120"


def late(rank: int, seq: int) -> bool:
    return rank == LATE_RANK and seq % 3 == 1


def jitter(rank: int, seq: int) -> int:
    """A deterministic +-0.3 ms of arrival noise, so the job has a noise level to measure."""
    return ((rank * 7919 + seq * 104729) % 601 - 300) * 1000


def node_of(rank: int) -> str:
    return f"node-{rank // 2}"


def resource(rank: int) -> dict[str, Any]:
    return {
        c.CLUSTER_NAME: "c1",
        c.NODE_NAME: node_of(rank),
        c.RANK: rank,
        c.NRANKS: WORLD,
        c.PROCESS_PID: 1000 + rank,
        c.PROCESS_START_NS: 777,
        c.SERVICE_INSTANCE_ID: f"{node_of(rank)}/1",
        c.JOB_ID: JOB,
    }


def stack_point(frames: list[str], at_ns: int, truncated: bool = False) -> Point:
    return Point(
        c.M_STACK,
        at_ns,
        len(frames),
        {c.STACK_ID: stack_id(frames), c.STACK_FRAMES: join_frames(frames), c.STACK_TRUNCATED: truncated},
    )


@dataclass
class Scenario:
    """The points per rank; ``late_stacks`` are node-1's allocator stack points, sent after the rest."""

    points: dict[int, list[Point]] = field(default_factory=dict)
    late_stacks: list[Point] = field(default_factory=list)

    def send(self, address: str) -> None:
        for rank, points in self.points.items():
            grpc_export(address, metrics_request(resource(rank), points), TEST_TOKEN)
        grpc_export(address, metrics_request(resource(LATE_RANK), self.late_stacks), TEST_TOKEN)


def enter_ns(rank: int, seq: int) -> int:
    return T0 + seq * STEP_NS + 50_000_000 + jitter(rank, seq) + (LATE_NS if late(rank, seq) else 0)


def complete_ns(seq: int) -> int:
    return max(enter_ns(r, seq) for r in range(WORLD)) + 5_000_000


def build(intervals: bool = True) -> Scenario:
    """The scenario; ``intervals`` False: an agent that sends only its pre-call breakdown (no raw
    intervals), so the stacks come from the breakdown's stack ids alone."""
    s = Scenario()
    for rank in range(WORLD):
        tid = 2000 + rank
        pts: list[Point] = []
        # node-0's ranks ship the stacks they use; node-1's allocator stack comes last (late_stacks)
        shipped = [FETCH, FORWARD, ENTER] if rank in (0, 2) else []
        pts += [stack_point(f, T0 - 1000 + i) for i, f in enumerate(shipped)]
        for seq in range(STEPS):
            enter = enter_ns(rank, seq)
            prev = complete_ns(seq - 1) if seq else enter - 60_000_000
            window_ms = (enter - prev) / 1e6
            alloc_ms = LATE_NS / 1e6 if late(rank, seq) else 0.0
            attrs: dict[str, Any] = {
                c.OP: "ncclAllReduce",
                c.COMM_ID: COMM,
                c.SEQ: seq,
                c.SEQ_ALIGNED: True,
                c.COMM_RANK: rank,
                c.COMM_NRANKS: WORLD,
                c.BYTES: 1 << 20,
                c.ENTER_NS: enter,
                c.RETURN_NS: enter + 10_000,
                c.COMPLETE_NS: complete_ns(seq),
                c.CAUSAL_CHAIN_ID: f"{COMM}:{seq}",
                c.TID: tid,
                c.EVENT_ID: f"coll-{rank}-{seq}",
                c.PRE_WINDOW_MS: window_ms,
                c.PRE_PREFIX + "sleeping_ms": 5.0,
                c.PRE_PREFIX + "sleeping" + c.PRE_STACK_SUFFIX: stack_id(FETCH),
                c.PRE_ONCPU_STACK: stack_id(NEVER_SHIPPED if (rank, seq) == (1, 0) else FORWARD),
                c.PRE_ONCPU_SAMPLES: 4,
                c.STACK_ID: stack_id(ENTER if rank else NEVER_SHIPPED),
            }
            if alloc_ms:
                attrs[c.PRE_PREFIX + "allocator_ms"] = alloc_ms
                attrs[c.PRE_PREFIX + "allocator" + c.PRE_STACK_SUFFIX] = stack_id(ALLOC)
            if alloc_ms and intervals:
                pts.append(
                    Point(
                        c.M_CUDA_MALLOC,
                        enter - LATE_NS - 2_000_000,
                        alloc_ms,
                        {
                            c.CUDA_CALL: "cudaMalloc",
                            c.TID: tid,
                            c.EVENT_ID: f"m-{rank}-{seq}",
                            c.STACK_ID: stack_id(ALLOC),
                        },
                    )
                )
            if intervals:
                pts.append(
                    Point(
                        c.M_OFFCPU,
                        enter - 30_000_000 - (LATE_NS if alloc_ms else 0),
                        5.0,
                        {
                            c.OFFCPU_STATE: "sleeping",
                            c.CALL_IN_FLIGHT: "",
                            c.TID: tid,
                            c.EVENT_ID: f"o-{rank}-{seq}",
                            c.STACK_ID: stack_id(FETCH),
                        },
                    )
                )
            pts.append(Point(c.M_COLLECTIVE, enter, 5.0, attrs))
        s.points[rank] = pts
    s.late_stacks = [stack_point(ALLOC, T0 + STEPS * STEP_NS)]
    return s


def episodes() -> list[int]:
    return [seq for seq in range(STEPS) if late(LATE_RANK, seq)]


def scenario_store(path: Path, intervals: bool = True) -> Path:
    """A store file holding the scenario, ingested by a real Echo over OTLP/gRPC (closed again)."""
    with Echo(local_settings(path)) as echo:
        build(intervals).send(echo.grpc_address)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario_store(tmp_path_factory.mktemp("stacks") / "s.db")


def read(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_each_distinct_stack_is_stored_once_with_the_node_that_sent_it_first(store: Path) -> None:
    got = read(store, "SELECT stack_id, frames, depth, truncated, node_id FROM stacks ORDER BY first_seen_ns")
    assert got == [
        (stack_id(FETCH), FETCH, 4, False, "node-0"),  # rank 2 on node-1 shipped the same three again
        (stack_id(FORWARD), FORWARD, 3, False, "node-0"),
        (stack_id(ENTER), ENTER, 3, False, "node-0"),
        (stack_id(ALLOC), ALLOC, 5, False, "node-1"),  # sent after the events citing it
    ]


def test_collectives_and_intervals_carry_the_stack_ids_they_cited(store: Path) -> None:
    late_call = read(
        store,
        "SELECT stack_id, pre_allocator_stack, pre_sleeping_stack, pre_oncpu_stack, "
        "pre_oncpu_samples, pre_slow_gpu_stack FROM collectives WHERE event_id = 'coll-3-4'",
    )
    assert late_call == [(stack_id(ENTER), stack_id(ALLOC), stack_id(FETCH), stack_id(FORWARD), 4, None)]
    on_time = read(store, "SELECT pre_allocator_stack FROM collectives WHERE event_id = 'coll-3-5'")
    assert on_time == [(None,)]
    assert read(
        store, "SELECT kind, category, stack_id, count(*) FROM host_activity GROUP BY ALL ORDER BY 1"
    ) == [
        ("malloc", "allocator", stack_id(ALLOC), len(episodes())),
        ("offcpu", "sleeping", stack_id(FETCH), WORLD * STEPS),
    ]
    # an id whose stack point never came stays a plain id: joins find no frames, nothing breaks
    unknown = read(
        store,
        "SELECT c.stack_id, s.frames FROM collectives c LEFT JOIN stacks s USING (stack_id) "
        "WHERE c.event_id = 'coll-0-3'",
    )
    assert unknown == [(stack_id(NEVER_SHIPPED), None)]


def test_truncated_deep_and_malformed_stack_points(tmp_path: Path) -> None:
    short = ["[unknown]"]
    deep = [f"pkg/module_{i}.py:function_with_a_long_name_{i}:{i}" for i in range(127)]  # the depth cap
    with Echo(local_settings(tmp_path / "s.db")) as echo:
        points = [
            stack_point(short, T0, truncated=True),
            stack_point(deep, T0 + 4, truncated=True),
            Point(c.M_STACK, T0 + 1, 0, {c.STACK_ID: "no-frames"}),
            Point(c.M_STACK, T0 + 2, 0, {c.STACK_FRAMES: "f\ng"}),  # no id
            Point(c.M_STACK, T0 + 3, 1, {c.STACK_ID: "empty", c.STACK_FRAMES: ""}),
        ]
        grpc_export(echo.grpc_address, metrics_request(resource(0), points), TEST_TOKEN)
        assert rows(echo, "SELECT stack_id, frames, depth, truncated FROM stacks ORDER BY depth") == [
            (stack_id(short), short, 1, True),
            (stack_id(deep), deep, 127, True),  # stored whole: the id is the hash of these frames
        ]


def test_migration_006_fills_a_v5_store_from_its_events(tmp_path: Path, store: Path) -> None:
    old = tmp_path / "v5.db"
    with duckdb.connect(str(store), read_only=True) as src, duckdb.connect(str(old)) as con:
        con.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
            "applied_ns BIGINT NOT NULL)"
        )
        for m in available()[:5]:
            con.execute(m.sql)
            con.execute("INSERT INTO schema_version VALUES (?, ?, 0)", [m.version, m.name])
        for table in ("events", "collectives", "host_activity"):  # the v5 columns of the fresh store's rows
            columns = ", ".join(r[0] for r in con.execute(f"DESCRIBE {table}").fetchall())
            con.register("copied", src.sql(f"SELECT {columns} FROM {table}").to_arrow_table())
            con.execute(f"INSERT INTO {table} SELECT * FROM copied")
            con.unregister("copied")
        assert migrate(con) == available()[-1].version
        compare = [
            "SELECT stack_id, frames, depth, truncated, node_id FROM stacks ORDER BY 1",
            "SELECT event_id, stack_id, pre_allocator_stack, pre_sleeping_stack, pre_oncpu_stack, "
            "pre_oncpu_samples FROM collectives ORDER BY 1",
            "SELECT event_id, stack_id FROM host_activity ORDER BY 1",
        ]
        migrated = [con.execute(sql).fetchall() for sql in compare]
    assert migrated == [read(store, sql) for sql in compare]
    assert len(migrated[0]) == 4 and migrated[1][0][1] is not None


def test_retention_drops_old_stacks_no_kept_row_cites(tmp_path: Path) -> None:
    old, old_cited, young = ["old_function", "main"], ["old_but_cited", "main"], ["young", "main"]
    path = scenario_store(tmp_path / "s.db")
    with Echo(local_settings(path)) as echo:
        points = [
            stack_point(old, T0 - 100 * 10**9),
            stack_point(old_cited, T0 - 100 * 10**9),
            stack_point(young, T0 + 2 * 10**9),
            Point(
                c.M_OFFCPU,
                T0 - 100 * 10**9,
                5.0,
                {
                    c.OFFCPU_STATE: "sleeping",
                    c.CALL_IN_FLIGHT: "",
                    c.TID: 2000,
                    c.EVENT_ID: "old-interval",
                    c.STACK_ID: stack_id(old),
                },
            ),
            Point(
                c.M_OFFCPU,
                T0 + 10**9,
                5.0,
                {
                    c.OFFCPU_STATE: "sleeping",
                    c.CALL_IN_FLIGHT: "",
                    c.TID: 2000,
                    c.EVENT_ID: "kept-interval",
                    c.STACK_ID: stack_id(old_cited),
                },
            ),
        ]
        grpc_export(echo.grpc_address, metrics_request(resource(0), points), TEST_TOKEN)
    now = T0 + 5 * 10**9
    with duckdb.connect(str(path)) as con:
        before = {r[0] for r in con.execute("SELECT stack_id FROM stacks").fetchall()}
        report = Retention(con, RetentionPolicy(retention_s=6.0), None, lambda: True, lambda: now).run_pass()
        after = {r[0] for r in con.execute("SELECT stack_id FROM stacks").fetchall()}
        left = con.execute("SELECT count(*) FROM host_activity WHERE event_id = 'old-interval'").fetchone()
    assert report.raw_cutoff_ns == T0 - 10**9 and left == (0,)
    assert before - after == {stack_id(old)} and report.stacks_deleted == 1
    assert {stack_id(old_cited), stack_id(young), stack_id(ALLOC)} <= after
