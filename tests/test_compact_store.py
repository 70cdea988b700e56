"""Schema v7: each event stored once. The agent's collectives and raw intervals live only in the typed
tables, and the ``events`` view rebuilds every event exactly as it was decoded; resends store nothing
twice without an index over every event id; an event the typed columns cannot reproduce keeps its row."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import inproc_echo
from echo_helpers import TEST_TOKEN, grpc_export, rows
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from rankecho.echo.app import Echo
from rankecho.echo.ingest.metrics import decode_metrics
from rankecho.echo.ingest.rows import ARROW_SCHEMA, AttrResolver, RowBatch
from rankecho.echo.queries import QUERIES
from rankecho.echo.store.typed_events import TABLE_OF_METRIC
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point, metrics_request
from rankecho.stress.shape import AgentShape, NodeModel, plant

STEP_NS = 100_000_000


def agent_requests(ranks: int = 16, steps: int = 12) -> list[ExportMetricsServiceRequest]:
    """What the node agents of a ``ranks``-rank job send over ``steps`` steps (their own tracker and
    encoder: stress.shape), with a planted straggler, one request per node flush."""
    start = time.time_ns() - 3600 * 10**9
    shape = AgentShape("fleet", "gpu", ranks=ranks, step_ns=STEP_NS, start_ns=start, gpus=True,
                       planted=plant(ranks, 1, STEP_NS, every=3))  # fmt: skip
    nodes = [NodeModel(shape, n) for n in range(shape.nodes)]
    requests = []
    for node in nodes:
        node.start(start)
    for k in range(steps):
        t = start + k * STEP_NS
        for node in nodes:
            node.step(k, t)
            node.window(t)
            body, _ = node.flush()
            requests.append(ExportMetricsServiceRequest.FromString(body))
    return requests


def decoded(requests: list[ExportMetricsServiceRequest]) -> dict[str, tuple[Any, ...]]:
    """The rows Echo's decoder makes of ``requests`` (what the store must give back), by event id."""
    out = {}
    resolver = AttrResolver(max_attributes=128)
    for request in requests:
        batch = RowBatch()
        decode_metrics(request, resolver, batch)
        for row in batch.to_arrow().select(ARROW_SCHEMA.names).to_pylist():
            out[row["event_id"]] = tuple(row[name] for name in ARROW_SCHEMA.names if name != "received_ns")
    return out


def stored(echo: Echo) -> dict[str, tuple[Any, ...]]:
    names = [name for name in ARROW_SCHEMA.names if name != "received_ns"]
    return {row[0]: tuple(row) for row in rows(echo, f"SELECT {', '.join(names)} FROM events")}


def same(sent: tuple[Any, ...], back: tuple[Any, ...]) -> bool:
    """Equal columns, and equal attribute objects (the view may order keys differently)."""
    return sent[:-1] == back[:-1] and json.loads(sent[-1]) == json.loads(back[-1])


@pytest.fixture(scope="module")
def requests() -> list[ExportMetricsServiceRequest]:
    return agent_requests()


def test_the_agents_events_are_stored_once_typed_and_the_view_rebuilds_them(
    requests: list[ExportMetricsServiceRequest], echo_inproc: Echo
) -> None:
    for request in requests:
        grpc_export(echo_inproc.grpc_address, request, TEST_TOKEN)
    sent = decoded(requests)
    back = stored(echo_inproc)
    assert back.keys() == sent.keys()
    wrong = [key for key in sent if not same(sent[key], back[key])]
    assert wrong == [], f"{len(wrong)} events changed, e.g. {sent[wrong[0]]} -> {back[wrong[0]]}"
    # every collective and raw interval is kept only in its typed table ...
    typed = sum(1 for row in sent.values() if row[5] in TABLE_OF_METRIC)
    assert typed > len(sent) / 2
    only_typed = rows(
        echo_inproc,
        "SELECT (SELECT count(*) FROM collectives WHERE NOT in_generic)"
        " + (SELECT count(*) FROM host_activity WHERE NOT in_generic AND kind <> 'runq')",
    )
    assert only_typed == [(typed,)]
    generic = rows(echo_inproc, "SELECT count(*) FROM events_generic WHERE metric_name IN "
                   f"({', '.join(repr(m) for m in TABLE_OF_METRIC)})")  # fmt: skip
    assert generic == [(0,)]
    # ... and their ids are the ones the agent gives a traced process's point: computed, not stored
    stored_ids = rows(echo_inproc, "SELECT (SELECT count(event_id_sent) FROM collectives), "
                      "(SELECT count(event_id_sent) FROM host_activity WHERE kind <> 'runq')")  # fmt: skip
    assert stored_ids == [(0, 0)]
    # ... and what the typed columns do not hold is stored once per process and thread, not per event
    ((sets,),) = rows(echo_inproc, "SELECT count(*) FROM attr_sets")
    assert 0 < sets <= 16 * 8  # 16 ranks, a few threads and a few collective shapes each
    assert sets * 20 < typed


