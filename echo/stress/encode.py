"""Turn planted events into what a transport sends: a serialized OTLP request or SDK ``MetricsData``.

Both encodings carry the same resource (cluster, node, rank = producer, nranks = producers) and the
same point attributes (``rankecho.event_id`` always, ``causal_chain_id`` on markers), so a stream
sent with ``--client sdk`` and one sent with ``--client raw`` land as identical rows.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from echo.stress.planting import StressEvent, StressPlan
from shared import contract
from shared.otlp import AttrValue, Point, metrics_request

SERVICE = "rankecho-stress"


def resource(plan: StressPlan, producer: int) -> dict[str, AttrValue]:
    return {
        contract.SERVICE_NAME: SERVICE,
        contract.CLUSTER_NAME: plan.cluster_id,
        contract.NODE_NAME: plan.producer_node(producer),
        contract.RANK: producer,
        contract.NRANKS: plan.producers,
    }


def point_attributes(event: StressEvent) -> dict[str, AttrValue]:
    attrs: dict[str, AttrValue] = {contract.EVENT_ID: event.event_id}
    if event.chain_id is not None:
        attrs[contract.CAUSAL_CHAIN_ID] = event.chain_id
    return attrs


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, body: bytes) -> bytes:
    """A length-delimited protobuf field: ``tag`` is the wire key byte ((field << 3) | 2)."""
    return bytes((tag,)) + _varint(len(body)) + body


def _string_attribute(key: bytes, value: str) -> bytes:
    """``NumberDataPoint.attributes`` (field 7) holding ``KeyValue{key, AnyValue{string_value}}``."""
    return _field(0x3A, _field(0x0A, key) + _field(0x12, _field(0x0A, value.encode())))


_EVENT_ID = contract.EVENT_ID.encode()
_CHAIN = contract.CAUSAL_CHAIN_ID.encode()
_TIME_AND_DOUBLE = struct.Struct("<BQBd")  # time_unix_nano (3, fixed64), as_double (4, double)


def _data_point(event: StressEvent) -> bytes:
    body = _string_attribute(_EVENT_ID, event.event_id)
    if event.chain_id is not None:
        body += _string_attribute(_CHAIN, event.chain_id)
    body += _TIME_AND_DOUBLE.pack(0x19, event.timestamp_ns, 0x21, event.health)
    return _field(0x0A, body)  # Gauge.data_points (1)


def raw_request(plan: StressPlan, producer: int, events: Sequence[StressEvent]) -> bytes:
    """One serialized ``ExportMetricsServiceRequest`` holding ``events`` as health-score gauge points.

    The envelope (resource, scope, metric name) comes from :func:`shared.otlp.metrics_request`; the
    data points are written straight to wire format, ~3x faster than building protobuf objects, which
    is what lets the raw client prebuild millions of points. ``tests/test_stress_encode.py`` checks the
    result parses to exactly what ``metrics_request`` builds.
    """
    envelope = metrics_request(resource(plan, producer), [])
    rm = envelope.resource_metrics[0]
    scope = rm.scope_metrics[0]
    gauge = b"".join(_data_point(e) for e in events)
    metric = _field(0x0A, contract.M_HEALTH.encode()) + _field(0x2A, gauge)  # Metric.name (1), gauge (5)
    scope_bytes = _field(0x0A, scope.scope.SerializeToString()) + _field(0x12, metric)
    rm_bytes = _field(0x0A, rm.resource.SerializeToString()) + _field(0x12, scope_bytes)
    return _field(0x0A, rm_bytes)


def proto_request(plan: StressPlan, producer: int, events: Sequence[StressEvent]) -> bytes:
    """The same request built with protobuf objects (the reference :func:`raw_request` must match)."""
    points = [Point(contract.M_HEALTH, e.timestamp_ns, e.health, point_attributes(e)) for e in events]
    return metrics_request(resource(plan, producer), points).SerializeToString()


def sdk_metrics(plan: StressPlan, producer: int, events: Sequence[StressEvent]) -> object:
    """SDK ``MetricsData`` with an explicit ``time_unix_nano`` per point (the metrics API cannot do that)."""
    from opentelemetry.sdk.metrics.export import (
        Gauge,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    points = [
        NumberDataPoint(
            attributes=point_attributes(e),
            start_time_unix_nano=0,
            time_unix_nano=e.timestamp_ns,
            value=e.health,
        )
        for e in events
    ]
    metric = Metric(name=contract.M_HEALTH, description=None, unit="1", data=Gauge(data_points=points))
    scope = ScopeMetrics(scope=InstrumentationScope(SERVICE), metrics=[metric], schema_url="")
    rm = ResourceMetrics(resource=Resource(resource(plan, producer)), scope_metrics=[scope], schema_url="")
    return MetricsData(resource_metrics=[rm])
