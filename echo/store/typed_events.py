"""How an agent event kept only in a typed table is rebuilt as an ``events`` row: one list per table.

The store keeps each event once (schema v7). A node agent's collective or raw interval is stored only in
``collectives`` / ``host_activity``: its per-event attributes in typed columns, every other attribute
(the process's resource, the thread, a collective's datatype or stream: values repeated across many
events) once per distinct combination in ``attr_sets``, cited by a small integer ``attrs_id``. ``events``
is a view that rebuilds the seed's columns from them (:func:`events_view_sql`).

Each :class:`Field` says which attribute a typed column came from and how to write it back. The same list
decides, per event at ingest, whether the rebuilt row equals the one sent (:func:`exact_sql`): an event
whose attributes the typed columns cannot reproduce (a malformed value, an unexpected type, an extra key
set to its default) keeps its original row in ``events_generic`` and its typed copy says so
(``in_generic``), so nothing a producer sent is changed or lost. The attributes left for ``attr_sets`` are
the original object minus the fields' keys (:func:`strip_patch`).

Usage::

    con.execute(events_view_sql())          # after migrating: (re)create the view
    con.execute(exact_sql("collectives"))    # in the writer's commit, over this commit's typed rows
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rankecho.shared import contract as c

NS_PER_MS = 1e6


@dataclass(frozen=True)
class Field:
    """One attribute of a typed event: its key and the SQL that writes its value back from the typed
    row (NULL: the attribute was absent)."""

    key: str
    rebuild: str


def _ms(column: str, omit_zero: bool = False) -> str:
    """A ``*_ns`` column sent as a millisecond attribute (the agent sends ms with at most 6 decimals)."""
    value = f"{column} / {NS_PER_MS:g}"
    return f"CASE WHEN {column} <> 0 THEN {value} END" if omit_zero else value


def _unless(column: str, default: str) -> str:
    """A column whose default value stands for an absent attribute (staging coalesces absent to it)."""
    return f"CASE WHEN {column} IS DISTINCT FROM {default} THEN {column} END"


_PRE_CLASSES = ("allocator", "slow_gpu", "memcpy", "cpu_contention", "sleeping")
COLLECTIVE_FIELDS: tuple[Field, ...] = (
    Field(c.OP, "op"),
    Field(c.COMM_ID, "comm_id"),
    Field(c.SEQ, "seq"),
    Field(c.SEQ_ALIGNED, "seq_aligned"),
    Field(c.COMM_RANK, "comm_rank"),
    Field(c.COMM_NRANKS, "comm_nranks"),
    Field(c.BYTES, "bytes"),
    Field(c.IN_GROUP, _unless("in_group", "false")),
    Field(c.ENTER_NS, "enter_ns"),
    Field(c.RETURN_NS, "return_ns"),
    Field(c.COMPLETE_NS, "complete_ns"),
    Field(c.CAUSAL_CHAIN_ID, "causal_chain_id"),
    Field(c.PRE_WINDOW_MS, _ms("pre_window_ns")),
    *(Field(f"{c.PRE_PREFIX}{k}_ms", _ms(f"pre_{k}_ns", omit_zero=True)) for k in _PRE_CLASSES),
    Field(c.PRE_PRESYNC_MS, _ms("pre_presync_ns")),
    Field(c.LAUNCHES, "launches"),
    Field(c.JOB_ID, _unless("job_id", "''")),
    Field(c.STACK_ID, "stack_id"),
    *(Field(f"{c.PRE_PREFIX}{k}{c.PRE_STACK_SUFFIX}", f"pre_{k}_stack") for k in _PRE_CLASSES),
    Field(c.PRE_ONCPU_STACK, "pre_oncpu_stack"),
    Field(c.PRE_ONCPU_SAMPLES, "pre_oncpu_samples"),
)
"""A collective's per-call attributes (``rankecho.nccl.collective``); timestamp = enter_ns."""

