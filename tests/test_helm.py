"""The Helm chart in ``helm/rankecho``: its static structure, checked without a helm binary.

The templates are flattened by ``helm_render`` (a stand-in for ``helm template``: values substituted,
other actions marked); what survives is the chart's fixed structure, which is what these tests pin.
Where a ``helm`` binary exists, ``helm lint`` and ``helm template`` run too. The token, metrics and
probes: tests/test_helm_ops.py.
"""

from __future__ import annotations

import argparse
import re

import pytest
import yaml
from helm_render import (
    _ACTION,
    _COMMENT,
    CHART,
    PLACEHOLDER,
    TEMPLATES,
    VALUES_REF,
    container,
    flatten,
    helm,
    leaf_paths,
    lookup,
    manifests,
    needs_helm,
    values,
)
from helm_render import env_of as _env
from helm_render import flag as _flag
from helm_render import with_tls as _with_tls

from rankecho.echo.settings import settings_from_args


# --- The chart's files ---------------------------------------------------------------------------
def test_chart_yaml_is_a_valid_v2_chart() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == CHART.name == "rankecho"
    assert chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", chart["version"]), chart["version"]
    assert isinstance(chart["appVersion"], str) and chart["appVersion"]


def test_every_values_reference_exists_in_values_yaml() -> None:
    vals = values()
    missing = []
    for path in sorted(TEMPLATES.iterdir()):
        for ref in VALUES_REF.findall(path.read_text()):
            try:
                lookup(vals, ref)
            except KeyError as err:
                missing.append(f"{path.name}: .Values{ref} ({err})")
    assert not missing, "templates read values that values.yaml does not define:\n" + "\n".join(missing)


def test_template_blocks_balance_and_includes_are_defined() -> None:
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    defined = set(re.findall(r'\{\{-?\s*define\s+"([^"]+)"', helpers))
    for path in sorted(TEMPLATES.iterdir()):
        text = _COMMENT.sub("", path.read_text())
        assert text.count("{{") == text.count("}}"), f"{path.name}: unbalanced braces"
        actions = [m.group(1) for m in _ACTION.finditer(text)]
        depth = 0
        for action in actions:
            word = action.split(" ", 1)[0]
            depth += word in {"if", "with", "range", "define"}
            depth -= word == "end"
            assert depth >= 0, f"{path.name}: 'end' without an open block"
        assert depth == 0, f"{path.name}: {depth} block(s) never closed"
        for name in re.findall(r'include\s+"([^"]+)"', text):
            assert name in defined, f"{path.name}: include of undefined template {name!r}"


def test_every_value_is_documented_in_the_chart_readme() -> None:
    readme = (CHART / "README.md").read_text()
    def documented(path: str) -> bool:  # itself, or a block below top level passed through with toYaml
        parts = path.split(".")
        return any(f"`{'.'.join(parts[:n])}`" in readme for n in range(min(2, len(parts)), len(parts) + 1))

    undocumented = [p for p in leaf_paths(values()) if not documented(p)]
    assert not undocumented, f"add these values to helm/rankecho/README.md: {undocumented}"


def test_flatten_substitutes_values_and_marks_the_rest() -> None:
    vals = {"a": {"port": 4317, "name": "x"}}
    text = '{{- if .Values.a }}\nport: {{ .Values.a.port }}\nname: {{ .Values.a.name | quote }}\n'
    text += 'addr: {{ printf "0.0.0.0:%v" .Values.a.port | quote }}\nother: {{ include "n" . }}\n{{- end }}\n'
    text += '{{- if not .Values.a.port }}\nnot_taken: 1\n{{- else }}\nelse_taken: 1\n{{- end }}\n'
    text += '{{- if .Values.b }}\nb: 1\n{{- end }}\n{{- with .Values.a.name }}\nwith: 1\n{{- end }}\n'
    assert yaml.safe_load(flatten(text, vals)) == {
        "port": 4317, "name": "x", "addr": "0.0.0.0:4317", "other": PLACEHOLDER, "else_taken": 1, "with": 1,
    }


# --- The objects it defines ----------------------------------------------------------------------
def test_chart_defines_the_expected_objects() -> None:
    expected = ["DaemonSet", "Secret", "Service", "Service/TEMPLATED-headless", "StatefulSet"]
    assert sorted(manifests()) == expected


