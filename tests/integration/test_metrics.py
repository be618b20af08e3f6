"""The /metrics endpoints show the same numbers the core and the agent report themselves."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from cloud_core.registry import parse_registry
from cloud_core.service import CoreConfig, CoreService
from edge_agent.agent import Agent
from edge_agent.buffer import ReportBuffer
from edge_agent.health import serve
from edge_agent.host import HostSampler
from edge_agent.wire import LinkSample
from edge_agent.wire.mqtt import MqttClient, MqttSettings
from tests.integration.helpers import FakeAgent, settings, wait_for
from tools.broker import Broker


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_core_metrics_match_ingest_counters(broker: Broker, tmp_path: Path) -> None:
    cfg = CoreConfig(mqtt=settings(broker, broker.add_account("core-m", "core")),
                     db_path=tmp_path / "core.db", metrics_port=0, metrics_addr="127.0.0.1",
                     registry=parse_registry("nodes: [{name: edge-m, region: eu}]"))
    core = CoreService(cfg)
    core.start()
    try:
        # Its first session: reports sent before it subscribed would not be queued.
        assert core.mqtt.wait_connected(10)
        ag = FakeAgent(broker, broker.add_account("edge-m", "agent"), "10.9.9.9")
        ag.announce()
        for _ in range(7):
            ag.report()
        bad = MqttClient(settings(broker, broker.add_account("sim-m", "sim")))
        bad.start()
        assert bad.wait_connected(10)
        for _ in range(3):
            bad.publish("cfnet/v1/nodes/edge-m/telemetry", b"{not json").wait(5)
        wait_for(lambda: core.ingest.counters().accepted == 7
                 and core.ingest.counters().rejected_total == 3, what="ingest counts")
        m = scrape(core.metrics_port or 0)
        c = core.ingest.counters()
        assert m[("cfnet_reports_total", (("result", "accepted"),))] == c.accepted == 7
        assert m[("cfnet_messages_rejected_total", (("reason", "malformed"),))] == 3
        assert m[("cfnet_nodes", (("health", "online"),))] == 1
        assert ("cfnet_node_staleness_seconds", (("quantile", "0.99"),)) in m
        # The end-to-end acks went out for exactly the 7 reports ingested.
        wait_for(lambda: core.acks.reports == 7, what="acks flushed")
        m = scrape(core.metrics_port or 0)
        assert m[("cfnet_acks_total", (("what", "reports"),))] == 7
        assert m[("cfnet_acks_total", (("what", "messages"),))] >= 1
        ag.close()
        bad.stop()
    finally:
        core.stop()


class _NoLinks:
    """A probe stand-in with no traffic (the agent loop, not the probe, is under test)."""

    name = "sockdiag"

    def collect(self) -> list[LinkSample]:
        return []

    def close(self) -> None:
        pass


def test_agent_metrics_show_buffer_and_counts(tmp_path: Path) -> None:
    # No broker at this port: everything stays buffered.
    mqtt = MqttClient(MqttSettings(port=1, tls=False, username="edge-x", client_id="edge-x"))
    agent = Agent(node="edge-x", interval_s=1.0, probe=_NoLinks(), host=HostSampler(),
                  mqtt=mqtt, buffer=ReportBuffer(tmp_path / "b.db"))
    for _ in range(5):
        agent.tick()
    server = serve(agent, 0, "127.0.0.1")
    try:
        m = scrape(server.server_port)
        assert m[("cfnet_agent_reports_total", (("stage", "taken"),))] == 5
        assert m[("cfnet_agent_buffer_reports", ())] == agent.buffer.depth() == 5
        assert m[("cfnet_agent_connected", ())] == 0
        assert m[("cfnet_agent_probe", (("probe", "sockdiag"),))] == 1
        assert m[("cfnet_agent_loader", (("loader", "none"),
                                         ("reason", "the sockdiag probe uses no eBPF loader")))] == 1
    finally:
        server.stop()


def test_actuator_counters_are_exported_as_they_are_kept() -> None:
    # cfnet-core --kubernetes registers the actuator's ActuatorStats like this
    # (cloud_core/main.py); the collector reads them at scrape time.
    from prometheus_client import generate_latest

    from cloud_core.ingest import Ingest
    from cloud_core.k8s.actuator import ActuatorStats
    from cloud_core.metrics import CoreMetrics, int_fields
    from cloud_core.state import ClusterState

    state = ClusterState()
    cm = CoreMetrics(Ingest(state), state)
    stats = ActuatorStats()
    cm.add_counters("cfnet_actuator_events", "Kubernetes actuator counters", "event",
                    int_fields(stats))
    stats.bound, stats.conflicts = 5, 2
    out = {}
    for fam in text_string_to_metric_families(generate_latest(cm.registry).decode()):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    assert out[("cfnet_actuator_events_total", (("event", "bound"),))] == 5
    assert out[("cfnet_actuator_events_total", (("event", "conflicts"),))] == 2
    assert ("cfnet_actuator_events_total", (("event", "unavailable"),)) in out
    assert not any("bound_pods" in str(k) for k in out)  # not a counter


def test_unschedulable_pods_by_conflicting_constraint() -> None:
    # cfnet-core --kubernetes registers the conflict reporter's tally like this (main.py)
    from prometheus_client import generate_latest

    from cloud_core.ingest import Ingest
    from cloud_core.metrics import CoreMetrics
    from cloud_core.state import ClusterState

    state = ClusterState()
    cm = CoreMetrics(Ingest(state), state)
    tally = {"latency": 2, "residency": 1}
    cm.add_gauges("cfnet_unschedulable_pods", "Unschedulable pods by conflicting constraint",
                  "constraint", lambda: dict(tally))
    tally["latency"] = 3
    out = {(smp.name, tuple(smp.labels.items())): smp.value
           for fam in text_string_to_metric_families(generate_latest(cm.registry).decode())
           for smp in fam.samples}
    assert out[("cfnet_unschedulable_pods", (("constraint", "latency"),))] == 3
    assert out[("cfnet_unschedulable_pods", (("constraint", "residency"),))] == 1
