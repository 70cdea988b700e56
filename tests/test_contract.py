"""The wire contract: encoding round-trips through real protobuf bytes, and keys stay unique."""

from __future__ import annotations

import inspect

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from rankecho.shared import contract
from rankecho.shared.otlp import Point, metrics_request


def test_metrics_request_round_trips_through_bytes() -> None:
    resource = {contract.NODE_NAME: "node-a", contract.RANK: 5, contract.NRANKS: 8}
    points = [
        Point(contract.M_HEALTH, 1_700_000_000_000_000_001, 0.25, {contract.CAUSAL_CHAIN_ID: "c0ffee:14"}),
        Point(contract.M_KERNEL_LAUNCHES, 1_700_000_000_000_000_002, 42, {contract.TID: 7}),
        Point(contract.M_HEALTH, 1_700_000_000_000_000_003, 1.0, {"flag": True}),
    ]
    wire = metrics_request(resource, points).SerializeToString()
    decoded = ExportMetricsServiceRequest.FromString(wire)

    (rm,) = decoded.resource_metrics
    res = {kv.key: kv.value for kv in rm.resource.attributes}
    assert res[contract.RANK].int_value == 5
    assert res[contract.NODE_NAME].string_value == "node-a"
    metrics = {m.name: m for m in rm.scope_metrics[0].metrics}
    health = metrics[contract.M_HEALTH].gauge.data_points
    assert [dp.time_unix_nano for dp in health] == [1_700_000_000_000_000_001, 1_700_000_000_000_000_003]
    assert health[0].as_double == 0.25
    assert health[0].attributes[0].value.string_value == "c0ffee:14"
    assert health[1].attributes[0].value.bool_value is True
    launches = metrics[contract.M_KERNEL_LAUNCHES].gauge.data_points[0]
    assert launches.WhichOneof("value") == "as_int" and launches.as_int == 42


def test_contract_names_are_unique() -> None:
    values = [v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str)]
    assert len(values) == len(set(values)), "two contract constants share a wire name"


def test_causal_chain_id_is_the_communicator_and_sequence_only() -> None:
    assert contract.causal_chain_id("9f3a", 14) == "9f3a:14"
    # Nothing rank- or node-specific can enter it: its only inputs are what every rank shares.
    assert list(inspect.signature(contract.causal_chain_id).parameters) == ["comm_id", "seq"]
    comms, seqs = ("9f3a", "9f3b", "9f3a.0>1"), (0, 1, 14, 141)
    ids = {contract.causal_chain_id(comm, seq) for comm in comms for seq in seqs}
    assert len(ids) == 12, "two collective instances share a chain id"
    # tests/test_agent_tracker.py checks the same id arises on ranks of several nodes.


def test_wire_encoder_parses_to_what_the_protobuf_builder_makes() -> None:
    from rankecho.shared.wire import encode_request

    groups = [
        ({contract.NODE_NAME: "node-a", contract.RANK: 5, "flag": True, "ratio": 0.5}, [
            Point(contract.M_COLLECTIVE, 1_700_000_000_000_000_001, 291.5, {contract.CAUSAL_CHAIN_ID: "a:7"}),
            Point(contract.M_KERNEL_LAUNCHES, 1_700_000_000_000_000_002, 1200, {contract.TID: 77}),
            Point(contract.M_COLLECTIVE, 1_700_000_000_000_000_003, -1, {"neg": -3, "big": 2**40}),
        ]),
        ({contract.NODE_NAME: "node-b"}, [Point(contract.M_HEALTH, 5, 1.0, {"on": False, "s": "ü" * 200})]),
    ]
    expected = ExportMetricsServiceRequest()
    for resource, points in groups:
        expected.resource_metrics.extend(metrics_request(resource, points).resource_metrics)
    decoded = ExportMetricsServiceRequest.FromString(encode_request(groups))
    assert decoded == expected
