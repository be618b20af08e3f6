"""The same guarantees on both buses: Mosquitto (MQTT 5) and a 3-node NATS JetStream
cluster (its MQTT 3.1.1 listener, built from the Go module proxy by tools/nats/build.sh).

Every test runs once per bus (the module's ``broker`` fixture is parametrized, so the
shared ``core`` and ``agents`` fixtures of tests/integration/conftest.py run on it):

- per-node identity and ACL: an agent can neither speak for another node nor read
  another node's acks or placements; a wrong password is refused;
- console roles: a viewer's ``drain`` is refused and audited, an operator's runs, and
  a reply reaches only the asker;
- retained requests: refused and audited live on both (Mosquitto: retain-as-published;
  NATS, whose 3.1.1 has no such option: the bus's retained store holds the request,
  cloud_core/bus_retained.py); Mosquitto replays it to a core that subscribes later,
  which refuses it too; on NATS the core deletes the stored copy, nothing is left;
- store-and-forward with end-to-end acks: 60 simulated agents that keep each report
  until the core acknowledges it; ``cfnet-core`` as shipped is SIGKILLed, stays down
  for 60 s (an outage: a minute of reports waits on the bus) and is restarted, then a
  bus node is SIGKILLed (NATS: the node every client connected to first; Mosquitto: its
  only node) and restarted. Every report is acknowledged in the end and is in the last
  core's state once;
- the operator's ``cfnetctl received`` (``CFNET_BUS``): a resent report counted once, a
  gap shown as missing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cloud_core.console.client import ConsoleClient, ConsoleUnavailable
from cloud_core.console.protocol import Request, encode_request
from cloud_core.registry import parse_registry
from cloud_core.service import CoreConfig, CoreService
from edge_agent import wire
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import MqttClient
from tests.integration.helpers import FakeAgent, settings, wait_for
from tools.broker import Broker
from tools.nats.cluster import NatsCluster
from tools.procs import stop_all

VENV_BIN = Path(sys.executable).parent
BUSES = ("mosquitto", "nats")
Bus = Broker | NatsCluster


def make_bus(kind: str, workdir: Path) -> Bus:
    return Broker(workdir) if kind == "mosquitto" else NatsCluster(workdir)


@pytest.fixture(scope="module", params=BUSES)
def broker(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    """This module's bus: Mosquitto, then a 3-node NATS cluster (named ``broker`` so the
    shared ``core``/``agents``/``make_account`` fixtures run on it)."""
    b = make_bus(request.param, tmp_path_factory.mktemp(f"bus-{request.param}"))
    b.start()
    yield b
    b.stop()


@pytest.fixture
def bus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Bus]]:
    """A fresh bus of a kind, for a test that kills it."""
    made: list[Bus] = []

    def make(kind: str) -> Bus:
        b = make_bus(kind, tmp_path_factory.mktemp(f"own-{kind}"))
        made.append(b)
        b.start()
        return b

    yield make
    for b in made:
        b.stop()


def is_nats(b: Bus) -> bool:
    return isinstance(b, NatsCluster)


class Listener:
    """One MQTT client recording what it receives."""

    def __init__(self, b: Bus, name: str, role: Any, topics: list[str]) -> None:
        self.got: list[Message] = []
        self.client = MqttClient(settings(b, b.add_account(name, role), client_id=name,
                                          clean_start=True), on_message=self.got.append)
        for t in topics:
            self.client.subscribe(t, qos=1)
        self.client.start()
        assert self.client.wait_connected(15), self.client.last_refusal

    def topics(self) -> list[str]:
        return [m.topic for m in self.got]

    def close(self) -> None:
        self.client.stop()


def test_per_node_identity_and_acl(broker: Bus) -> None:
    core = Listener(broker, "core-acl", "core", [wire.TELEMETRY_WILDCARD])
    spy = Listener(broker, "edge-spy", "agent",
                   [wire.ack_topic("edge-spy"), wire.ack_topic("edge-victim"),
                    wire.placements_topic("edge-victim"), "cfnet/v1/nodes/+/ack", "#"])
    me = MqttClient(settings(broker, broker.add_account("edge-own", "agent"),
                             client_id="edge-own"))
    me.start()
    assert me.wait_connected(15), me.last_refusal
    try:
        # The subscriptions (NATS: JetStream consumers) settle: a first own report arrives.
        def own_arrives(tag: bytes) -> bool:
            me.publish(wire.telemetry_topic("edge-own"), tag).wait(5)
            return any(m.payload == tag for m in core.got)

        wait_for(lambda: own_arrives(b"warm"), 20, "the agent's own report at the core")
        # Speaking for another node: refused by the bus, never delivered.
        me.publish(wire.telemetry_topic("edge-victim"), b"forged").wait(5)
        me.publish(wire.status_topic("edge-victim"), b"forged", retain=True).wait(5)
        assert own_arrives(b"after") or wait_for(lambda: any(m.payload == b"after"
                                                             for m in core.got), 10,
                                                 "the marker after the forged report")
        assert b"forged" not in [m.payload for m in core.got]
        # Reading another node's acks and placements: nothing arrives; its own do.
        writer = MqttClient(settings(broker, broker.add_account("core-acl2", "core"),
                                     client_id="core-acl2"))
        writer.start()
        assert writer.wait_connected(15)
        writer.publish(wire.ack_topic("edge-victim"), b"theirs").wait(5)
        writer.publish(wire.placements_topic("edge-victim"), b"theirs", retain=True).wait(5)
        wait_for(lambda: writer.publish(wire.ack_topic("edge-spy"), b"mine").wait(5)
                 and "cfnet/v1/nodes/edge-spy/ack" in spy.topics(), 20, "the spy's own ack")
        assert [t for t in spy.topics() if "edge-spy" not in t] == []
        writer.publish(wire.placements_topic("edge-victim"), b"", retain=True).wait(5)
        writer.stop()
        # A wrong password and an unknown user are refused.
        assert broker.probe("edge-own", "not-the-password") != 0
        assert broker.probe("edge-nobody", "x") != 0
    finally:
        me.stop()
        spy.close()
        core.close()


@pytest.fixture
def ready(broker: Bus, core: CoreService, agents: dict[str, FakeAgent]) -> CoreService:
    wait_for(lambda: len(core.state.snapshot(time.time()).nodes) == 3
             and all(n.status == "online" and n.reports > 0
                     for n in core.state.snapshot(time.time()).nodes.values()),
             30, "3 nodes reporting")
    return core


def console(b: Bus, user: str) -> ConsoleClient:
    creds = b.add_account(user, "operator")
    return ConsoleClient(settings(b, creds, client_id="", clean_start=True), user, timeout_s=15)


def test_console_roles_and_private_replies(broker: Bus, ready: CoreService) -> None:
    seen: list[Message] = []
    spy = MqttClient(settings(broker, broker.add_account("bob", "operator"), client_id="bob"),
                     on_message=seen.append)
    spy.subscribe(wire.response_topic("alice"))
    spy.subscribe("cfnet/v1/console/+/response")
    spy.start()
    assert spy.wait_connected(15)
    try:
        with console(broker, "victor") as victor, console(broker, "alice") as alice:
            r = victor.call("drain", {"node": "edge-a"}, timeout_s=15)
            assert not r.ok and "permission denied" in r.error, r
            r = alice.call("drain", {"node": "edge-a"}, timeout_s=15)
            assert r.ok, r.error
            assert alice.call("nodes", timeout_s=15).ok
        audit = ready.store.audit_log()
        assert any(a["operator"] == "victor" and a["cmd"] == "drain"
                   and a["result"].startswith("error: permission denied") for a in audit)
        assert [a["result"] for a in audit
                if a["operator"] == "alice" and a["cmd"] == "drain"] == ["ok"]
        assert [m.topic for m in seen] == []
    finally:
        spy.stop()
        with console(broker, "alice") as alice:
            alice.call("uncordon", {"node": "edge-a"}, timeout_s=15)


def test_retained_request_refused_live_and_on_replay(broker: Bus, ready: CoreService,
                                                    tmp_path: Path) -> None:
    req = encode_request(Request("drain", {"node": "edge-b"}))
    with console(broker, "carol") as carol:
        r = carol.call_raw(req, timeout_s=15, retain=True)
        # Mosquitto: retain-as-published; NATS: the bus's retained store holds it.
        assert not r.ok and "retained" in r.error, r
        live = [a for a in ready.store.audit_log() if a["operator"] == "carol"]
        assert [a["result"].startswith("refused: retained") for a in live] == [True], live
        assert "edge-b" not in ready.store.cordoned()  # the drain did not run
    if is_nats(broker):
        # Nothing is left on the bus: the core deleted the stored copy, so a core that
        # subscribes later is handed nothing; an ordinary request still runs.
        assert isinstance(broker, NatsCluster)
        assert broker.retained(wire.request_topic("carol")) is None
        assert ready.retained is not None and ready.retained.deleted >= 1
        with console(broker, "carol") as carol:
            r = carol.call("cordon", {"node": "edge-b"}, timeout_s=15)
            assert r.ok, r.error
            assert carol.call("uncordon", {"node": "edge-b"}, timeout_s=15).ok
        return
    # Mosquitto keeps it: a core that subscribes later is handed the retained copy,
    # refuses it and audits it.
    creds = broker.add_account("core-late", "core")
    late = CoreService(CoreConfig(
        mqtt=settings(broker, creds, client_id="core-late", clean_start=True),
        db_path=tmp_path / "late.db", registry=parse_registry("nodes: []\n"),
        roles={"carol": "operator"}, place=False))
    late.start()
    try:
        assert late.mqtt.wait_connected(15)
        wait_for(lambda: any(a["operator"] == "carol" and a["result"].startswith(
            "refused: retained") for a in late.store.audit_log()), 20,
            "the late core refusing the replayed retained request")
        assert [a for a in late.store.audit_log() if a["result"] == "ok"] == []
    finally:
        late.stop()
    # Clear the retained request so it does not outlive the test.
    raw = MqttClient(settings(broker, broker.credentials("carol"), client_id="carol-clear",
                              clean_start=True))
    raw.start()
    assert raw.wait_connected(15)
    raw.publish(wire.request_topic("carol"), b"", retain=True).wait(5)
    raw.stop()


# ---------------------------------------------------------------- store-and-forward

FLEET = 60
CORE_KILL_AT_S = 6.0
CORE_DOWN_S = 60.0  # the core's outage: every report of that minute waits on the bus
BUS_KILL_AT_S = CORE_KILL_AT_S + CORE_DOWN_S + 7.0  # as before: 7 s after the restart
DOWN_S = 3.0  # the bus node's
RUN_S = BUS_KILL_AT_S + 7.0


def core_proc(b: Bus, tmp: Path, log_name: str) -> subprocess.Popen[bytes]:
    creds = b.add_account("core-0", "core")
    (tmp / "core.pw").write_text(creds.password)
    bus_args = ["--bus", "nats", "--broker-failover",
                ",".join(f"{h}:{p}" for h, p in b.failover), "--nats-url",
                ",".join(b.nats_urls)] if isinstance(b, NatsCluster) else ["--bus", "mosquitto"]
    out = open(tmp / log_name, "wb")  # noqa: SIM115 - the process owns it
    try:
        return subprocess.Popen(
            [str(VENV_BIN / "cfnet-core"), "--broker-host", b.host, "--broker-port",
             str(b.port), *bus_args, "--username", "core-0", "--password-file",
             str(tmp / "core.pw"), "--ca-file", str(b.ca_file), "--roles",
             str(tmp / "roles.yaml"), "--db", str(tmp / "core.db"), "--table-every", "0"],
            stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", BUSES)
def test_no_report_lost_across_core_sigkill_60s_outage_and_bus_node_kill(
        kind: str, bus_factory: Callable[[str], Bus], tmp_path: Path) -> None:
    from tools.simulate import SimConfig, Simulator, World

    b = bus_factory(kind)
    (tmp_path / "roles.yaml").write_text("operators: {alice: viewer}\n")
    sims = [settings(b, b.add_account(n, "sim"), client_id=n, session_expiry_s=0,
                     clean_start=True, keepalive_s=5, max_inflight=100)
            for n in ("sim-bk0", "sim-bk1")]
    listener = settings(b, b.add_account("sim-bk-acks", "sim"), client_id="sim-bk-acks",
                        clean_start=True, keepalive_s=5)
    world = World(SimConfig(nodes=FLEET, rate=1.0, duration_s=RUN_S, seed=7, node_prefix="bk"))
    procs = [core_proc(b, tmp_path, "core1.log")]
    # The paho client reconnects (and fails over across NATS nodes); the lean one does not.
    sim = Simulator(world, sims, acks=listener, drain_s=120.0, client="paho")
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(sim.run()), daemon=True)

    def stats(c: ConsoleClient) -> dict[str, Any] | None:
        try:
            r = c.call("stats", timeout_s=3)
        except ConsoleUnavailable:
            return None
        return r.data if r.ok else None

    c = ConsoleClient(settings(b, b.add_account("alice", "operator"), client_id="",
                               clean_start=True), "alice", timeout_s=15)
    c.connect()
    try:
        wait_for(lambda: stats(c), 60, "the first core answering")
        runner.start()
        wait_for(lambda: sim.t0 and time.time() - sim.t0 >= CORE_KILL_AT_S, 60, "core kill time")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        time.sleep(CORE_DOWN_S)  # the core stays down: reports queue on the bus
        held = sim.pending_total()
        procs.append(core_proc(b, tmp_path, "core2.log"))
        wait_for(lambda: time.time() - sim.t0 >= BUS_KILL_AT_S, 60, "bus kill time")
        if isinstance(b, NatsCluster):
            b.kill_node(0)
            time.sleep(DOWN_S)
            b.start_node(0)
        else:
            b.kill()
            time.sleep(DOWN_S)
            b.start()
        runner.join(RUN_S + 200)
        assert not runner.is_alive(), "simulator did not finish"
        assert result["pending_dropped"] == 0, result
        assert result["unacked"] == 0, result  # nothing lost: every report acknowledged
        # The outage really held reports back: most of a minute's worth of every agent's.
        assert held >= FLEET * CORE_DOWN_S * 0.75, held
        c.close()
        c.connect()  # the console's own connection may have gone with the bus node
        taken = sim.taken()
        assert sum(last for _b, last in taken.values()) == result["offered"]
        dup = 0
        for n, (boot, last) in taken.items():
            r = c.call("received", {"node": n}, timeout_s=15)
            assert r.ok, r.error
            (entry,) = [e for e in r.data["boots"] if e["boot"] == boot]
            assert entry["count"] == entry["distinct"], (n, entry)  # each report once
            dup += entry["count"] - entry["distinct"]
            got = {s for lo, hi in entry["seqs"] for s in range(lo, hi + 1)}
            # The second core holds what it took in; the first core's acked reports
            # were acknowledged before it died. Together: every seq of the run.
            assert got <= set(range(1, last + 1)), n
        print(f"\n{type(b).__name__}: {FLEET} agents, {result['offered']} reports, all "
              f"acknowledged; resent {result['resent']}; errors {result['errors']}")
    finally:
        sim.stop()
        if runner.is_alive():
            runner.join(10)
        c.close()
        stop_all(procs, grace_s=15)
    for name in ("core1.log", "core2.log"):
        text = (tmp_path / name).read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]


def test_real_agent_reports_and_is_acknowledged(broker: Bus, core: CoreService,
                                                tmp_path: Path) -> None:
    """``cfnet-agent`` as shipped (sock_diag probe, its SQLite buffer) on either bus, with
    a node id that has a dot (NATS refuses dots in client ids: the adapter maps them):
    its reports reach the core, the core's acks reach it (its buffer empties), its
    retained ``online`` status is in the core's state; SIGKILLed, its will marks it
    offline."""
    import sqlite3

    node = "edge.dot"
    creds = broker.add_account(node, "agent")
    (tmp_path / "a.pw").write_text(creds.password)
    bus_args = ["--bus", "nats", "--broker-failover",
                ",".join(f"{h}:{p}" for h, p in broker.failover)] \
        if isinstance(broker, NatsCluster) else []
    out = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - the process owns it
    try:
        p = subprocess.Popen(
            [str(VENV_BIN / "cfnet-agent"), "--node", node, "--broker-host", broker.host,
             "--broker-port", str(broker.port), *bus_args, "--password-file",
             str(tmp_path / "a.pw"), "--ca-file", str(broker.ca_file), "--buffer-path",
             str(tmp_path / "buffer.db"), "--interval-s", "0.5", "--no-ebpf",
             "--no-active-probing"], stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()

    def buffered() -> int:
        with sqlite3.connect(f"file:{tmp_path / 'buffer.db'}?mode=ro", uri=True) as db:
            return int(db.execute("SELECT COUNT(*) FROM reports").fetchone()[0])

    try:
        wait_for(lambda: (n := core.state.snapshot(time.time()).nodes.get(node)) is not None
                 and n.reports >= 4 and n.status == "online", 30,
                 "the agent's status and reports at the core")
        # Acknowledged end to end: the agent deletes what the core acknowledged.
        wait_for(lambda: buffered() <= 2, 30, "the agent's buffer emptied by the core's acks")
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        wait_for(lambda: core.state.snapshot(time.time()).nodes[node].status == "offline",
                 30, "the agent's last will at the core")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    text = (tmp_path / "agent.log").read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]


def test_cfnetctl_received_counts_each_report_once(broker: Bus, core: CoreService) -> None:
    """The operator's ``cfnetctl received`` on either bus (``--bus``/``CFNET_BUS``): the
    core's folded-in seqs per boot, a resent report counted once, a gap shown as such. A
    node of its own, without a retained status (it would be a fourth node for a later
    core of the module)."""
    import json
    import os

    ag = FakeAgent(broker, broker.add_account("edge-rcv", "agent"), "10.9.0.19")
    try:
        for _ in range(4):
            ag.report()  # 1..4
        ag.seq = 1
        ag.report()  # 2 again: a resend, dropped as a duplicate
        ag.seq = 6
        ag.report()  # 7: 5 and 6 never sent
        wait_for(lambda: len(core.state.node_history("edge-rcv")) == 5, 20, "5 folded in")
        creds = broker.add_account("victor", "operator")  # a viewer in the core's roles
        env = {**os.environ, "CFNET_BROKER_HOST": broker.host,
               "CFNET_BROKER_PORT": str(broker.port), "CFNET_USER": "victor",
               "CFNET_PASSWORD": creds.password, "CFNET_CA_FILE": str(broker.ca_file),
               "CFNET_BUS": "nats" if is_nats(broker) else "mosquitto",
               "CFNET_BROKER_FAILOVER": ",".join(
                   f"{h}:{p}" for h, p in getattr(broker, "failover", ()))}
        r = subprocess.run([str(VENV_BIN / "cfnetctl"), "--timeout", "15", "-o", "json",
                            "received", "edge-rcv"], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        (entry,) = json.loads(r.stdout)["boots"]
        assert (entry["boot"], entry["count"], entry["distinct"], entry["seqs"]) == (
            ag.boot, 5, 5, [[1, 4], [7, 7]]), entry
    finally:
        ag.close()
