"""The raw client's hand-written wire encoding parses to exactly what the protobuf builder makes,
and the SDK encoding carries the same points."""

from __future__ import annotations

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from rankecho.shared import contract
from rankecho.stress import encode
from rankecho.stress.planting import StressPlan


def parsed(data: bytes) -> ExportMetricsServiceRequest:
    return ExportMetricsServiceRequest.FromString(data)


def test_raw_request_equals_the_protobuf_reference() -> None:
    plan = StressPlan(
        "cluster-é", "node", producers=3, events_per_producer=300, chain_every=7, straggler_every=11
    )
    for producer in range(3):
        events = [plan.event(i) for i in plan.producer_range(producer)]
        fast, reference = (
            parsed(encode.raw_request(plan, 1, events)),
            parsed(encode.proto_request(plan, 1, events)),
        )
        assert fast == reference
        assert len(fast.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points) == 300


def test_raw_request_carries_ids_markers_timestamps_and_values() -> None:
    plan = StressPlan("c", "n", producers=2, events_per_producer=200)
    events = [plan.event(i) for i in plan.producer_range(1)]
    req = parsed(encode.raw_request(plan, 1, events))
    resource = {kv.key: kv.value for kv in req.resource_metrics[0].resource.attributes}
    assert resource[contract.NODE_NAME].string_value == "n-1"
    assert resource[contract.RANK].int_value == 1 and resource[contract.NRANKS].int_value == 2
    points = req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    for event, dp in zip(events, points, strict=True):
        attrs = {kv.key: kv.value.string_value for kv in dp.attributes}
        assert attrs[contract.EVENT_ID] == event.event_id
        assert attrs.get(contract.CAUSAL_CHAIN_ID) == event.chain_id
        assert (dp.time_unix_nano, dp.as_double) == (event.timestamp_ns, event.health)


def test_sdk_metrics_hold_the_same_points_as_the_raw_request() -> None:
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    plan = StressPlan("c", "n", producers=1, events_per_producer=60)
    events = [plan.event(i) for i in range(60)]
    via_sdk = encode_metrics(encode.sdk_metrics(plan, 0, events))  # type: ignore[arg-type]
    via_raw = parsed(encode.raw_request(plan, 0, events))
    sdk_points = via_sdk.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    raw_points = via_raw.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    assert list(sdk_points) == list(raw_points)
    assert via_sdk.resource_metrics[0].resource == via_raw.resource_metrics[0].resource


def test_prepare_covers_each_block_once_and_prebuilds_within_the_limit() -> None:
    from rankecho.stress.runner import StressConfig, prepare
    from rankecho.stress.senders import Target

    plan = StressPlan("c", "n", producers=3, events_per_producer=1050)
    cfg = StressConfig(plan, Target("unused:0"), client="raw", batch=500)
    work = prepare(cfg)
    for p, batches in enumerate(work):
        covered = [i for b in batches for i in range(b.first, b.first + b.count)]
        assert covered == list(plan.producer_range(p))
        assert [b.count for b in batches] == [500, 500, 50]
        assert all(isinstance(b.payload, bytes) for b in batches)
    assert all(b.payload is None for bs in prepare(cfg, prebuild_limit=3000) for b in bs)
    paced = prepare(StressConfig(plan, Target("unused:0"), client="raw", batch=500, rate=300))
    assert {b.count for b in paced[0]} == {10}  # 100 events/s per producer -> 10 per batch, 10 sends/s