def test_echo_is_one_replica_statefulset_with_a_volume_for_its_database() -> None:
    vals, sts = values(), manifests()["StatefulSet"]
    spec = sts["spec"]
    assert spec["replicas"] == 1, "one writer owns the DuckDB file"
    (claim,) = spec["volumeClaimTemplates"]
    echo = container(sts)
    mounts = {m["name"]: m["mountPath"] for m in echo["volumeMounts"]}
    assert vals["echo"]["dbPath"].startswith(mounts[claim["metadata"]["name"]] + "/")
    assert echo["command"] == ["rankecho"]
    ports = vals["echo"]["ports"]
    assert echo["args"] == [
        "serve", "--db", vals["echo"]["dbPath"],
        "--otlp-grpc", f"0.0.0.0:{ports['otlpGrpc']}",
        "--otlp-http", f"0.0.0.0:{ports['otlpHttp']}",
        "--mcp-http", f"0.0.0.0:{ports['mcpHttp']}",
        "--duckdb-memory-limit", vals["echo"]["duckdbMemoryLimit"],
        "--analysis-memory-limit", vals["echo"]["analysisMemoryLimit"],
        "--analysis-workers", str(vals["echo"]["analysisWorkers"]),
    ]
    limit_gib = float(vals["echo"]["duckdbMemoryLimit"].removesuffix("GB")) * 1e9 / 2**30
    worker_gib = float(vals["echo"]["analysisMemoryLimit"].removesuffix("MB")) * 1e6 / 2**30
    workers_gib = vals["echo"]["analysisWorkers"] * worker_gib
    pod_gib = float(vals["echo"]["resources"]["limits"]["memory"].removesuffix("Gi"))
    assert limit_gib + workers_gib + 0.5 < pod_gib, "DuckDB's and the workers' limits must leave headroom"
    by_name = {p["name"]: p["containerPort"] for p in echo["ports"]}
    assert by_name == {"otlp-grpc": 4317, "otlp-http": 4318, "mcp-http": 8000}
    assert echo["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert echo["livenessProbe"]["httpGet"]["path"] == "/healthz"
    probe_ports = {echo[p]["httpGet"]["port"] for p in ("readinessProbe", "livenessProbe")}
    assert probe_ports == {"otlp-http"}
    assert vals["echo"]["terminationGracePeriodSeconds"] >= 30, "SIGTERM must have time to drain and commit"
    assert spec["serviceName"] in {m["metadata"]["name"] for m in manifests().values()}
    if vals["echo"]["securityContext"]["readOnlyRootFilesystem"]:
        assert mounts["tmp"] == "/tmp" and _env(echo)["HOME"]["value"] == "/tmp", "a writable /tmp and HOME"


def test_echo_service_exposes_every_listener_by_container_port_name() -> None:
    objs = manifests()
    service, echo = objs["Service"], container(objs["StatefulSet"])
    assert service["spec"]["type"] == "ClusterIP"
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"otlp-grpc": (4317, "otlp-grpc"), "otlp-http": (4318, "otlp-http"),
                     "mcp-http": (8000, "mcp-http")}
    assert {target for _, target in ports.values()} <= {p["name"] for p in echo["ports"]}


