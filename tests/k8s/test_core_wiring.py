"""`cfnet-core --kubernetes` end to end: agents' measured links reach the Kubernetes
actuator (agent ids mapped to Node names), so a pod's latency SLA decides its node
on a real API server."""

from __future__ import annotations

import time
from pathlib import Path

from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.registry import AGENT_ID
from cloud_core.k8s.wiring import KubeSettings, start_kubernetes
from cloud_core.service import CoreConfig, CoreService
from tests.integration.helpers import FakeAgent, settings
from tests.k8s.conftest import Cluster, wait_for
from tools.broker import Broker


def test_measured_links_decide_a_latency_bound_pod(broker: Broker, admin: KubeClient,
                                                   cluster: Cluster, tmp_path: Path) -> None:
    addrs = {"edge-ka": "10.8.0.1", "edge-kb": "10.8.0.2", "edge-kc": "10.8.0.3"}
    rtt = {("edge-ka", "edge-kb"): 5.0, ("edge-ka", "edge-kc"): 80.0,
           ("edge-kb", "edge-kc"): 80.0}
    names = {"edge-ka": "k-a", "edge-kb": "k-b", "edge-kc": "k-c"}
    cluster.node("k-a", region="eu", cpu="1", labels={AGENT_ID: "edge-ka"},
                 edge_taint=False)
    for agent in ("edge-kb", "edge-kc"):
        cluster.node(names[agent], region="eu", cpu="4", labels={AGENT_ID: agent},
                     edge_taint=False)
    core = CoreService(CoreConfig(mqtt=settings(broker, broker.add_account("core-k8s", "core")),
                                  db_path=tmp_path / "core.db", place=False))
    # As `cfnet-core --kubernetes`: MQTT only once this replica holds the Lease.
    core.start(connect=False)
    agents = []
    try:
        for a, addr in addrs.items():
            peers = {addrs[b]: ms for (x, b), ms in rtt.items() if x == a}
            peers.update({addrs[x]: ms for (x, b), ms in rtt.items() if b == a})
            ag = FakeAgent(broker, broker.add_account(a, "agent"), addr, peers)
            ag.announce()
            ag.report()
            agents.append(ag)
        assert not core.mqtt.connected
        runner = start_kubernetes(admin, core.state, core.events, KubeSettings(
            identity="core-test", lease_namespace=cluster.namespace, lease_duration_s=4,
            renew_deadline_s=3, retry_period_s=1), on_lead=core.connect,
            on_follow=core.disconnect)
        wait_for(lambda: core.mqtt.connected, timeout=20, what="the leader connected to MQTT")
        for ag in agents:  # reports published after the leader connected
            ag.report()
        wait_for(lambda: len(core.state.snapshot(time.time()).links) == 6, timeout=20,
                 what="the 6 measured links in the core's state")
        try:
            # 2 CPUs: k-a itself is too small; k-b is 5 ms away, k-c 80 ms.
            cluster.pod("near-a", cpu="2", annotations={"cfnet.io/max-latency-ms": "20",
                                                        "cfnet.io/latency-to": "k-a"})
            cluster.pod("too-strict", cpu="2", annotations={"cfnet.io/max-latency-ms": "1",
                                                            "cfnet.io/latency-to": "k-a"})

            def placed() -> dict[str, str] | None:
                pods = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.pods()}
                failed = {e["involvedObject"]["name"] for e in cluster.events("FailedScheduling")}
                return pods if pods.get("near-a") and "too-strict" in failed else None

            pods = wait_for(placed, timeout=30, what="near-a bound and too-strict refused",
                            explain=cluster.describe)
            assert pods["near-a"] == "k-b"
            assert pods["too-strict"] is None
            msg = next(e["message"] for e in cluster.events("FailedScheduling")
                       if e["involvedObject"]["name"] == "too-strict")
            assert "latency" in msg
            # the core's own placement events are coalesced per window (BindingNotices)
            wait_for(lambda: any("bound to k-b" in e.message for e in core.events.recent(50)),
                     timeout=10, what="the core's placement event for near-a")
        finally:
            runner.stop()
    finally:
        for ag in agents:
            ag.close()
        core.stop()