HOST_KINDS: dict[str, str] = {
    "sync": c.M_CUDA_SYNC, "malloc": c.M_CUDA_MALLOC, "free": c.M_CUDA_FREE, "memcpy": c.M_CUDA_MEMCPY,
    "offcpu": c.M_OFFCPU,
}  # fmt: skip
"""host_activity.kind -> the metric its raw interval came as (the 'runq' rows are split from offcpu)."""
_CUDA = "kind <> 'offcpu'"
HOST_FIELDS: tuple[Field, ...] = (
    Field(c.CUDA_CALL, f"CASE WHEN {_CUDA} THEN cuda_call END"),
    Field(c.CALL_IN_FLIGHT, "CASE WHEN kind = 'offcpu' THEN cuda_call END"),
    Field(c.ENTER_NS, f"CASE WHEN {_CUDA} THEN start_ns END"),
    Field(c.RETURN_NS,
          f"CASE WHEN {_CUDA} THEN start_ns + CAST(round(value_double * {NS_PER_MS:g}) AS BIGINT) END"),
    Field(c.BYTES, "bytes"),
    Field(c.OFFCPU_STATE, "state"),
    Field(c.PREEMPTED_BY, "preempted_by"),
    Field(c.RUNQ_MS, "runq_ms"),
    Field(c.CAUSAL_CHAIN_ID, "causal_chain_id"),
    Field(c.JOB_ID, _unless("job_id", "''")),
    Field(c.STACK_ID, "stack_id"),
)
"""A raw interval's per-event attributes (CUDA calls: enter/return; off-CPU: state, call in flight)."""

FIELDS: dict[str, tuple[Field, ...]] = {"collectives": COLLECTIVE_FIELDS, "host_activity": HOST_FIELDS}
GENERATED: dict[str, tuple[str, ...]] = {
    "collectives": ("event_id", "stream_key", "inst_key", "node_key", "thread_key"),
    "host_activity": ("event_id", "thread_key"),
}
"""The columns each typed table computes when read (schema v8, virtual generated columns): nothing
inserts them, so staging leaves them out (``event_id`` is stored as ``event_id_sent`` when needed)."""

TIMESTAMP: dict[str, str] = {"collectives": "enter_ns", "host_activity": "start_ns"}
"""The typed column that is the event's ``timestamp_ns``."""
VALUE: dict[str, str] = {
    "collectives": f"(coalesce(complete_ns, return_ns) - enter_ns) / {NS_PER_MS:g}",
    "host_activity": "value_double",
}
"""The event's ``value_double``: a collective's is the ms from enter to completion (or return), derived
(8 B a row less to store); an interval's is stored as sent (its end is split by run-queue waits)."""
METRIC: dict[str, str] = {
    "collectives": f"'{c.M_COLLECTIVE}'",
    "host_activity": "CASE kind " + " ".join(f"WHEN '{k}' THEN '{m}'" for k, m in HOST_KINDS.items())
    + " END",
}
"""The ``metric_name`` of a typed row."""
EVENT_ROWS: dict[str, str] = {"collectives": "true", "host_activity": "kind <> 'runq'"}
"""Typed rows that are an event (host_activity's 'runq' rows are a second piece of an off-CPU event)."""


def derived_id(table: str) -> str:
    """The event id a typed row computes from its own columns (``contract.event_id`` in SQL; schema v8's
    generated ``event_id`` uses it when ``event_id_sent`` is NULL). Unqualified column names."""
    parts = ["node_id", "pid", "process_start_ns", METRIC[table], "tid", TIMESTAMP[table], "causal_chain_id"]
    joined = ", ".join(f"coalesce(CAST({p} AS VARCHAR), '')" for p in parts)
    return f"left(md5(concat_ws(chr(31), {joined})), 16)"


TABLE_OF_METRIC: dict[str, str] = {
    c.M_COLLECTIVE: "collectives", **{metric: "host_activity" for metric in HOST_KINDS.values()}
}
"""The typed table an agent metric is staged into."""
STRIP_KEYS: dict[str, frozenset[str]] = {
    table: frozenset(f.key for f in fields) for table, fields in FIELDS.items()
}
"""The attribute keys a typed table holds in columns."""
REST_COLUMN = "rest_json"
"""A decoded batch's column with each typed-table event's attributes less :data:`STRIP_KEYS` (ingest
computes it; a table of the ``events`` shape without it gets it from ``json_merge_patch``)."""


