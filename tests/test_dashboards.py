"""The diagnosis at ``/metrics``, and the chart's Grafana dashboard and alert rules that read it.

A real Echo serves a store holding a synthetic job whose truth is known (rank 5 on node-h100, 290 ms late
every 14 steps, in cudaMalloc); its /metrics must carry that diagnosis. Every metric the dashboard and
the rules use must be one Echo really exports (read from that /metrics, not from a list), the rules must
pass Prometheus' own checker, and the straggler alert must fire in promtool's rule unit test.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import duckdb
import httpx
import pytest
import yaml
from conftest import local_settings

from rankecho.echo.app import Echo
from rankecho.echo.diagnosis_metrics import DiagnosisMetricsService
from rankecho.echo.store.migrate import migrate
from rankecho.sim.synthetic import SynFault, SynNode, SyntheticJob, write_job

CHART = Path(__file__).resolve().parent.parent / "helm" / "rankecho"
DASHBOARD = CHART / "dashboards" / "rankecho.json"
RULES = CHART / "files" / "alerts.yaml"
PROMTOOL = shutil.which("promtool")
JOB = SyntheticJob(nodes=(SynNode("node-a100", 4), SynNode("node-h100", 4, offset_ms=40)), steps=100,
                   faults=(SynFault(rank=5, ms=290, every=14, start_step=7),))  # fmt: skip
METRIC = re.compile(r"\brankecho_[a-z_]+\b")


@pytest.fixture(scope="module")
def metrics_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = tmp_path_factory.mktemp("metrics") / "echo.db"
    with duckdb.connect(str(db)) as con:
        migrate(con)
        write_job(con, JOB)
    with Echo(local_settings(db), services=[DiagnosisMetricsService(every_s=0.2)]) as echo:
        deadline = time.monotonic() + 60
        while True:
            text = httpx.get(f"http://{echo.http_address}/metrics", timeout=10).text
            if 'rankecho_stragglers{cluster_id="synthetic"}' in text or time.monotonic() > deadline:
                return text
            time.sleep(0.2)


def samples(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric family in exposition text."""
    out = {}
    for line in text.splitlines():
        m = re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


def exported(text: str) -> set[str]:
    names = {m.group(1) for m in re.finditer(r"^# TYPE (\S+) (\w+)$", text, re.M)}
    histograms = {m.group(1) for m in re.finditer(r"^# TYPE (\S+) histogram$", text, re.M)}
    return names | {f"{h}_{suffix}" for h in histograms for suffix in ("bucket", "sum", "count")}


def test_metrics_carry_the_diagnosis(metrics_text: str) -> None:
    assert samples(metrics_text, "rankecho_stragglers") == {'{cluster_id="synthetic"}': 1.0}
    episodes = samples(metrics_text, "rankecho_straggler_late_episodes")
    labels = '{cluster_id="synthetic",kind="rank",node_id="node-h100",rank="5",cause="allocator"}'
    assert episodes == {labels: float(len(JOB.late_steps(5)))}
    assert samples(metrics_text, "rankecho_imposed_gpu_seconds")['{cluster_id="synthetic"}'] > 1.0
    assert next(iter(samples(metrics_text, "rankecho_stall_cost_per_hour").values())) > 0
    fresh = samples(metrics_text, "rankecho_node_last_event_age_seconds")
    assert set(fresh) == {f'{{cluster_id="synthetic",node_id="{n.node_id}"}}' for n in JOB.nodes}
    assert 0 <= samples(metrics_text, "rankecho_diagnosis_age_seconds")[""] < 60
    assert samples(metrics_text, "rankecho_diagnosis_failures_total") == {"": 0.0}
    for kind in ("hangs", "crashes", "desyncs"):  # a straggler is no failure: 0, so an alert resolves
        assert samples(metrics_text, f"rankecho_{kind}") == {'{cluster_id="synthetic"}': 0.0}
    assert samples(metrics_text, "rankecho_hang_open_seconds") == {}
    assert "rankecho_echo_committed_total" in metrics_text  # Echo's own counters are still there


def test_dashboard_and_rules_use_only_exported_metrics(metrics_text: str) -> None:
    have = exported(metrics_text)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    used = {name for expr in exprs + rules for name in METRIC.findall(expr)}
    assert used and used <= have, f"not exported by Echo: {sorted(used - have)}"
    wanted = {"rankecho_stragglers", "rankecho_stall_cost_per_hour", "rankecho_node_last_event_age_seconds"}
    assert wanted <= used
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def description(alert: str) -> str:
    """The description annotation of one alert rule of the chart."""
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    return str(next(r for r in rules if r.get("alert") == alert)["annotations"]["description"])


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool (Debian's prometheus package: setup-host.sh)")
def test_rules_pass_promtool_and_the_straggler_alert_fires(tmp_path: Path) -> None:
    promtool = PROMTOOL or "promtool"
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    unit = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'rankecho_stragglers{cluster_id="c1"}', "values": "0 0 1 1 1 1 1 1 1 1 1"},
                {"series": 'rankecho_stragglers{cluster_id="c2"}', "values": "0 0 0 0 0 0 0 0 0 0 0"},
                {"series": 'rankecho_node_last_event_age_seconds{cluster_id="c1",node_id="n1"}',
                 "values": "10 10 10 400 460 520 580 640 700 760 820"},
                {"series": 'rankecho_hang_open_seconds{cluster_id="c2"}',
                 "values": "_ _ _ 21 81 141 _ _ _ _ _"},
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "RankechoStragglerNamed", "exp_alerts": []},
                {"eval_time": "8m", "alertname": "RankechoStragglerNamed",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "cluster_id": "c1"},
                                 "exp_annotations": {
                                     "summary": "c1: 1 straggler(s) holding the job back",
                                     "description": description("RankechoStragglerNamed")}}]},
                {"eval_time": "9m", "alertname": "RankechoNodeSilent",
                 "exp_alerts": [{"exp_labels": {"severity": "warning", "cluster_id": "c1", "node_id": "n1"},
                                 "exp_annotations": {
                                     "summary": "n1 (c1) sent nothing for 760 s",
                                     "description": description("RankechoNodeSilent")}}]},
                {"eval_time": "2m", "alertname": "RankechoJobHung", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "RankechoJobHung",
                 "exp_alerts": [{"exp_labels": {"severity": "critical", "cluster_id": "c2"},
                                 "exp_annotations": {
                                     "summary": "c2: ranks stuck in a collective for 81 s",
                                     "description": description("RankechoJobHung")}}]},
                {"eval_time": "11m", "alertname": "RankechoJobHung", "exp_alerts": []},  # gone 5 min after
            ],
        }],
    }  # fmt: skip
    test_file = tmp_path / "alerts_test.yaml"
    test_file.write_text(yaml.safe_dump(unit))
    tested = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
