"""Node registry (facts agents can't assert) and the snapshot handed to the engine."""

from __future__ import annotations

import time

import pytest

from cloud_core.health import Health as LiveHealth
from cloud_core.ingest import Ingest
from cloud_core.placement import Health, Resources, Workload
from cloud_core.registry import RegistryError, parse_registry
from cloud_core.snapshot import build_snapshot, link_info
from cloud_core.state import ClusterState, LinkView
from edge_agent import wire
from tests.unit.reports import report_bytes

GOOD = """
defaults: {region: unregistered, security_level: 0}
nodes:
  - name: edge-a
    region: eu
    zone: eu-1
    security_level: 3
    labels: {site: lyon}
    taints: [{key: dedicated, value: ml}]
    capacity: {cpu: "2", memory: 4Gi, nvidia.com/gpu: 1}
    price_per_hour: 0.1
"""


def test_registry_parses_facts() -> None:
    r = parse_registry(GOOD)
    a = r.facts("edge-a")
    assert a.capacity_set and a.info.capacity == Resources(2000, 4 << 30, 1)
    assert (a.info.region, a.info.security_level, a.info.taints[0].key) == ("eu", 3, "dedicated")
    # An unregistered node gets the defaults, whatever it might claim.
    z = r.facts("edge-z")
    assert (z.info.region, z.info.security_level, z.capacity_set) == ("unregistered", 0, False)


@pytest.mark.parametrize(("text", "needle"), [
    ("nodes: [{region: eu}]", "name is required"),
    ("nodes: [{name: 'Bad Name'}]", "not a valid node id"),
    ("nodes: [{name: a}, {name: a}]", "duplicate"),
    ("nodes: [{name: a, security_level: high}]", "security_level"),
    ("nodes: [{name: a, capacity: {cpu: lots}}]", "capacity.cpu"),
    ("nodes: [{name: a, price_per_hour: -1}]", "negative"),
    ("nodes: [{name: a, taints: [{value: x}]}]", "taints"),
    ("[1, 2]", "mapping"),
    # a typo is refused and named, never ignored (it left a node at security level 0)
    ("nodes: [{name: a, security-level: 2}]", r"unknown field `security-level`.*nodes\[0\]"),
    ("defaults: {regoin: eu}", "unknown field `regoin`"),
    ("node: [{name: a}]", "unknown field `node`"),
    ("nodes: [{name: a, taints: [{key: k, efect: NoSchedule}]}]", "efect"),
    ("nodes: [{name: a, price_per_hour: '0.1'}]", r"price_per_hour"),
    ("nodes: [{name: a, security_level: true}]", r"security_level"),
    ("defaults: {name: x}", "defaults"),
    ("nodes: [", "YAML"),
])
def test_registry_errors_name_the_entry(text: str, needle: str) -> None:
    with pytest.raises(RegistryError, match=needle):
        parse_registry(text)


def test_snapshot_uses_registry_facts_measured_capacity_and_health() -> None:
    state = ClusterState()
    ing = Ingest(state, time.time)
    # edge-z claims a region in its status labels: ignored for placement facts.
    st = wire.NodeStatus(node="edge-z", state="online", ts=1.0, addresses=("10.77.2.2",),
                         labels=(("topology.kubernetes.io/region", "eu"),))
    ing.handle("cfnet/v1/nodes/edge-z/status", wire.encode_status(st))
    ing.handle("cfnet/v1/nodes/edge-a/telemetry", report_bytes(node="edge-a"))
    ing.handle("cfnet/v1/nodes/edge-z/telemetry", report_bytes(node="edge-z", links=[]))
    live = state.snapshot(time.time())
    w = Workload(uid="w1", name="w1", requests=Resources(500, 1 << 20, 0))
    snap = build_snapshot(live, parse_registry(GOOD),
                          {"edge-a": LiveHealth.ONLINE, "edge-z": LiveHealth.SUSPECT},
                          {"edge-z"}, [(w, "edge-a")])
    nodes = {n.name: n for n in snap.nodes}
    assert nodes["edge-a"].capacity == Resources(2000, 4 << 30, 1)  # registry wins
    assert nodes["edge-a"].allocated == Resources(500, 1 << 20, 0)
    assert nodes["edge-z"].region == "unregistered"  # never from the agent
    assert nodes["edge-z"].capacity.cpu_milli == 4000  # measured: 4 cores
    assert nodes["edge-z"].health == Health.CORDONED
    lk = snap.links[("edge-a", "edge-z")]
    # The report's 5 % loss: the p95 a request sees includes a retransmission.
    assert lk.rtt_p50_ms == pytest.approx(1.2) and lk.rtt_p95_ms == pytest.approx(201.5)
    assert [p.uid for p in snap.pods] == ["w1"]


