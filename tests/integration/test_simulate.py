"""The fleet simulator (tools.simulate) against the real broker and core.

Its reports must be valid under the wire contract and accepted by the core;
scheduled degradations and disconnects must show up where and when the
schedule says (judged by the simulator's own clock and the core's state, never
by wall-clock limits); and two core replicas in one ``$share`` group must each
ingest a part of the fleet and together all of it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cloud_core.registry import parse_registry
from cloud_core.service import CoreConfig, CoreService
from edge_agent.wire import parse_report, parse_status, telemetry_topic
from edge_agent.wire.mqtt import MqttClient, MqttSettings
from tests.integration.helpers import settings, wait_for
from tools.broker import Broker
from tools.simulate import (
    Degradation,
    Disconnect,
    SimConfig,
    SimError,
    Simulator,
    World,
    parse_degradation,
    parse_disconnect,
)


def sim_settings(broker: Broker, names: list[str]) -> list[MqttSettings]:
    return [settings(broker, broker.add_account(n, "sim"), client_id=n, session_expiry_s=0,
                     clean_start=True, keepalive_s=10) for n in names]


def start_core(broker: Broker, name: str, tmp: Path, **kw: object) -> CoreService:
    creds = broker.add_account(name, "core")
    cfg = CoreConfig(mqtt=settings(broker, creds, client_id=name), db_path=tmp / f"{name}.db",
                     **kw)  # type: ignore[arg-type]
    c = CoreService(cfg)
    c.start()
    assert c.mqtt.wait_connected(10), c.mqtt.last_refusal
    return c


@pytest.fixture
def cores(broker: Broker, tmp_path: Path) -> Iterator[list[CoreService]]:
    made: list[CoreService] = []
    yield made
    for c in made:
        c.stop()


# ---------------------------------------------------------------------------- pure


def test_every_report_is_valid_and_the_schedule_shapes_links() -> None:
    deg = Degradation(at_s=10, duration_s=5, site="r1s0", rtt_factor=4.0, loss=0.2)
    cut = Disconnect(at_s=20, duration_s=5, site="r0s1")
    w = World(SimConfig(nodes=400, regions=3, sites_per_region=3, peers=4, seed=7,
                        degradations=(deg,), disconnects=(cut,)))
    rnd = random.Random(1)
    for nd in w.nodes:
        r = parse_report(w.report_bytes(nd, 1, "boot1", time.time(), 12.0, rnd), nd.name)
        assert r.node == nd.name and len(r.links) == len(nd.peers)
        st = parse_status(w.status_bytes(nd, "online", "boot1"), nd.name)
        assert st.addresses == (nd.addr,)
    # addresses are unique, so the core can map every link to a node
    assert len({nd.addr for nd in w.nodes}) == len(w.nodes)
    # a degraded site's cross-site links: RTT x4 and loss 0.2 inside the window only
    a = next(nd for nd in w.nodes if nd.site == "r1s0")
    b = next(nd for nd in w.nodes if nd.site == "r2s1")
    c = next(nd for nd in w.nodes if nd.site == "r2s2")
    before, during, after = w.link(a, b, 9.9), w.link(a, b, 12.0), w.link(a, b, 15.1)
    assert during[0] == pytest.approx(4 * before[0]) and during[1] == 0.2
    assert after == before
    assert w.link(b, c, 12.0) == w.link(b, c, 0.0)  # not touching the site: unchanged
    # disconnects: exactly the site's nodes, exactly the window
    d = next(nd for nd in w.nodes if nd.site == "r0s1")
    assert w.disconnected(d, 19.9) is None and w.disconnected(d, 20.0) is cut
    assert w.disconnected(d, 25.0) is None and w.disconnected(a, 22.0) is None
    # the diurnal curve: trough at 04:00, peak at 16:00; carbon lowest around midday
    assert World.diurnal(4.0) == pytest.approx(0.0) and World.diurnal(16.0) == pytest.approx(1.0)
    reg = parse_registry(w.registry_yaml())
    assert len(reg.nodes) == 400
    assert {f.info.region for f in reg.nodes.values()} == {r.name for r in w.regions}


def test_schedule_parsing_and_bounds() -> None:
    d = parse_degradation("at=5,dur=10,site=r0s0,peer=r1s1,rtt=2.5,loss=0.01")
    assert d == Degradation(5, 10, "r0s0", "r1s1", 2.5, 0.01)
    assert parse_disconnect("at=1,dur=2,site=r0s0,will=0") == Disconnect(1, 2, "r0s0", False)
    with pytest.raises(SimError):
        parse_degradation("at=5,site=r0s0")
    with pytest.raises(SimError):
        World(SimConfig(nodes=0))
    with pytest.raises(SimError):
        World(SimConfig(nodes=10, disconnects=(Disconnect(0, 1, "nowhere"),)))


# ---------------------------------------------------------------------------- broker + core


@pytest.mark.parametrize("client", ["lean", "paho"])
def test_core_accepts_every_simulated_report(broker: Broker, cores: list[CoreService],
                                             tmp_path: Path, client: str) -> None:
    core = start_core(broker, f"core-sim1{client[0]}", tmp_path, place=False)
    cores.append(core)
    w = World(SimConfig(nodes=300, rate=2.0, duration_s=4.0, regions=2, sites_per_region=3,
                        seed=3, node_prefix="sa"))
    accounts = [f"sim-a{client[0]}{i}" for i in range(3)]
    summary = Simulator(w, sim_settings(broker, accounts), client=client).run()
    assert summary["errors"] == 0 and summary["connections"] == 3
    assert summary["acked"] == summary["published"] > 0
    c = wait_for(lambda: (lambda c: c if c.accepted >= summary["published"] else None)(
        core.ingest.counters()), what="every published report accepted")
    assert c.accepted == summary["published"] and c.rejected_total == 0
    snap = core.state.snapshot(time.time())
    names = {nd.name for nd in w.nodes}
    assert names <= set(snap.nodes)
    assert all(snap.nodes[n].status == "online" for n in names)
    # peers are announced addresses: links resolve to node ids, not raw addresses
    src = w.nodes[0]
    for j in src.peers:
        assert (src.name, w.nodes[j].name) in snap.links


def test_disconnects_and_degradations_happen_as_scheduled(
        broker: Broker, cores: list[CoreService], tmp_path: Path) -> None:
    core = start_core(broker, "core-sim2", tmp_path, place=False)
    cores.append(core)
    cfg = SimConfig(nodes=60, rate=4.0, duration_s=7.0, regions=2, sites_per_region=2, seed=5,
                    node_prefix="sb",
                    degradations=(Degradation(1.5, 3.0, "r1s0", rtt_factor=20.0, loss=0.3),),
                    disconnects=(Disconnect(2.0, 2.5, "r0s1"),))
    w = World(cfg)
    cut_nodes = [nd.name for nd in w.nodes if nd.site == "r0s1"]
    deg = next(nd for nd in w.nodes if nd.site == "r1s0"
               and any(w.nodes[j].site != "r1s0" for j in nd.peers))
    far = next(w.nodes[j].name for j in deg.peers if w.nodes[j].site != "r1s0")
    seen: dict[str, object] = {}
    stop = threading.Event()

    def watch() -> None:
        # what the core's state says while the schedule runs (no timing asserted)
        while not stop.wait(0.05):
            snap = core.state.snapshot(time.time())
            if all(snap.nodes.get(n) is not None and snap.nodes[n].status == "offline"
                   for n in cut_nodes):
                seen["offline"] = True
            lk = snap.links.get((deg.name, far))
            if lk is not None and lk.rtt_p50_us is not None:
                base = w.link(deg, w.by_name[far], 0.0)[0] * 1000
                if lk.rtt_p50_us > 5 * base:
                    seen["degraded"] = True
                elif seen.get("degraded"):
                    seen["recovered"] = True

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    sim = Simulator(w, sim_settings(broker, ["sim-b0", "sim-b1"]))
    summary = sim.run()
    wait_for(lambda: core.ingest.counters().accepted >= summary["published"]
             + summary["backlog_sent"], what="all reports, buffered ones too")
    stop.set()
    t.join(5)
    kinds = [e["kind"] for e in summary["events"]]
    assert kinds.count("disconnect_start") == 1 and kinds.count("disconnect_end") == 1
    assert "degradation_start" in kinds and "degradation_end" in kinds
    ev = {e["kind"]: e["t"] for e in summary["events"]}
    assert ev["disconnect_start"] >= 2.0 and ev["disconnect_end"] >= 4.5
    assert seen.get("offline") and seen.get("degraded") and seen.get("recovered")
    # the cut nodes delivered what they buffered: every seq of the boot, in order
    assert summary["backlog_sent"] > 0
    for n in cut_nodes:
        seqs = [s for _b, s in core.state.node_history(n)]
        assert seqs == sorted(seqs) and seqs == list(range(1, len(seqs) + 1)), n
    snap = core.state.snapshot(time.time())
    assert all(snap.nodes[n].status == "online" for n in cut_nodes)
    assert core.ingest.counters().rejected_total == 0


def test_two_replicas_in_a_share_group_split_the_fleet(
        broker: Broker, cores: list[CoreService], tmp_path: Path) -> None:
    leader = start_core(broker, "core-r1", tmp_path, share_group="ingest")
    follower = start_core(broker, "core-r2", tmp_path, share_group="ingest", place=False)
    cores += [leader, follower]
    w = World(SimConfig(nodes=400, rate=2.0, duration_s=4.0, seed=9, node_prefix="sc"))
    # Ack mode, as agents ship (edge_agent.outbox): while the replicas first hear each other,
    # a replica drops a report of a node its peer owns (the peer's first digest counts as
    # "holding" until its last chunk: cloud_core/ownership.py); the agent resends it.
    sim = Simulator(w, sim_settings(broker, ["sim-c0", "sim-c1"]),
                    acks=sim_settings(broker, ["sim-c-acks"])[0], drain_s=30.0)
    summary = sim.run()
    assert summary["unacked"] == 0 and summary["acked_e2e"] == summary["offered"], summary

    def total() -> int:
        return leader.ingest.counters().accepted + follower.ingest.counters().accepted

    wait_for(lambda: total() >= summary["offered"], what="both replicas together: all")
    a, b = leader.ingest.counters().accepted, follower.ingest.counters().accepted
    # each report is folded by one member of the group: a part each, nothing twice (a
    # resend the other replica folded already is acknowledged as a duplicate, not folded)
    assert a > 0 and b > 0 and a + b == summary["offered"]
    names = {nd.name for nd in w.nodes}
    now = time.time()
    seen_a = set(leader.state.snapshot(now).nodes) & names
    seen_b = set(follower.state.snapshot(now).nodes) & names
    assert seen_a | seen_b == names
    assert leader.ingest.counters().rejected_total == 0
    assert follower.ingest.counters().rejected_total == 0


# ---------------------------------------------------------------------------- bridge

BRIDGE_CONF = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "bridge.conf"


def render_bridge(central: Broker, user: str, password: str) -> str:
    """The shipped bridge.conf pointed at ``central`` (address, account, CA); nothing else."""
    out = []
    for line in BRIDGE_CONF.read_text().splitlines():
        key = line.split(" ", 1)[0]
        if key == "address":
            line = f"address {central.host}:{central.port}"
        elif key in ("remote_username", "remote_clientid"):
            line = f"{key} {user}"
        elif key == "remote_password":
            line = f"remote_password {password}"
        elif key == "bridge_cafile":
            line = f"bridge_cafile {central.ca_file}"
        out.append(line)
    return "\n".join(out)


def test_shipped_bridge_carries_a_regional_fleet_to_the_central_core(
        broker_factory: Callable[..., Broker], tmp_path: Path) -> None:
    central = broker_factory()
    # The role `python -m tools.certs add-bridge` creates: reports and statuses
    # out, placements and the core's acks in.
    bridge = central.add_account("bridge-rg", "bridge")
    core = start_core(central, "core-central", tmp_path, place=False)
    try:
        regional = broker_factory(extra_conf=render_bridge(central, bridge.username,
                                                           bridge.password))
        wait_for(lambda: "bridge-rg" in central.log_text(), what="bridge connected")
        w = World(SimConfig(nodes=50, rate=2.0, duration_s=3.0, seed=11, node_prefix="rg"))
        # Ack mode: each simulated agent keeps its reports until the central
        # core's acks come back in over the bridge.
        sim = Simulator(w, sim_settings(regional, ["sim-r0"]),
                        acks=sim_settings(regional, ["sim-r-acks"])[0], drain_s=30.0)
        summary = sim.run()
        assert summary["unacked"] == 0 and summary["acked_e2e"] == summary["offered"], summary
        wait_for(lambda: core.ingest.counters().accepted >= summary["offered"],
                 what="every regional report at the central core")
        assert core.ingest.counters().accepted == summary["offered"]
        snap = core.state.snapshot(time.time())
        assert all(snap.nodes[nd.name].status == "online" for nd in w.nodes)
        # the regional broker's ACL still decides who speaks for which node
        ag = MqttClient(settings(regional, regional.add_account("edge-r1", "agent")))
        ag.start()
        assert ag.wait_connected(10)
        body = w.report_bytes(w.nodes[0], 999, "forged", time.time(), 0.0, random.Random(1))
        ag.publish(telemetry_topic(w.nodes[0].name), body).wait(5)
        time.sleep(1.0)
        ag.stop()
        assert core.state.node_history(w.nodes[0].name)[-1][0] != "forged"
    finally:
        core.stop()
