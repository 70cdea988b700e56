"""The chart's operations side: a token that never changes under a running release, pods that restart
together when it does, Prometheus scraping of Echo's /metrics, and the agent's probes on its ready file.

Without a helm binary the templates are flattened (tests/helm_render.py) and the Go logic that cannot run
here is pinned by its text; the agent's liveness command runs for real against live and dead PIDs. Where
``helm`` is on PATH, the same properties are checked on real ``helm template`` output.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from helm_render import (
    CHART,
    PLACEHOLDER,
    TEMPLATES,
    container,
    env_of,
    flag,
    helm,
    helm_template,
    helper_bodies,
    manifests,
    needs_helm,
    values,
    with_tls,
)


def _annotations(objs: dict[str, dict[str, Any]], kind: str) -> dict[str, str]:
    return dict(objs[kind]["spec"]["template"]["metadata"].get("annotations") or {})


# --- The token ------------------------------------------------------------------------------------
def test_the_token_is_resolved_in_one_helper_that_mints_only_with_a_cluster_to_keep_it() -> None:
    helpers = helper_bodies()
    token = helpers["rankecho.token"]
    everything = "".join(p.read_text() for p in TEMPLATES.iterdir())
    assert everything.count("randAlphaNum") == 1 and "randAlphaNum" in token, "one place mints a token"
    # Order inside the helper: the given token, then the one in the cluster's Secret, then a new one only
    # where a lookup answers (helm install), else a failure naming the fix (helm template, GitOps).
    given, existing, online, mint, fail = (token.index(s) for s in (
        ".Values.auth.token", 'lookup "v1" "Secret"', 'lookup "v1" "ConfigMap"', "randAlphaNum", "fail "))
    assert given < existing < online < mint < fail
    message = token[fail:]
    assert "auth.existingSecret" in message and "auth.token" in message and "kubectl" in message
    assert 'set . "rankechoToken"' in token, "resolved once per render: the Secret and checksum agree"
    secret = (TEMPLATES / "secret.yaml").read_text()
    assert 'include "rankecho.token" . | b64enc' in secret and "lookup" not in secret


def test_both_pods_carry_the_same_token_checksum_and_no_secret_with_an_existing_one() -> None:
    for vals in (values(), {**values(), "auth": {**values()["auth"], "existingSecret": "mine"}}):
        objs = manifests(vals)
        for kind in ("StatefulSet", "DaemonSet"):
            assert _annotations(objs, kind)["checksum/token"] == PLACEHOLDER, kind
            ref = env_of(container(objs[kind]))["RANKECHO_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert ref["key"] == vals["auth"]["secretKey"]
        assert ("Secret" in objs) == (not vals["auth"]["existingSecret"])
    for name in ("echo-statefulset.yaml", "agent-daemonset.yaml"):
        text = (TEMPLATES / name).read_text()
        assert 'checksum/token: {{ include "rankecho.tokenChecksum" . | quote }}' in text, name
    checksum = helper_bodies()["rankecho.tokenChecksum"]
    assert 'include "rankecho.token" . | sha256sum' in checksum
    assert 'lookup "v1" "Secret" .Release.Namespace .Values.auth.existingSecret' in checksum


# --- Prometheus -----------------------------------------------------------------------------------
def test_echo_pod_has_prometheus_scrape_annotations_for_metrics() -> None:
    vals = values()
    echo = container(manifests()["StatefulSet"])
    port = {p["name"]: p["containerPort"] for p in echo["ports"]}["otlp-http"]
    notes = _annotations(manifests(), "StatefulSet")
    assert {k: v for k, v in notes.items() if k.startswith("prometheus.io/")} == {
        "prometheus.io/scrape": "true", "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics", "prometheus.io/scheme": "http",
    }
    assert _annotations(manifests(with_tls()), "StatefulSet")["prometheus.io/scheme"] == "https"
    vals["echo"]["metrics"]["podAnnotations"] = False
    notes = _annotations(manifests(vals), "StatefulSet")
    assert not any(k.startswith("prometheus.io/") for k in notes) and "checksum/token" in notes
    assert not any(k.startswith("prometheus.io/") for k in _annotations(manifests(), "DaemonSet"))


def _with_service_monitor(tls: bool = False) -> dict[str, Any]:
    vals = with_tls() if tls else values()
    vals["echo"]["metrics"]["serviceMonitor"].update(enabled=True, labels={"release": "prom"})
    return vals


def test_service_monitor_is_optional_and_scrapes_the_echo_service_metrics_port() -> None:
    assert "ServiceMonitor" not in manifests(), "off by default: it needs the Prometheus Operator's CRDs"
    objs = manifests(_with_service_monitor())
    monitor, service = objs["ServiceMonitor"], objs["Service"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == monitor["spec"]["namespaceSelector"]["matchNames"][0]
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"], "Echo's Services"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["port"] not in {p["name"] for p in objs["Service/TEMPLATED-headless"]["spec"]["ports"]}
    assert (endpoint["path"], endpoint["scheme"], endpoint["interval"]) == ("/metrics", "http", "30s")
    (endpoint,) = manifests(_with_service_monitor(tls=True))["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "echo-tls", "key": "ca.crt"}


# --- The agent's probes ---------------------------------------------------------------------------
def test_agent_startup_readiness_and_liveness_read_the_ready_file() -> None:
    vals = values()
    agent = container(manifests()["DaemonSet"])
    ready = str(flag(agent["args"], "--ready-file"))
    assert agent["startupProbe"]["exec"]["command"] == ["cat", ready]
    assert agent["readinessProbe"]["exec"]["command"] == ["cat", ready]
    startup = agent["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "bcc's compile needs time"
    assert agent["livenessProbe"]["exec"]["command"] == ["sh", "-c", f"kill -0 $(cat '{ready}')"]
    liveness = vals["agent"]["probes"]["liveness"]
    assert agent["livenessProbe"]["failureThreshold"] == liveness["failureThreshold"]


def _liveness(ready_file: Path) -> int:
    vals = values()
    vals["agent"]["readyFile"] = str(ready_file)
    command = container(manifests(vals)["DaemonSet"])["livenessProbe"]["exec"]["command"]
    return subprocess.run(command, capture_output=True, timeout=10, check=False).returncode


def test_agent_liveness_command_passes_for_a_live_pid_and_fails_otherwise(tmp_path: Path) -> None:
    ready = tmp_path / "agent.ready"
    assert _liveness(ready) != 0, "no ready file yet"
    live = subprocess.Popen(["sleep", "30"])
    try:
        ready.write_text(f"{live.pid}\n")  # what agent/runner.py writes once its probes are attached
        assert _liveness(ready) == 0
    finally:
        live.kill()
        live.wait()
    assert _liveness(ready) != 0, "the agent the file names is gone"
    ready.write_text(f"{os.getpid()}\n")
    assert _liveness(ready) == 0


# --- With a helm binary ---------------------------------------------------------------------------
@needs_helm
def test_helm_template_without_a_token_source_fails_and_names_the_fix() -> None:
    done = helm("template", "t", str(CHART), "--set", "clusterId=demo")
    assert done.returncode != 0 and "auth.existingSecret" in done.stderr


@needs_helm
def test_helm_template_token_renders_are_stable_and_a_new_token_restarts_both_pods() -> None:
    first, again = (helm_template("clusterId=demo", "auth.token=one") for _ in range(2))
    other = helm_template("clusterId=demo", "auth.token=two")
    sums = {name: {kind: _annotations(objs, kind)["checksum/token"] for kind in ("StatefulSet", "DaemonSet")}
            for name, objs in (("first", first), ("again", again), ("other", other))}
    assert sums["first"] == sums["again"] and first["Secret"] == again["Secret"]
    assert len(set(sums["first"].values())) == 1 and len(set(sums["other"].values())) == 1
    assert sums["first"]["StatefulSet"] != sums["other"]["StatefulSet"]
    mine = helm_template("clusterId=demo", "auth.existingSecret=mine")
    assert "Secret" not in mine
    ref = env_of(container(mine["DaemonSet"]))["RANKECHO_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == "mine"


@needs_helm
def test_helm_template_pins_the_image_digest() -> None:
    digest = "sha256:" + "a" * 64
    objs = helm_template("clusterId=demo", "auth.token=t", "image.repository=r.example/rankecho",
                         f"image.digest={digest}")
    for kind in ("StatefulSet", "DaemonSet"):
        assert container(objs[kind])["image"] == f"r.example/rankecho@{digest}"
    assert re.fullmatch(r"rankecho/rankecho:\S+",
                        container(helm_template("clusterId=demo", "auth.token=t")["StatefulSet"])["image"])