def test_both_services_read_the_token_from_the_chart_secret() -> None:
    vals, objs = values(), manifests()
    key = vals["auth"]["secretKey"]
    assert key in objs["Secret"]["data"]
    for kind in ("StatefulSet", "DaemonSet"):
        ref = _env(container(objs[kind]))["RANKECHO_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref["key"] == key, kind


def test_agent_daemonset_sees_host_processes_and_gets_what_bcc_needs() -> None:
    vals, ds = values(), manifests()["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    agent = container(ds)
    assert pod["hostPID"] is True
    assert agent["securityContext"]["runAsUser"] == 0
    assert {"BPF", "PERFMON", "SYS_ADMIN", "SYS_RESOURCE"} <= set(vals["agent"]["capabilities"])
    assert "allowPrivilegeEscalation" not in agent["securityContext"], "rejected with SYS_ADMIN"
    host_paths = {m["hostPath"] for m in vals["agent"]["hostMounts"]}
    assert {"/sys/kernel/tracing", "/sys/fs/bpf", "/lib/modules", "/usr/src"} <= host_paths
    names = [m["name"] for m in vals["agent"]["hostMounts"]] + ["spool"]
    assert len(names) == len(set(names)) and all(re.fullmatch(r"[a-z0-9-]{1,63}", n) for n in names)
    assert "nvidia.com/gpu.present" in vals["agent"]["nodeSelector"]
    assert any(t["key"] == "nvidia.com/gpu" for t in vals["agent"]["tolerations"])


def test_agent_identity_comes_from_the_downward_api() -> None:
    agent = container(manifests()["DaemonSet"])
    env = _env(agent)
    fields = {name: env[name]["valueFrom"]["fieldRef"]["fieldPath"]
              for name in ("K8S_NODE_NAME", "K8S_POD_NAME", "K8S_NAMESPACE_NAME")}
    assert fields == {"K8S_NODE_NAME": "spec.nodeName", "K8S_POD_NAME": "metadata.name",
                      "K8S_NAMESPACE_NAME": "metadata.namespace"}
    args = agent["args"]
    assert args[0] == "agent"
    assert args[args.index("--node-id") + 1] == "$(K8S_NODE_NAME)"
    assert {"--endpoint", "--cluster-id"} <= set(args)
    names = list(env)
    assert names.index("K8S_NODE_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES"), "$(VAR) needs it first"


def test_plaintext_is_explicit_and_tls_wires_cert_key_and_ca() -> None:
    plain, tls = manifests(), manifests(_with_tls())
    agent_args = container(plain["DaemonSet"])["args"]
    assert "--insecure" in agent_args and "--ca-file" not in agent_args
    assert container(plain["StatefulSet"])["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert "--tls-cert" not in container(plain["StatefulSet"])["args"]

    echo, agent = container(tls["StatefulSet"]), container(tls["DaemonSet"])
    assert "--insecure" not in agent["args"]
    assert {p["httpGet"]["scheme"] for p in (echo["readinessProbe"], echo["livenessProbe"])} == {"HTTPS"}
    for ctr, kind, files in ((echo, "StatefulSet", {"--tls-cert": "tls.crt", "--tls-key": "tls.key"}),
                             (agent, "DaemonSet", {"--ca-file": "ca.crt"})):
        (mount,) = [m for m in ctr["volumeMounts"] if m["name"] == "tls"]
        (volume,) = [v for v in tls[kind]["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
        assert volume["secret"]["secretName"] == "echo-tls"
        assert {flag: _flag(ctr["args"], flag) for flag in files} == {
            flag: f"{mount['mountPath']}/{name}" for flag, name in files.items()
        }


def test_agent_spool_and_readiness_follow_values() -> None:
    vals, ds = values(), manifests()["DaemonSet"]
    agent = container(ds)
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert _flag(agent["args"], "--spool-dir") == mounts["spool"] == vals["agent"]["spool"]["mountPath"]
    assert _flag(agent["args"], "--spool-max-mb") == str(vals["agent"]["spool"]["maxMB"])
    ready = str(_flag(agent["args"], "--ready-file"))
    assert agent["readinessProbe"]["exec"]["command"] == ["cat", ready]
    assert not any(ready.startswith(p + "/") for p in mounts.values()), "a volume would outlive a restart"


# --- The container args against the real CLI -----------------------------------------------------
_ARG_STANDINS = {"--endpoint": "rankecho-echo.default.svc:4317", "--cluster-id": "demo"}


def _subcommand_parser(name: str) -> argparse.ArgumentParser:
    from rankecho.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    pytest.skip(f"`rankecho {name}` is not registered yet; its container args are checked once it is")


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
@pytest.mark.parametrize("kind", ["StatefulSet", "DaemonSet"])
def test_container_args_are_accepted_by_the_cli(kind: str, tls: bool) -> None:
    args = list(container(manifests(_with_tls() if tls else None)[kind])["args"])
    sub = _subcommand_parser(args[0])
    for i, arg in enumerate(args[:-1]):
        if args[i + 1] == PLACEHOLDER:
            args[i + 1] = _ARG_STANDINS[arg]
    known = {opt for action in sub._actions for opt in action.option_strings}
    assert {a for a in args if a.startswith("--")} <= known, f"`rankecho {args[0]}` flags: {sorted(known)}"
    sub.parse_args(args[1:])


# --- With a helm binary --------------------------------------------------------------------------

@needs_helm
def test_helm_lint_and_template_render_the_chart() -> None:
    # A render without a cluster needs the token given (tests/test_helm_ops.py).
    assert helm("lint", str(CHART), "--set", "clusterId=demo", "--set", "auth.token=t").returncode == 0
    done = helm("template", "t", str(CHART), "--set", "clusterId=demo", "--set", "auth.token=t")
    assert done.returncode == 0, done.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(done.stdout) if d)
    assert kinds == ["DaemonSet", "Secret", "Service", "Service", "StatefulSet"]


@needs_helm
def test_helm_template_without_cluster_id_names_the_fix() -> None:
    done = helm("template", "t", str(CHART), "--set", "auth.token=t")
    assert done.returncode != 0 and "set clusterId" in done.stderr


def test_memory_limit_bounds_the_whole_process_when_set() -> None:
    """``echo.memoryLimit`` passes ``--memory-limit`` (Echo's RSS budget) and, with ``duckdbMemoryLimit``
    emptied, leaves DuckDB's share to Echo; the CLI accepts the result and gives DuckDB the budget's share."""
    vals = values()
    vals["echo"]["memoryLimit"], vals["echo"]["duckdbMemoryLimit"] = "2700MB", ""
    args = list(container(manifests(vals)["StatefulSet"])["args"])
    assert args[args.index("--memory-limit") + 1] == "2700MB" and "--duckdb-memory-limit" not in args
    args = [_ARG_STANDINS[args[i - 1]] if a == PLACEHOLDER else a for i, a in enumerate(args)]
    parsed = _subcommand_parser(args[0]).parse_args(args[1:])
    assert settings_from_args(parsed, {"RANKECHO_TOKEN": "t"}).store_memory_limit == "1805MiB"
