"""Two core replicas splitting ingest through a shared subscription: each takes about
half of the reports, and through the replicas' digests each state converges to the
whole fleet (nodes, resources, links); when one replica's connection dies, the other
takes every later report (replicas configured as ``cfnet-core --share-group`` builds
them: no persistent session, so a dead member leaves the group)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from cloud_core.main import build_config, parse_args
from cloud_core.service import CoreConfig, CoreService
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
from edge_agent.wire.mqtt import MqttClient
from tests.integration.helpers import settings, wait_for
from tools.broker import Broker

N = 200


def test_shared_ingest_converges_on_both(broker: Broker, tmp_path: Path) -> None:
    cores = []
    for i in (1, 2):
        # Sessions as `cfnet-core --share-group` makes them (none kept): a persistent
        # member left in the module's broker keeps being handed a share of the group after
        # this test, and the next test's reports queued for it are lost to that test.
        creds = broker.add_account(f"core-r{i}", "core")
        cfg = CoreConfig(mqtt=settings(broker, creds, session_expiry_s=0, clean_start=True),
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


def test_dead_replica_share_goes_to_the_survivor(broker: Broker, tmp_path: Path) -> None:
    """Replicas as ``cfnet-core --share-group`` configures them (``build_config``). Before
    it made their sessions non-persistent, Mosquitto kept handing a SIGKILLed member its
    share for the session's hour, so half the fleet went stale on the survivor."""
    cores = []
    for i in (1, 2):
        creds = broker.add_account(f"core-s{i}", "core")
        pw = tmp_path / f"core{i}.pw"
        pw.write_text(creds.password)
        argv = ["--broker-host", broker.host, "--broker-port", str(broker.port),
                "--username", creds.username, "--password-file", str(pw),
                "--db", str(tmp_path / f"core-s{i}.db"), "--share-group", "cfnet"]
        argv += ["--ca-file", str(creds.ca_file)] if broker.tls else ["--no-tls"]
        if i == 2:
            argv.append("--no-place")
        c = CoreService(build_config(parse_args(argv)))
        c.start()
        assert c.mqtt.wait_connected(10)
        cores.append(c)
    sim = MqttClient(settings(broker, broker.add_account("sim-s", "sim"), max_inflight=100))
    sim.start()
    assert sim.wait_connected(10)
    nodes = [f"sim-node-{k}" for k in range(N)]

    def send(seq: int) -> None:
        hs = [sim.publish(telemetry_topic(n), encode_report(TelemetryReport(
            node=n, seq=seq, boot="b", ts=time.time(), interval_s=1.0, probe="ebpf",
            resources=Resources(cpu_cores=4, cpu_util=0.2, mem_total_bytes=8 << 30,
                                mem_used_bytes=1 << 30), links=()))) for n in nodes]
        assert all(h.wait(10) for h in hs)

    try:
        seq = 0

        def both_take_part() -> bool:
            nonlocal seq
            seq += 1
            send(seq)
            time.sleep(0.2)
            return all(c.ingest.counters().accepted > 0 for c in cores)

        wait_for(both_take_part, timeout_s=30, what="both replicas taking reports")
        pid = cores[1].mqtt.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not cores[1].mqtt.connected, timeout_s=10,
                 what="replica 2 seeing its connection gone")
        t_kill = time.monotonic()
        first = seq + 1

        # A round a poll (bounded by the wait): a report the broker handed the dying member
        # in the instant before it saw the socket close is the agent's to resend, which this
        # simulator does not. With a persistent session the dead member kept its half of
        # every round (the broker alternates members) and this never held.
        def survivor_has_all() -> bool:
            nonlocal seq
            seq += 1
            send(seq)
            time.sleep(0.2)
            snap = cores[0].state.snapshot(time.time())
            return all(n in snap.nodes and snap.nodes[n].seq >= first for n in nodes)

        wait_for(survivor_has_all, timeout_s=15,
                 what=f"the survivor holding a report from round {first} on for every node")
        print(f"\nafter the kill the survivor had all {N} new reports "
              f"{time.monotonic() - t_kill:.2f} s later")
    finally:
        sim.stop()
        for c in cores:
            c.stop()
