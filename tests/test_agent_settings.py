"""The agent's identity from its environment: Kubernetes downward-API variables, OTEL_RESOURCE_ATTRIBUTES,
and flags, resolved once into Settings; the agent's own pod never lands on a traced process."""

from __future__ import annotations

import logging
import socket

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from rankecho.agent import resource
from rankecho.agent.export import encode_batch
from rankecho.agent.settings import from_args
from rankecho.cli import build_parser
from rankecho.shared import contract as c
from rankecho.shared.otlp import Point

CHART_ENV = {  # what helm/rankecho's DaemonSet gives the agent, after Kubernetes expands $(VAR)
    "K8S_NODE_NAME": "gpu-node-7",
    "K8S_POD_NAME": "rankecho-agent-x2x9k",
    "K8S_NAMESPACE_NAME": "observability",
    "OTEL_RESOURCE_ATTRIBUTES": "k8s.cluster.name=prod-a,k8s.node.name=gpu-node-7,"
    "k8s.pod.name=rankecho-agent-x2x9k,k8s.namespace.name=observability",
}


def settings(argv: list[str], env: dict[str, str]) -> dict[str, str]:
    s = from_args(build_parser().parse_args(["agent", *argv]), env)
    assert dict(s.resource)[c.CLUSTER_NAME] == s.cluster_id and dict(s.resource)[c.NODE_NAME] == s.node_id
    return dict(s.resource)


def test_parse_otel_resource_attributes() -> None:
    text = " service.namespace = training , env=prod%2Ceu,k8s.pod.name=a%3Db , t=caf%C3%A9,"
    assert resource.parse_otel(text) == {
        "service.namespace": "training",
        "env": "prod,eu",
        "k8s.pod.name": "a=b",
        "t": "café",
    }
    assert resource.parse_otel("a=1,a=2,b=,c=x=y") == {"a": "2", "b": "", "c": "x=y"}
    assert resource.parse_otel("") == {}
    for bad in ("a=1,oops,b=2", "=value"):
        with pytest.raises(ValueError, match="is not key=value; write key=value pairs"):
            resource.parse_otel(bad)


def test_chart_environment_becomes_the_agents_resource() -> None:
    attrs = settings([], CHART_ENV)
    assert attrs == {
        c.CLUSTER_NAME: "prod-a",
        c.NODE_NAME: "gpu-node-7",
        c.K8S_POD_NAME: "rankecho-agent-x2x9k",
        c.K8S_NAMESPACE_NAME: "observability",
    }


def test_explicit_settings_win_over_k8s_variables_over_otel_attributes() -> None:
    env = {**CHART_ENV, "OTEL_RESOURCE_ATTRIBUTES": "k8s.node.name=from-otel,k8s.pod.name=from-otel,x=1"}
    attrs = settings(["--node-id", "from-flag", "--cluster-id", "c1"], env)
    assert (attrs[c.NODE_NAME], attrs[c.CLUSTER_NAME]) == ("from-flag", "c1")
    assert (attrs[c.K8S_POD_NAME], attrs["x"]) == ("rankecho-agent-x2x9k", "1")
    no_k8s = {"OTEL_RESOURCE_ATTRIBUTES": env["OTEL_RESOURCE_ATTRIBUTES"], "RANKECHO_CLUSTER_ID": "c2"}
    attrs = settings([], no_k8s)
    assert (attrs[c.NODE_NAME], attrs[c.K8S_POD_NAME]) == ("from-otel", "from-otel")
    assert attrs[c.CLUSTER_NAME] == "c2"
    assert settings([], {"NODE_NAME": "n", "K8S_NODE_NAME": "k"})[c.NODE_NAME] == "k"
    assert settings([], {"NODE_NAME": "n"})[c.NODE_NAME] == "n"
    assert settings([], {}) == {c.CLUSTER_NAME: "default", c.NODE_NAME: socket.gethostname()}


def test_malformed_otel_attributes_are_discarded_whole(caplog: pytest.LogCaptureFixture) -> None:
    env = {**CHART_ENV, "OTEL_RESOURCE_ATTRIBUTES": "k8s.cluster.name=prod-a,broken"}
    with caplog.at_level(logging.WARNING, logger="rankecho.agent"):
        attrs = settings([], env)
    assert attrs[c.CLUSTER_NAME] == "default" and attrs[c.K8S_POD_NAME] == "rankecho-agent-x2x9k"
    assert "ignoring OTEL_RESOURCE_ATTRIBUTES: " in caplog.text and "'broken' is not key=value" in caplog.text


def test_the_agents_pod_goes_only_on_its_own_resource() -> None:
    env = {**CHART_ENV, "OTEL_RESOURCE_ATTRIBUTES": "k8s.container.name=agent"}
    shared, own = resource.split(settings([], env))
    assert own == {c.K8S_POD_NAME: "rankecho-agent-x2x9k", c.K8S_NAMESPACE_NAME: "observability",
                   "k8s.container.name": "agent"}
    assert shared == {c.CLUSTER_NAME: "default", c.NODE_NAME: "gpu-node-7"}
    traced, bare = (1, 10), (2, 20)  # a training process with its own pod, and one with none
    resources = {traced: {c.RANK: 0, c.K8S_POD_NAME: "trainer-0"}, bare: {c.RANK: 1}, None: own}
    items = [(key, Point(c.M_CUDA_SYNC, 1, 1.0)) for key in (traced, bare, None)]
    data = encode_batch(resources, items, shared).data
    req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(data)
    pods = [{kv.key: kv.value.string_value for kv in rm.resource.attributes}.get(c.K8S_POD_NAME)
            for rm in req.resource_metrics]
    assert pods == ["trainer-0", None, "rankecho-agent-x2x9k"]
