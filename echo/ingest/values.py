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

from rankecho.echo.ingest import keys
from rankecho.shared.contract import EVENT_ID

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
    if kind == "string_value_strindex":  # an index into a string table that metrics, traces and logs lack
        return {"string_value_strindex": value.string_value_strindex}
    return base64.b64encode(value.bytes_value).decode("ascii")


def pairs(attributes: Any) -> list[tuple[str, Any]]:
    """OTLP ``KeyValue`` list -> (key, JSON-safe value) pairs, in wire order."""
    out = []
    for kv in attributes:
        value = kv.value
        if value.HasField("string_value"):  # the common case, without a call (HasField beats WhichOneof)
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
        if value.HasField("string_value"):  # the common case, without a call
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
    """Where one item (metric, span, log record) came from.

    ``resource`` holds the resource's attributes followed by the Echo keys that describe the resource and
    the instrumentation scope (schema URLs, scope name/version/attributes, dropped counts); it is the same
    for every item of one scope, so the attribute cache keys it by ``resource_key``. ``prefix`` (resource
    and scope as sent) starts every content hash.
    """

    resource_key: bytes
    resource: list[tuple[str, Any]]
    prefix: bytes

    def extended(self, tag: bytes, extra: list[tuple[str, Any]]) -> Scoped:
        """The same origin with more context pairs (e.g. a metric's unit), keyed apart by ``tag``."""
        if not extra:
            return self
        return Scoped(self.resource_key + b"\x00" + tag, self.resource + extra, self.prefix)


def _nonzero(*candidates: tuple[str, Any]) -> list[tuple[str, Any]]:
    """The (key, value) pairs whose value is set (non-empty, non-zero): unset OTLP fields add nothing."""
    return [(key, value) for key, value in candidates if value]


def resource_context(group: Any) -> list[tuple[str, Any]]:
    resource = group.resource
    refs = tuple(
        {"type": r.type, "id_keys": tuple(r.id_keys), "description_keys": tuple(r.description_keys),
         "schema_url": r.schema_url}
        for r in resource.entity_refs
    )  # fmt: skip
    return _nonzero(
        (keys.RESOURCE_SCHEMA_URL, group.schema_url),
        (keys.RESOURCE_DROPPED_ATTRIBUTES, resource.dropped_attributes_count),
        (keys.RESOURCE_ENTITY_REFS, refs),
    )


def scope_context(scoped: Any) -> list[tuple[str, Any]]:
    scope = scoped.scope
    return _nonzero(
        (keys.SCOPE_NAME, scope.name),
        (keys.SCOPE_VERSION, scope.version),
        (keys.SCOPE_ATTRIBUTES, dict(pairs(scope.attributes))),
        (keys.SCOPE_DROPPED_ATTRIBUTES, scope.dropped_attributes_count),
        (keys.SCOPE_SCHEMA_URL, scoped.schema_url),
    )


def walk(groups: Iterable[Any], scopes_field: str, items_field: str) -> Iterator[tuple[Scoped, Any]]:
    """Yield (origin, item) for every item under resource groups -> scopes, the shape all signals share."""
    for group in groups:
        resource_bytes = group.resource.SerializeToString()
        resource = pairs(group.resource.attributes) + resource_context(group)
        for scoped in getattr(group, scopes_field):
            prefix = resource_bytes + scoped.scope.SerializeToString()
            context = scope_context(scoped)
            key = prefix + b"\x00" + scoped.schema_url.encode() + b"\x00" + group.schema_url.encode()
            origin = Scoped(key, resource + context, prefix)
            for item in getattr(scoped, items_field):
                yield origin, item
