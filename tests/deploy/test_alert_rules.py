"""cfnet's alerting rules (deploy/prometheus/cfnet-rules.yaml, the chart's
files/prometheus-rules.yaml): Prometheus' own ``promtool`` (Debian's prometheus package,
tools/setup.sh) checks them and runs their unit tests (cfnet-rules.test.yaml: each alert fires
on the series that mean it, silent on healthy ones); the chart's PrometheusRule carries the
same groups; and every metric the rules name is one that cfnet-core or cfnet-agent exports,
read from their real collectors' exposition."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cloud_core.ingest import Ingest
from cloud_core.metrics import CoreMetrics, int_fields
from cloud_core.state import ClusterState
from cloud_core.store import Store
from edge_agent.agent import Agent
from edge_agent.buffer import ReportBuffer
from edge_agent.host import HostSampler
from edge_agent.loaderinfo import Loader
from edge_agent.metrics import exposition
from edge_agent.wire.mqtt import MqttClient, MqttSettings
from edge_agent.wire.schema import LinkSample
from tools.helm import ROOT, documents, template

RULES = ROOT / "deploy" / "prometheus" / "cfnet-rules.yaml"
CHART_RULES = ROOT / "deploy" / "helm" / "cfnet" / "files" / "prometheus-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "cfnet-rules.test.yaml"
ALERTS = {"CfnetAgentStale", "CfnetNoLeader", "CfnetBusLag", "CfnetPlacementRefused",
          "CfnetDecodeFallback"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    assert exe, "promtool not found: tools/setup.sh installs Debian's prometheus package"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120,
                          cwd=RULES.parent)


def rule_groups() -> list[dict[str, object]]:
    groups: list[dict[str, object]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def test_promtool_checks_the_rules_and_their_unit_tests_pass() -> None:
    # One file, two paths: the plain rule file is the chart's.
    assert RULES.resolve() == CHART_RULES.resolve()
    r = promtool("check", "rules", str(RULES))
    assert r.returncode == 0 and f"SUCCESS: {len(ALERTS)} rules found" in r.stdout, \
        r.stdout + r.stderr
    r = promtool("test", "rules", str(RULE_TESTS))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    alerts = {rule["alert"] for g in rule_groups() for rule in g["rules"]}  # type: ignore[attr-defined]
    assert alerts == ALERTS
    tested = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == ALERTS, ALERTS - tested  # each alert is shown firing


@pytest.mark.usefixtures("helm_built")
def test_the_chart_ships_the_same_rules_as_a_prometheusrule() -> None:
    assert not [d for d in documents(template()) if d["kind"] == "PrometheusRule"]
    (rule,) = [d for d in documents(template(values=["prometheusRule.enabled=true"]))
               if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "cfnet-system"
    assert rule["spec"]["groups"] == rule_groups()


class _NoLinks:
    """A probe stand-in: the agent's metrics, not its probe, are under test."""

    name = "sockdiag"

    def collect(self) -> list[LinkSample]:
        return []

    def close(self) -> None:
        pass


def _exported(text: str) -> set[str]:
    names = set()
    for fam in text_string_to_metric_families(text):
        names.update(s.name for s in fam.samples)
    return names


def test_every_metric_the_rules_name_is_exported(tmp_path: Path) -> None:
    # The core's registry as cfnet-core --kubernetes fills it (cloud_core/main.py registers
    # these counters under these names: checked against its source, so a rename fails here).
    main_src = (ROOT / "cloud_core" / "main.py").read_text()
    state = ClusterState()
    store = Store(tmp_path / "core.db")
    try:
        cm = CoreMetrics(Ingest(state), state, store)
        from cloud_core.k8s.actuator import ActuatorStats

        for name, label, read in (
                ("cfnet_actuator_events", "event", int_fields(ActuatorStats())),
                ("cfnet_kube_decode", "what", lambda: {"fallback": 0})):
            assert f'"{name}"' in main_src, name
            cm.add_counters(name, "as cloud_core/main.py", label, read)
        cm.set_leader(lambda: True)
        core = _exported(generate_latest(cm.registry).decode())
    finally:
        store.close()
    # The agent's collector, over a real agent loop object and buffer (no broker, no probe).
    mqtt = MqttClient(MqttSettings(port=1, tls=False, username="edge-r", client_id="edge-r"))
    ag = Agent(node="edge-r", interval_s=1.0, probe=_NoLinks(), host=HostSampler(), mqtt=mqtt,
               buffer=ReportBuffer(tmp_path / "b.db"))
    try:
        ag.tick()
        agent = _exported(exposition(ag, Loader("core", "test"))().decode())
    finally:
        ag.host.close()
        ag.buffer.close()
    named = set()
    for g in rule_groups():
        for rule in g["rules"]:  # type: ignore[attr-defined]
            named.update(re.findall(r"\b(cfnet_[a-z_]+)\b", rule["expr"]))
    assert named, "no cfnet metric in the rules"
    missing = {n for n in named if n not in core and n not in agent}
    assert not missing, (missing, sorted(core))
