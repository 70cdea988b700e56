"""Turn planted events into what a transport sends: a serialized OTLP request or SDK ``MetricsData``.

Both encodings carry the same resource (cluster, node, rank = producer, nranks = producers) and the
same point attributes (``rankecho.event_id`` always, ``causal_chain_id`` on markers), so a stream
sent with ``--client sdk`` and one sent with ``--client raw`` land as identical rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from rankecho.shared import contract
from rankecho.shared.otlp import AttrValue, Point, metrics_request
from rankecho.shared.wire import encode_request
from rankecho.stress.planting import StressEvent, StressPlan

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


def _points(events: Sequence[StressEvent]) -> list[Point]:
    return [Point(contract.M_HEALTH, e.timestamp_ns, e.health, point_attributes(e)) for e in events]


def raw_request(plan: StressPlan, producer: int, events: Sequence[StressEvent]) -> bytes:
    """One serialized ``ExportMetricsServiceRequest`` holding ``events`` as health-score gauge points,
    written straight to wire format by :mod:`shared.wire` (several times faster than building protobuf
    objects, which is what lets the raw client prebuild millions of points).
    ``tests/test_stress_encode.py`` checks the result parses to exactly what ``metrics_request`` builds.
    """
    return encode_request([(resource(plan, producer), _points(events))])


def proto_request(plan: StressPlan, producer: int, events: Sequence[StressEvent]) -> bytes:
    """The same request built with protobuf objects (the reference :func:`raw_request` must match)."""
    return metrics_request(resource(plan, producer), _points(events)).SerializeToString()


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
