"""OTLP ``AnyValue`` -> JSON-safe Python values, with the limits that keep hostile input harmless.

Non-finite doubles become the strings ``NaN``/``Infinity``/``-Infinity`` (JSON has no NaN), bytes become
base64, and nesting deeper than :data:`MAX_DEPTH` is cut and replaced by a marker string.
Arrays come back as tuples so an attribute set stays hashable (and cacheable) when it can.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from shared.contract import EVENT_ID

MAX_DEPTH = 8
TOO_DEEP = "<nested deeper than 8 levels: dropped by Echo>"


def nonfinite_name(x: float) -> str:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def to_python(value: AnyValue, depth: int = 0) -> Any:
    """One attribute value as a JSON-safe Python value (see module docstring for the rules)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        x = value.double_value
        return x if math.isfinite(x) else nonfinite_name(x)
    if kind == "bool_value":
        return value.bool_value
    if kind is None:
        return None
    if depth >= MAX_DEPTH:
        return TOO_DEEP
    if kind == "array_value":
        return tuple(to_python(v, depth + 1) for v in value.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: to_python(kv.value, depth + 1) for kv in value.kvlist_value.values}
    return base64.b64encode(value.bytes_value).decode("ascii")


def pairs(attributes: Any) -> list[tuple[str, Any]]:
    """OTLP ``KeyValue`` list -> (key, JSON-safe value) pairs, in wire order."""
    out = []
    for kv in attributes:
        value = kv.value
        if value.WhichOneof("value") == "string_value":  # the common case, without a call
            out.append((kv.key, value.string_value))
        else:
            out.append((kv.key, to_python(value)))
    return out


def point_pairs(attributes: Any) -> tuple[list[tuple[str, Any]], str | None]:
    """Like :func:`pairs`, but ``rankecho.event_id`` is split out: (other pairs, event id or None).

    The event id is unique per point and never stored in attrs_json, so it must stay out of the
    attribute-set cache key (leaving it in made every lookup a miss); splitting it here saves a pass.
    """
    out = []
    event_id = None
    for kv in attributes:
        key, value = kv.key, kv.value
        if value.WhichOneof("value") == "string_value":  # the common case, without a call
            if key == EVENT_ID:
                event_id = value.string_value
            else:
                out.append((key, value.string_value))
        elif key == EVENT_ID:
            event_id = str(to_python(value))
        else:
            out.append((key, to_python(value)))
    return out, event_id


@dataclass(frozen=True)
class Scoped:
    """Where one item (metric, span, log record) came from: its resource and the hash prefix."""

    resource_key: bytes
    resource: list[tuple[str, Any]]
    prefix: bytes


def walk(groups: Iterable[Any], scopes_field: str, items_field: str) -> Iterator[tuple[Scoped, Any]]:
    """Yield (origin, item) for every item under resource groups -> scopes, the shape all signals share."""
    for group in groups:
        resource_key = group.resource.SerializeToString()
        resource = pairs(group.resource.attributes)
        for scoped in getattr(group, scopes_field):
            origin = Scoped(resource_key, resource, resource_key + scoped.scope.SerializeToString())
            for item in getattr(scoped, items_field):
                yield origin, item
