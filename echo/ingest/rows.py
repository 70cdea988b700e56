"""Rows for the ``events`` table: attribute -> column resolution, event ids, and a columnar batch.

Decoders (``metrics.py``, ``traces.py``, ``logs.py``) walk one OTLP request and call
:meth:`RowBatch.add` once per data point / span / log record. Column mapping comes only from
``rankecho.shared.contract``: the resource identifies the process, so its attributes fill a column first and a
point attribute fills it only when the resource has no usable value; a point value that disagrees
stays in ``attrs_json`` and is counted as a conflict for that column. Keys consumed into a column leave
``attrs_json``, ``causal_chain_id`` is copied to its column and stays in ``attrs_json``.

Resolving an attribute set (merge, map, JSON-encode) is the expensive part of ingest, so
:class:`AttrResolver` caches the result per (resource, point attribute set).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from rankecho.echo.ingest import keys
from rankecho.echo.store.typed_events import REST_COLUMN, STRIP_KEYS, TABLE_OF_METRIC
from rankecho.shared import contract as c

ARROW_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()), ("timestamp_ns", pa.int64()), ("received_ns", pa.int64()),
        ("signal", pa.string()), ("cluster_id", pa.string()), ("node_id", pa.string()),
        ("metric_name", pa.string()), ("rank", pa.int32()), ("nranks", pa.int32()),
        ("value_double", pa.float64()), ("value_int", pa.int64()), ("causal_chain_id", pa.string()),
        ("attrs_json", pa.string()),
    ]
)  # fmt: skip
"""The ``events`` columns Echo writes, with the Arrow types matching schema v1 (pinned by a test)."""
REST_FIELD = pa.field(REST_COLUMN, pa.string())
"""Beside them in a decoded batch: the attributes a typed table would not hold (:class:`RestEncoder`)."""
_INT32 = (-(2**31), 2**31 - 1)
MIN_TIMESTAMP_NS = 946_684_800 * 10**9
"""2000-01-01: anything earlier is a zero, or seconds/milliseconds sent as nanoseconds."""
_INT_COLUMNS = ("rank", "nranks")
_CACHE_LIMIT = 20_000
_CACHE_MAX_PAIRS = 64

Pairs = Sequence[tuple[str, Any]]


@dataclass(frozen=True)
class Resolved:
    """Column values and ``attrs_json`` for one (resource, point attributes) combination."""

    cluster_id: str | None
    node_id: str | None
    rank: int | None
    nranks: int | None
    causal_chain_id: str | None
    attrs_json: str
    dropped: int
    conflicts: tuple[str, ...] = ()
    """Columns whose value a point attribute contradicted (the resource's value was kept)."""
    noteworthy: bool = False
    """True when a row with these attributes must be counted (dropped attributes or conflicts): one
    check on the hot path instead of two."""
    merged: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """The object ``attrs_json`` encodes, for :class:`RestEncoder`."""


class RestEncoder:
    """``attrs_json`` less a typed table's field keys (what ``attr_sets`` stores for a typed-only event),
    encoded like ``attrs_json`` and cached: most events of a process share it. Computed here, once per
    point in Python, because the same in SQL (``json_merge_patch``) costs ~20 us a row at commit."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], str] = {}

    def encode(self, table: str, merged: dict[str, Any]) -> str:
        drop = STRIP_KEYS[table]
        items = tuple([(k, v) for k, v in merged.items() if k not in drop])
        try:
            key = (table, items, tuple([v.__class__ for _, v in items]))  # True == 1: types are part of it
            hit = self._cache.get(key)
        except TypeError:  # an unhashable value (a kvlist): encode without caching
            return json.dumps(dict(items), separators=(",", ":"), ensure_ascii=False)
        if hit is None:
            hit = json.dumps(dict(items), separators=(",", ":"), ensure_ascii=False)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit


_REST = RestEncoder()


@dataclass
class Rejections:
    """Points refused while decoding, by reason, with the first message per reason (it names the fix)."""

    counts: Counter[str] = field(default_factory=Counter)
    messages: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, message: str, n: int = 1) -> None:
        self.counts[reason] += n
        self.messages.setdefault(reason, message)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        return "; ".join(f"{n} rejected ({r}): {self.messages[r]}" for r, n in sorted(self.counts.items()))


def _column_value(column: str, raw: Any) -> Any:
    """The typed column value, or None when it cannot be represented (the key then stays in attrs)."""
    if column in _INT_COLUMNS:
        if isinstance(raw, bool):
            return None
        try:
            value = int(raw)
        except (TypeError, ValueError):
            return None
        return value if _INT32[0] <= value <= _INT32[1] else None
    return raw if isinstance(raw, str) else None  # as docs/contract.md says: non-strings stay in attrs


class AttrResolver:
    """Maps attribute sets to columns + JSON; thread-safe through the GIL (dict ops only)."""

    def __init__(self, max_attributes: int) -> None:
        self.max_attributes = max_attributes
        self._cache: dict[tuple[bytes, Any, Any], Resolved] = {}

    def resolve(self, resource_key: bytes, resource: Pairs, point: Pairs) -> Resolved:
        """Columns + attrs_json for ``point`` (without its event id: see ``values.point_pairs``)."""
        if len(point) > _CACHE_MAX_PAIRS:  # rare and large: caching it would only hold memory
            return self._compute(resource, point)
        try:
            # Python says True == 1 == 1.0 (and hashes them alike): the value types are part of the key,
            # so a point sending 1 never reuses the JSON of one that sent true.
            types = tuple([repr(v) if v.__class__ is tuple else v.__class__ for _, v in point])
            key = (resource_key, tuple(point), types)
            hit = self._cache.get(key)
        except TypeError:  # a kvlist value: not hashable, resolve without caching
            return self._compute(resource, point)
        if hit is None:
            hit = self._compute(resource, point)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def _compute(self, resource: Pairs, point: Pairs) -> Resolved:
        point_map = dict(point)
        merged = dict(resource)
        merged.update(point_map)
        resource_map = dict(resource)
        columns: dict[str, Any] = {}
        conflicts: list[str] = []
        for column, sources in c.COLUMN_SOURCES.items():
            for attrs, key in ((a, k) for a in (resource_map, point_map) for k in sources if k in a):
                value = _column_value(column, attrs[key])
                if value is not None:
                    columns[column] = value
                    if merged.get(key) == attrs[key]:
                        del merged[key]
                    if attrs is resource_map and _contradicts(column, sources, point_map, value):
                        conflicts.append(column)
                    break
        for column, key in c.PROMOTED_COPIES.items():
            if key in merged:
                columns[column] = str(merged[key])
        dropped = 0
        if len(merged) > self.max_attributes:  # the producer's attributes are capped, Echo's own are not
            sent = [key for key in merged if key not in keys.ECHO_KEYS]
            for key in sent[self.max_attributes :]:
                del merged[key]
                dropped += 1
            if dropped:
                merged[keys.DROPPED_ATTRIBUTES] = dropped
        return Resolved(
            cluster_id=columns.get("cluster_id"),
            node_id=columns.get("node_id"),
            rank=columns.get("rank"),
            nranks=columns.get("nranks"),
            causal_chain_id=columns.get("causal_chain_id"),
            attrs_json=json.dumps(merged, separators=(",", ":"), ensure_ascii=False),
            dropped=dropped,
            conflicts=tuple(conflicts),
            noteworthy=bool(dropped or conflicts),
            merged=merged,
        )


def _contradicts(column: str, sources: Sequence[str], point: dict[str, Any], chosen: Any) -> bool:
    """True when a point attribute for ``column`` holds a usable value other than ``chosen``."""
    for key in sources:
        if key in point:
            value = _column_value(column, point[key])
            if value is not None and value != chosen:
                return True
    return False


def content_id(prefix: bytes, body: bytes) -> str:
    """Event id for producers that send none: a hash of resource + scope + name + the point itself."""
    return hashlib.blake2b(prefix + body, digest_size=16).hexdigest()


class RowBatch:
    """Rows decoded from one request, kept as tuples (cheapest to append) until :meth:`to_arrow`."""

    def __init__(self, received_ns: int | None = None) -> None:
        self.received_ns = time.time_ns() if received_ns is None else received_ns
        self.rows: list[tuple[Resolved, str, int, str, str, float | None, int | None]] = []
        self.rejected = Rejections()
        self.stored_with_fix: Counter[str] = Counter()
        """Events stored after a safe repair, by reason (non-finite value, dropped attributes)."""
        self.conflicts: Counter[str] = Counter()
        """Events whose point attributes contradicted the resource's, by column."""
        self.max_timestamp_ns = self.received_ns  # replaced by decoders that know the skew limit

    def __len__(self) -> int:
        return len(self.rows)

    def check_timestamp(self, ts: int, what: str) -> bool:
        """False (and counted) for timestamps of 0, before 2000, or too far in the future."""
        if ts < MIN_TIMESTAMP_NS:
            reason = "timestamp_zero" if ts == 0 else "timestamp_too_old"
            self.rejected.add(
                reason,
                f"{what} time {ts} is not Unix-epoch nanoseconds after 2000-01-01: set time_unix_nano "
                "(nanoseconds, not seconds or milliseconds)",
            )
            return False
        if ts > self.max_timestamp_ns:
            self.rejected.add(
                "timestamp_future",
                f"{what} time {ts} is too far ahead of Echo's clock ({self.received_ns}): "
                "fix the producer's clock",
            )
            return False
        return True

    def add(
        self,
        resolved: Resolved,
        event_id: str,
        timestamp_ns: int,
        signal: str,
        metric_name: str,
        value_double: float | None,
        value_int: int | None,
    ) -> None:
        self.rows.append((resolved, event_id, timestamp_ns, signal, metric_name, value_double, value_int))
        if resolved.noteworthy:
            self.note(resolved)

    def note(self, resolved: Resolved) -> None:
        """Count what a noteworthy row carries (hot loops append rows themselves and call this)."""
        if resolved.dropped:
            self.stored_with_fix["too_many_attributes"] += 1
        if resolved.conflicts:
            self.conflicts.update(resolved.conflicts)

    def to_arrow(self) -> pa.Table:
        if not self.rows:
            return ARROW_SCHEMA.empty_table()
        resolved, event_id, ts, signal, name, vd, vi = zip(*self.rows, strict=True)
        columns = {
            "event_id": event_id,
            "timestamp_ns": ts,
            "received_ns": [self.received_ns] * len(self.rows),
            "signal": signal,
            "cluster_id": [r.cluster_id for r in resolved],
            "node_id": [r.node_id for r in resolved],
            "metric_name": name,
            "rank": [r.rank for r in resolved],
            "nranks": [r.nranks for r in resolved],
            "value_double": vd,
            "value_int": vi,
            "causal_chain_id": [r.causal_chain_id for r in resolved],
            "attrs_json": [r.attrs_json for r in resolved],
        }
        arrays = [pa.array(columns[f.name], f.type) for f in ARROW_SCHEMA]
        tables = [TABLE_OF_METRIC.get(n) for n in name]
        rest = [None if t is None else _REST.encode(t, r.merged)
                for t, r in zip(tables, resolved, strict=True)]  # fmt: skip
        return pa.table([*arrays, pa.array(rest, pa.string())], schema=ARROW_SCHEMA.append(REST_FIELD))
