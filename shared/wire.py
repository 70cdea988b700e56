"""Direct protobuf wire encoding of OTLP metric requests, for hot paths (the agent, the stress tool).

Produces the same bytes a parser reads as :func:`rankecho.shared.otlp.metrics_request` (tests compare the
two), ~4x cheaper: no message objects are built, and encoded attributes are cached, because most
attribute values repeat (op names, comm ids, states). Usage::

    body = encode_request([(resource_attrs, points)])
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

from rankecho.shared.otlp import SCOPE_NAME, AttrValue, Point

_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")
_CACHE_MAX = 50_000
_cache: dict[tuple[int, str, type, AttrValue], bytes] = {}
_SMALL = [bytes((i,)) for i in range(128)]


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len_field(tag: int, body: bytes) -> bytes:
    n = len(body)
    return _SMALL[(tag << 3) | 2] + (_SMALL[n] if n < 128 else _varint(n)) + body


def _any_value(value: AttrValue) -> bytes:
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    return _len_field(1, str(value).encode())


def key_value_field(tag: int, key: str, value: AttrValue) -> bytes:
    """Field ``tag`` holding an encoded ``KeyValue`` (cached: most attribute values repeat)."""
    ck = (tag, key, type(value), value)
    hit = _cache.get(ck)
    if hit is None:
        hit = _len_field(tag, _len_field(1, key.encode()) + _len_field(2, _any_value(value)))
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[ck] = hit
    return hit


def _attributes(tag: int, attributes: Mapping[str, AttrValue]) -> bytes:
    return b"".join([key_value_field(tag, k, v) for k, v in attributes.items()])


def _data_point(p: Point) -> bytes:
    body = _attributes(7, p.attributes) + b"\x19" + _FIXED64.pack(p.timestamp_ns)
    if isinstance(p.value, int) and not isinstance(p.value, bool):
        body += b"\x31" + _FIXED64.pack(p.value & 0xFFFFFFFFFFFFFFFF)
    else:
        body += b"\x21" + _DOUBLE.pack(float(p.value))
    return body


def _resource_metrics(resource: Mapping[str, AttrValue], points: Iterable[Point]) -> bytes:
    by_name: dict[str, list[bytes]] = {}
    for p in points:
        by_name.setdefault(p.metric_name, []).append(_len_field(1, _data_point(p)))
    metrics = b"".join(
        _len_field(2, _len_field(1, name.encode()) + _len_field(5, b"".join(dps)))
        for name, dps in by_name.items()
    )
    scope = _len_field(1, _len_field(1, SCOPE_NAME.encode())) + metrics
    return _len_field(1, _attributes(1, resource)) + _len_field(2, scope)


def encode_request(groups: Sequence[tuple[Mapping[str, AttrValue], Sequence[Point]]]) -> bytes:
    """An ``ExportMetricsServiceRequest``: one ResourceMetrics per (resource, points) group."""
    return b"".join(_len_field(1, _resource_metrics(res, pts)) for res, pts in groups)
