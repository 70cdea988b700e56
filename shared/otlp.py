"""Pure helpers that build OTLP protobuf requests from plain Python values (no I/O, no SDK state).

The agent and the stress tool both describe telemetry as :class:`Point` records plus one resource
dict, and call :func:`metrics_request` to get an ``ExportMetricsServiceRequest``. Every point becomes a
gauge data point with its own explicit ``time_unix_nano``, which the OTel metrics API cannot express.

Usage::

    point = Point("rankecho.health.score", 1_700_000_000_000_000_000, 0.93)
    req = metrics_request({"k8s.node.name": "n1"}, [point])
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

AttrValue = str | bool | int | float
SCOPE_NAME = "rankecho"


@dataclass(frozen=True)
class Point:
    """One measurement at one instant. ``value`` int -> ``as_int``, float -> ``as_double``."""

    metric_name: str
    timestamp_ns: int
    value: int | float
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)


def any_value(value: AttrValue) -> AnyValue:
    """Wrap a Python scalar in an OTLP ``AnyValue`` (bool is checked before int: bool is an int)."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def key_values(attributes: Mapping[str, AttrValue]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items()]


def metrics_request(
    resource: Mapping[str, AttrValue], points: Iterable[Point], scope_version: str = ""
) -> ExportMetricsServiceRequest:
    """One request, one resource, one gauge metric per distinct name, one data point per :class:`Point`."""
    by_name: dict[str, list[NumberDataPoint]] = defaultdict(list)
    for p in points:
        dp = NumberDataPoint(time_unix_nano=p.timestamp_ns, attributes=key_values(p.attributes))
        if isinstance(p.value, int) and not isinstance(p.value, bool):
            dp.as_int = p.value
        else:
            dp.as_double = float(p.value)
        by_name[p.metric_name].append(dp)
    metrics = [Metric(name=name, gauge=Gauge(data_points=dps)) for name, dps in by_name.items()]
    scope = ScopeMetrics(scope=InstrumentationScope(name=SCOPE_NAME, version=scope_version), metrics=metrics)
    rm = ResourceMetrics(resource=Resource(attributes=key_values(resource)), scope_metrics=[scope])
    return ExportMetricsServiceRequest(resource_metrics=[rm])