def _quoted(key: str) -> str:
    return "'" + key.replace("'", "''") + "'"


def _path(key: str) -> str:
    return _quoted('$."' + key + '"')


def strip_patch(table: str) -> str:
    """A JSON merge patch (RFC 7386) that removes the table's field keys from an attribute object."""
    return json.dumps({f.key: None for f in FIELDS[table]}, separators=(",", ":"))


def rebuilt_attrs(table: str) -> str:
    """SQL for the ``attrs_json`` of a typed row joined with its ``attr_sets`` row ``a``: the set plus
    the fields (a NULL field is left out). Field expressions name the typed row's columns bare: no
    ``attr_sets`` column shares a name with them."""
    pairs = ", ".join(f"{_quoted(f.key)}, {f.rebuild}" for f in FIELDS[table])
    return f"json_merge_patch(coalesce(a.attrs_json, '{{}}'), json_merge_patch('{{}}', json_object({pairs})))"


SENT = (
    "SELECT event_id AS sent_id, timestamp_ns AS sent_ts, signal AS sent_signal, value_double AS sent_vd, "
    "value_int AS sent_vi, attrs_json AS sent_attrs, json_extract(attrs_json, {paths}) AS sent_fields "
    "FROM {source}"
)
"""The event as sent, under names no typed column has, for :func:`exact_sql`."""


def sent_sql(table: str, source: str, with_rest: bool = False) -> str:
    """Select from ``source`` (rows of the events shape) what :func:`exact_sql` compares, per event, and
    its ``rest_json`` as ``sent_rest`` when it has one."""
    paths = "[" + ", ".join(_path(f.key) for f in FIELDS[table]) + "]"
    sql = SENT.format(paths=paths, source=source)
    return sql.replace(" FROM ", f", {REST_COLUMN} AS sent_rest FROM ", 1) if with_rest else sql


def exact_sql(table: str) -> str:
    """A predicate over a typed row (bare columns) joined with its :func:`sent_sql` row: true when every
    field rebuilds to exactly the value sent (compared as JSON text, so the type counts too) and the
    timestamp is the typed one. Attributes outside the fields are kept verbatim anyway."""
    checks = [f"sent_ts = {TIMESTAMP[table]}", "sent_signal = 'metric'", "sent_vi IS NULL",
              f"sent_vd IS NOT DISTINCT FROM {VALUE[table]}"]
    for i, f in enumerate(FIELDS[table], start=1):
        checks.append(f"sent_fields[{i}]::VARCHAR IS NOT DISTINCT FROM to_json({f.rebuild})::VARCHAR")
    return " AND ".join(f"({check})" for check in checks)


EVENT_COLUMNS = ("event_id", "timestamp_ns", "received_ns", "signal", "cluster_id", "node_id", "metric_name",
                 "rank", "nranks", "value_double", "value_int", "causal_chain_id", "attrs_json")  # fmt: skip
"""The seed's ``events`` columns, in order (schema v1)."""


def _typed_select(table: str) -> str:
    return (
        f"SELECT t.event_id, t.{TIMESTAMP[table]} AS timestamp_ns, t.received_ns, 'metric' AS signal, "
        f"t.cluster_id, t.node_id, {METRIC[table]} AS metric_name, t.rank, t.nranks, "
        f"{VALUE[table]} AS value_double, "
        f"CAST(NULL AS BIGINT) AS value_int, t.causal_chain_id, "
        f"CAST({rebuilt_attrs(table)} AS VARCHAR) AS attrs_json\n"
        f"FROM (SELECT * FROM {table} WHERE NOT in_generic AND {EVENT_ROWS[table]}) t\n"
        f"LEFT JOIN attr_sets a ON a.attrs_id = t.attrs_id"
    )


def events_view_sql() -> str:
    """``CREATE OR REPLACE VIEW events``: the stored generic rows plus every typed-only event rebuilt."""
    columns = ", ".join(EVENT_COLUMNS)
    return (
        f"CREATE OR REPLACE VIEW events AS\nSELECT {columns} FROM events_generic\nUNION ALL\n"
        + "\nUNION ALL\n".join(_typed_select(t) for t in FIELDS)
    )