def test_a_resend_stores_nothing_and_counts_the_skips(
    requests: list[ExportMetricsServiceRequest], echo_inproc: Echo
) -> None:
    half = requests[: len(requests) // 2]
    for request in half:
        grpc_export(echo_inproc.grpc_address, request, TEST_TOKEN)
    before = echo_inproc.stats.snapshot().duplicates
    for request in [*half, *requests]:  # the first half twice more, then everything
        grpc_export(echo_inproc.grpc_address, request, TEST_TOKEN)
    ((count, distinct),) = rows(echo_inproc, "SELECT count(*), count(DISTINCT event_id) FROM events")
    assert count == distinct == len(decoded(requests))
    sent_again = sum(len(decoded([r])) for r in half) * 2
    assert echo_inproc.stats.snapshot().duplicates - before == sent_again


def test_an_event_the_typed_columns_cannot_reproduce_keeps_its_row(tmp_path: Path) -> None:
    """A seq sent as text, an in_group sent as false (the typed column's default), a collective without
    its enter attribute, a value that is not its enter-to-return time: each is analysed from its typed
    row, and stored as sent."""
    resource = {c.CLUSTER_NAME: "c1", c.NODE_NAME: "node-a", c.RANK: 0, c.NRANKS: 2, c.PROCESS_PID: 7}
    t0 = time.time_ns() - 10**9

    def point(event_id: str, seq: Any, value: float = 1.5, **extra: Any) -> Point:
        attrs = {c.OP: "ncclAllReduce", c.COMM_ID: "ab", c.SEQ: seq, c.SEQ_ALIGNED: True, c.ENTER_NS: t0,
                 c.RETURN_NS: t0 + 1_500_000, c.CAUSAL_CHAIN_ID: f"ab:{seq}", c.EVENT_ID: event_id,
                 **extra}  # fmt: skip
        return Point(c.M_COLLECTIVE, t0, value, {k: v for k, v in attrs.items() if v is not None})

    points = [point("exact", 1), point("text-seq", "2"), point("explicit-false", 3, **{c.IN_GROUP: False}),
              point("no-enter", 4, **{c.ENTER_NS: None}),
              point("other-value", 5, value=2.0)]  # not the ms from enter to return: stored, not derived
    odd = {"text-seq", "explicit-false", "no-enter", "other-value"}
    with inproc_echo(tmp_path / "odd.db") as echo:
        grpc_export(echo.grpc_address, metrics_request(resource, points), TEST_TOKEN)
        flags = dict(rows(echo, "SELECT event_id, in_generic FROM collectives"))
        assert flags == {"exact": False} | {name: True for name in odd}
        assert {r[0] for r in rows(echo, "SELECT event_id FROM events_generic")} == odd
        back = dict(rows(echo, "SELECT event_id, attrs_json FROM events"))
        values = dict(rows(echo, "SELECT event_id, value_double FROM events"))
    assert json.loads(back["text-seq"])[c.SEQ] == "2"
    assert json.loads(back["explicit-false"])[c.IN_GROUP] is False
    assert c.ENTER_NS not in json.loads(back["no-enter"])
    assert json.loads(back["exact"])[c.SEQ] == 1 and c.IN_GROUP not in json.loads(back["exact"])
    assert values["exact"] == 1.5 and values["other-value"] == 2.0


GPU_HOURS_OVER_THE_VIEW = """
WITH gpus AS (
    SELECT cluster_id, node_id, rank,
           max(json_extract_string(attrs_json, '$."rankecho.gpu.model"')) AS gpu_model,
           (max(timestamp_ns) - min(timestamp_ns)) / 3.6e12 AS hours
    FROM events
    WHERE rank IS NOT NULL
      AND ($start_ns IS NULL OR timestamp_ns >= $start_ns)
      AND ($end_ns IS NULL OR timestamp_ns < $end_ns)
      AND ($cluster_id IS NULL OR cluster_id = $cluster_id)
      AND ($job_id IS NULL OR coalesce(json_extract_string(attrs_json, '$."rankecho.job.id"'), '') = $job_id)
    GROUP BY cluster_id, node_id, rank
)
SELECT cluster_id, node_id, gpu_model, count(*) AS gpus, sum(hours) AS gpu_hours
FROM gpus GROUP BY cluster_id, node_id, gpu_model ORDER BY cluster_id, node_id, gpu_model
"""
"""gpu_hours as defined on the seed's ``events`` (attributes rebuilt per row): the oracle for the named
query, which reads each typed row's attributes once per attribute set."""


def test_gpu_hours_reads_the_typed_tables_as_the_view_defines_it(
    requests: list[ExportMetricsServiceRequest], echo_inproc: Echo
) -> None:
    for request in requests:
        grpc_export(echo_inproc.grpc_address, request, TEST_TOKEN)
    # a GPU-less rank's health point (generic) and one collective kept as sent (seq as text)
    t = time.time_ns() - 3000 * 10**9
    odd = Point(c.M_COLLECTIVE, t, 12.0, {c.SEQ: "7", c.COMM_ID: "ab", c.OP: "ncclAllReduce",
                                          c.ENTER_NS: t, c.EVENT_ID: "odd-1"})  # fmt: skip
    exact = Point(c.M_COLLECTIVE, t, 1.5, {c.SEQ: 7, c.COMM_ID: "ab", c.OP: "ncclAllReduce", c.ENTER_NS: t,
                                           c.RETURN_NS: t + 1_500_000, c.SEQ_ALIGNED: True,
                                           c.CAUSAL_CHAIN_ID: "ab:7", c.EVENT_ID: "exact-1"})  # fmt: skip
    lone = Point(c.M_HEALTH, t, 0.5, {c.EVENT_ID: "lone-1"})
    for point, rank, model in ((odd, 90, "NVIDIA A100"), (lone, 91, None), (exact, 92, "NVIDIA B200")):
        resource = {c.CLUSTER_NAME: "fleet", c.NODE_NAME: "odd-node", c.RANK: rank,
                    **({c.GPU_MODEL: model} if model else {})}  # fmt: skip
        grpc_export(echo_inproc.grpc_address, metrics_request(resource, [point]), TEST_TOKEN)
    ((lo, hi, job),) = rows(echo_inproc, "SELECT min(enter_ns), max(enter_ns), max(job_id) FROM collectives")
    named = QUERIES["gpu_hours"]
    cases = [{}, {"job_id": job}, {"job_id": ""}, {"start_ns": (lo + hi) // 2},
             {"end_ns": (lo + hi) // 2, "cluster_id": "fleet"}, {"cluster_id": "elsewhere"}]  # fmt: skip
    for case in cases:
        params = {"start_ns": None, "end_ns": None, "cluster_id": None, "job_id": None} | case
        got = echo_inproc.reader.query(named.sql, named.bind(max_rows=1000, **params)).rows
        want = echo_inproc.reader.query(GPU_HOURS_OVER_THE_VIEW, params).rows
        assert [r[:4] for r in got] == [r[:4] for r in want], case
        assert [r[4] for r in got] == pytest.approx([r[4] for r in want], rel=1e-12), case
        if not case:
            models = {r[2] for r in got}
            assert {"NVIDIA A100", "NVIDIA B200", None} < models, models  # in_generic, typed only, none
    assert rows(echo_inproc, "SELECT in_generic FROM collectives WHERE event_id = 'exact-1'") == [(False,)]


def test_event_history_reads_whole_rows_only_for_the_events_it_returns(
    requests: list[ExportMetricsServiceRequest], echo_inproc: Echo
) -> None:
    for request in requests:
        grpc_export(echo_inproc.grpc_address, request, TEST_TOKEN)
    named = QUERIES["event_history"]
    oracle = (
        "SELECT timestamp_ns, cluster_id, node_id, rank, nranks, signal, metric_name, "
        "coalesce(value_double, value_int), causal_chain_id, left(attrs_json, 16385) FROM events "
        "WHERE ($start_ns IS NULL OR timestamp_ns >= $start_ns) "
        "AND ($end_ns IS NULL OR timestamp_ns < $end_ns) "
        "AND ($cluster_id IS NULL OR cluster_id = $cluster_id) AND ($node_id IS NULL OR node_id = $node_id) "
        "AND ($rank IS NULL OR rank = $rank) AND ($metric_name IS NULL OR metric_name = $metric_name) "
        "ORDER BY timestamp_ns, node_id, rank, event_id LIMIT $max_rows"
    )
    ((mid,),) = rows(echo_inproc, "SELECT median(timestamp_ns)::BIGINT FROM events")
    cases = [{"max_rows": 50}, {"max_rows": 10_000}, {"max_rows": 40, "start_ns": mid, "rank": 3},
             {"max_rows": 30, "metric_name": c.M_COLLECTIVE, "node_id": "gpu-1"},
             {"max_rows": 5, "end_ns": mid, "metric_name": c.M_OFFCPU}]  # fmt: skip
    for case in cases:
        params = {"start_ns": None, "end_ns": None, "cluster_id": None, "node_id": None, "rank": None,
                  "metric_name": None} | case  # fmt: skip
        got = echo_inproc.reader.query(named.sql, named.bind(**params), max_rows=20_000).rows
        want = echo_inproc.reader.query(oracle, params, max_rows=20_000).rows
        assert got and [r[:9] for r in got] == [r[:9] for r in want], case
        assert [json.loads(r[9]) for r in got] == [json.loads(r[9]) for r in want], case


V7_KEYS = {
    "stream_key": "hash(cluster_id, node_id, pid, process_start_ns, "
                  "CASE WHEN seq_aligned THEN '' ELSE agent_instance END, comm_id)",
    "inst_key": "CASE WHEN seq_aligned AND seq IS NOT NULL THEN hash(cluster_id, comm_id, seq) END",
    "node_key": "hash(cluster_id, node_id)",
    "thread_key": "hash(cluster_id, node_id, pid, tid)",
}  # fmt: skip
"""How schema v2-v7 staging computed the keys it stored (the values a v7 store holds)."""


def test_schema_v8_computes_the_keys_a_v7_store_held_and_keeps_every_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankecho.echo.store import migrate as migrations
    from rankecho.echo.store.typed_events import GENERATED

    shipped = migrations.available()
    monkeypatch.setattr(migrations, "available", lambda: [m for m in shipped if m.version <= 7])
    monkeypatch.setattr(migrations, "prepare", lambda con: None)  # this release stages v8 tables only
    monkeypatch.setitem(migrations.AFTER, 2, lambda con: None)  # (an empty store: nothing to backfill)
    con = duckdb.connect(str(tmp_path / "v7.db"))
    assert migrations.migrate(con) == 7
    keys = ", ".join(f"{sql} AS {name}" for name, sql in V7_KEYS.items())
    con.execute(  # a v7 store's rows: aligned and unaligned streams, a NULL seq, two clusters
        "INSERT INTO collectives BY NAME SELECT *, " + keys + " FROM ("
        "SELECT 'e' || i AS event_id, 'c' || (i % 2) AS cluster_id, 'n' || (i % 3) AS node_id, "
        "i % 8 AS rank, 100 + i % 8 AS pid, 5 AS process_start_ns, 'agent-' || (i % 3) AS agent_instance, "
        "200 + i % 5 AS tid, "
        "'ncclAllReduce' AS op, 'comm' || (i % 4) AS comm_id, CASE WHEN i % 11 <> 0 THEN i // 8 END AS seq, "
        "i % 5 <> 0 AS seq_aligned, 1000 + i AS enter_ns, 1500 + i AS return_ns, false AS in_generic "
        "FROM range(400) t(i))"
    )
    con.execute("INSERT INTO host_activity BY NAME SELECT 'h' || i AS event_id, 'c0' AS cluster_id, "
                "'n1' AS node_id, 101 AS pid, 200 + i % 5 AS tid, 'sync' AS kind, i AS start_ns, "
                "i + 5 AS end_ns, "
                f"{V7_KEYS['thread_key']} AS thread_key FROM range(50) t(i)")  # fmt: skip
    before = {t: con.execute(f"SELECT * FROM {t} ORDER BY event_id").fetchall() for t in GENERATED}
    describe = "SELECT column_name, data_type, is_nullable, column_default FROM duckdb_columns() "
    columns = {t: con.execute(f"{describe} WHERE table_name = '{t}' ORDER BY column_index").fetchall()
               for t in GENERATED}  # fmt: skip
    monkeypatch.undo()
    assert migrations.migrate(con) == shipped[-1].version
    for table, generated in GENERATED.items():
        now = con.execute(f"{describe} WHERE table_name = '{table}' ORDER BY column_index").fetchall()

        def shape(described: list[Any], generated: tuple[str, ...] = generated) -> list[Any]:
            """Names, types and defaults (a generated column's "default" is its expression: left out)."""
            return [r[:2] if r[0] in generated else r for r in described]

        assert shape(now) == [*shape(columns[table]), ("event_id_sent", "VARCHAR", True, None)]
        after = con.execute(f"SELECT * EXCLUDE (event_id_sent) FROM {table} ORDER BY event_id").fetchall()
        assert after == before[table]  # every id kept as it was sent (a v7 row's id is stored)
        computed = con.execute(
            "SELECT column_name FROM information_schema.columns "
            f"WHERE table_name = '{table}' AND is_generated = 'ALWAYS' ORDER BY ordinal_position"
        ).fetchall()
        assert [r[0] for r in computed] == list(generated)  # GENERATED says which, for staging
    (nulls,) = con.execute("SELECT count(*) FILTER (WHERE inst_key IS NULL) FROM collectives").fetchone()
    assert 0 < nulls < 400  # unaligned and seq-less calls have no instance
    con.close()


def test_a_typed_rows_computed_id_is_the_agents(tmp_path: Path) -> None:
    """contract.event_id (the agent) and schema v8's generated event_id (Echo) agree on every part, the
    absent ones included; a row with another id keeps it."""
    from rankecho.echo.store.migrate import migrate

    con = duckdb.connect(str(tmp_path / "ids.db"))
    migrate(con)
    cases = [("node-a", 7, 123, 10, 1_700_000_000_123_456_789, "c0ffee:3"),
             ("n\u00e9", 1, None, None, 5, None), ("node-b", 2**31, 2**62, 2**40, 2**62 + 1, "")]  # fmt: skip
    for i, (node, pid, start, tid, ts, chain) in enumerate(cases):
        con.execute("INSERT INTO collectives (node_id, pid, process_start_ns, tid, enter_ns, "
                    "causal_chain_id, event_id_sent) VALUES (?, ?, ?, ?, ?, ?, NULL)",
                    [node, pid, start, tid, ts, chain])  # fmt: skip
        for kind, metric in (("sync", c.M_CUDA_SYNC), ("offcpu", c.M_OFFCPU), ("memcpy", c.M_CUDA_MEMCPY)):
            con.execute("INSERT INTO host_activity (node_id, pid, process_start_ns, tid, kind, start_ns, "
                        "end_ns, causal_chain_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [node, pid, start, tid, kind, ts, ts + 1, chain])  # fmt: skip
            (got,) = con.execute("SELECT event_id FROM host_activity WHERE kind = ? AND start_ns = ?",
                                 [kind, ts]).fetchone()  # fmt: skip
            assert got == c.event_id(node, pid, start, metric, tid, ts, chain), (i, kind)
        (got,) = con.execute("SELECT event_id FROM collectives WHERE enter_ns = ?", [ts]).fetchone()
        assert got == c.event_id(node, pid, start, c.M_COLLECTIVE, tid, ts, chain), i
    con.execute("INSERT INTO collectives (enter_ns, event_id_sent) VALUES (9, 'from-an-sdk')")
    assert con.execute("SELECT event_id FROM collectives WHERE enter_ns = 9").fetchall() == [("from-an-sdk",)]