@pytest.mark.parametrize(("loss", "p95_ms"), [
    (0.0, 1.5), (0.02, 1.5), (0.0499, 1.5), (0.05, 201.5), (0.3, 201.5),
])
def test_heavy_loss_counts_against_the_latency_sla(loss: float, p95_ms: float) -> None:
    lv = LinkView(src="a", dst="b", peer_addr="10.0.0.2", rtt_p50_us=1200.0,
                  rtt_p95_us=1500.0, rtt_min_us=900.0, loss=loss, tx_bps=1e6, rx_bps=0.0,
                  samples=10, updated=99.0, connect_us=None, probe="ebpf")
    info = link_info(lv, now=100.0)
    assert info is not None
    assert info.rtt_p95_ms == pytest.approx(p95_ms)
    assert (info.rtt_p50_ms, info.loss, info.age_s) == (pytest.approx(1.2), loss, 1.0)


def test_link_without_rtt_is_not_a_measurement() -> None:
    lv = LinkView(src="a", dst="b", peer_addr="x", rtt_p50_us=None, rtt_p95_us=None,
                  rtt_min_us=None, loss=0.0, tx_bps=0.0, rx_bps=0.0, samples=0, updated=1.0,
                  connect_us=None, probe="sockdiag")
    assert link_info(lv, now=2.0) is None


def test_local_snapshot_keeps_running_pods_host_ports_and_extended_resources() -> None:
    """Local mode: a running pod's hostPort and extended resources reach the engine (the
    snapshot dropped them, so a second pod asking the same hostPort landed beside it)."""
    from cloud_core.loop import with_placements
    from cloud_core.placement import place
    from cloud_core.placement.model import HostPort

    reg = parse_registry("""
nodes:
  - {name: edge-a, capacity: {cpu: "4", memory: 8Gi}}
  - {name: edge-b, capacity: {cpu: "4", memory: 8Gi}}
""")
    state = ClusterState()
    live = state.snapshot(time.time())
    web = Workload(uid="web-1", name="web-1", requests=Resources(100, 1 << 20, 0),
                   host_ports=(HostPort(8080),), extended={"example.com/dongle": 1})
    health = {"edge-a": LiveHealth.ONLINE, "edge-b": LiveHealth.ONLINE}
    snap = build_snapshot(live, reg, health, set(), [(web, "edge-a")])
    (running,) = snap.pods
    assert running.host_ports == (HostPort(8080),)
    assert dict(running.extended) == {"example.com/dongle": 1}
    again = Workload(uid="web-2", name="web-2", requests=Resources(100, 1 << 20, 0),
                     host_ports=(HostPort(8080),))
    assert place(snap, [again]).assignments["web-2"] == "edge-b"
    # The same for a pod placed earlier in the same step (the loop's with_placements).
    fresh = build_snapshot(live, reg, health, set(), [])
    seen = with_placements(fresh, [web], {"web-1": "edge-b"})
    assert seen.pods[0].host_ports == (HostPort(8080),)
    assert place(seen, [again]).assignments["web-2"] == "edge-a"
