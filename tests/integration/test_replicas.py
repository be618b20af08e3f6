"""Two core replicas splitting ingest through a shared subscription: each takes about
half of the reports, and through the replicas' digests each state converges to the
whole fleet (nodes, resources, links)."""

from __future__ import annotations

import time
from pathlib import Path

from cloud_core.service import CoreConfig, CoreService
from edge_agent.mqtt import MqttClient
from edge_agent.wire import (
    LinkSample,
    NodeStatus,
    Resources,
    RttStats,
    TelemetryReport,
    encode_report,
    encode_status,
    status_topic,
    telemetry_topic,
)
from tests.integration.helpers import settings, wait_for
from tools.broker import Broker

N = 200


def test_shared_ingest_converges_on_both(broker: Broker, tmp_path: Path) -> None:
    cores = []
    for i in (1, 2):
        cfg = CoreConfig(mqtt=settings(broker, broker.add_account(f"core-r{i}", "core")),
                         db_path=tmp_path / f"core{i}.db", share_group="cfnet",
                         place=i == 1, console=i == 1, digest_interval_s=0.5)
        c = CoreService(cfg)
        c.start()
        assert c.mqtt.wait_connected(10)
        cores.append(c)
    sim = MqttClient(settings(broker, broker.add_account("sim-r", "sim")))
    sim.start()
    assert sim.wait_connected(10)
    try:
        time.sleep(0.5)  # both shared subscriptions in place before the first report
        handles = []
        for rnd in range(1, 4):
            for k in range(N):
                node = f"sim-node-{k}"
                if rnd == 1:
                    st = NodeStatus(node=node, state="online", ts=time.time(),
                                    addresses=(f"10.50.{k // 250}.{k % 250}",))
                    handles.append(sim.publish(status_topic(node), encode_status(st),
                                               retain=True))
                peer = f"10.50.{(k + 1) % N // 250}.{(k + 1) % N % 250}"
                r = TelemetryReport(
                    node=node, seq=rnd, boot="b", ts=time.time(), interval_s=1.0, probe="ebpf",
                    resources=Resources(cpu_cores=4, cpu_util=0.2, mem_total_bytes=8 << 30,
                                        mem_used_bytes=1 << 30),
                    links=(LinkSample(peer=peer, rtt_us=RttStats(1000.0 + k, 1500.0 + k, 900.0),
                                      retrans=1, segs_out=100, loss=0.01, tx_bps=1e6,
                                      rx_bps=1e6, samples=5),),
                )
                handles.append(sim.publish(telemetry_topic(node), encode_report(r)))
        assert all(h.wait(10) for h in handles)
        total = 3 * N

        def converged() -> bool:
            for c in cores:
                snap = c.state.snapshot(time.time())
                if len(snap.nodes) < N or sum(1 for v in snap.nodes.values()
                                              if v.resources is not None) < N:
                    return False
                if len(snap.links) < N:
                    return False
            return sum(c.ingest.counters().accepted for c in cores) == total

        wait_for(converged, timeout_s=30, what="both replicas converge to the whole fleet")
        shares = [c.ingest.counters().accepted for c in cores]
        # The broker alternates deliveries between group members: about half each.
        assert all(0.3 * total <= s <= 0.7 * total for s in shares), shares
        leader = cores[0].state.snapshot(time.time())
        # Links resolve to node ids on the leader even for reports the follower took.
        assert ("sim-node-0", "sim-node-1") in leader.links
        assert leader.links[("sim-node-0", "sim-node-1")].rtt_p50_us == 1000.0
        assert cores[0].digests is not None and cores[0].digests.merged_items > 0
        assert cores[0].digests.bad_items == 0
    finally:
        sim.stop()
        for c in cores:
            c.stop()
