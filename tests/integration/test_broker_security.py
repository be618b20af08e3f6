"""Security of the locked-down broker, checked against a real Mosquitto over TLS.

What Mosquitto 2.0.11 does (the assertions below pin it):

- CONNECT with a wrong password, an unknown user or no credentials: CONNACK
  reason 0x87 "Not authorized" (MQTT 5; never 0x86 "Bad user name or
  password"), return code 5 with MQTT 3.1.1, and the connection is closed.
- Plain TCP to the TLS port: the TLS layer drops the connection; no CONNACK.
- QoS 1 PUBLISH inside the ACL: PUBACK 0x00, or 0x10 "No matching
  subscribers" when nobody listens (accepted all the same, retained is kept).
- QoS 1 PUBLISH outside the ACL: PUBACK reason 0x87 "Not authorized", the
  client stays connected, and the message is dropped (nobody receives it).
  QoS 0: no ack exists, the message is silently dropped.
- SUBSCRIBE outside the ACL: *granted* in the SUBACK (the default ACL check
  does not look at subscriptions); every delivery, retained ones included, is
  checked against the message's topic, so nothing is ever delivered.

"Nothing delivered" is proven without sleeping: after the forbidden message the
same publisher sends a sentinel the receiver may read; Mosquitto delivers one
publisher's messages to one subscriber in order, so once the sentinel is in,
the forbidden message would have been too.

paho is used directly here (not through ``edge_agent.wire.mqtt``) because these
tests assert raw reason codes that an adapter rightly hides.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from edge_agent import wire
from tools.broker import (
    MAX_PACKET_SIZE,
    MOSQUITTO,
    Broker,
    Credentials,
    free_port,
    mqtt_connect_probe,
)
from tools.certs import CertError, CertStore, Role, check_name, render_acl

WAIT_S = 10.0
NOT_AUTHORIZED = 0x87
# PUBACK success: 0x00, or 0x10 'No matching subscribers' (still accepted).
OK = (0x00, 0x10)

MakeAccount = Callable[[str, str], Credentials]


class Client:
    """A paho MQTT 5 client with blocking, bounded helpers and a message queue."""

    def __init__(
        self,
        broker: Broker,
        creds: Credentials | None,
        *,
        tls: bool = True,
        client_id: str = "",
        will_topic: str | None = None,
    ) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"t-{uuid.uuid4().hex[:12]}",
            protocol=mqtt.MQTTv5,
        )
        if will_topic is not None:
            self.client.will_set(will_topic, b"offline", qos=1, retain=False)
        if creds is not None:
            self.client.username_pw_set(creds.username, creds.password)
        if tls:
            self.client.tls_set(ca_certs=str(broker.ca_file))
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connack: ReasonCode | None = None
        self._connected = threading.Event()
        self.disconnected = threading.Event()
        self._lock = threading.Lock()
        self._acks: dict[int, object] = {}
        self._ack_events: dict[int, threading.Event] = {}
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = lambda _c, _u, msg: self.messages.put(msg)
        self.broker = broker

    def _on_connect(self, _c: object, _u: object, _f: object, rc: ReasonCode, _p: object) -> None:
        self.connack = rc
        self._connected.set()

    def _on_disconnect(self, _c: object, _u: object, _f: object, rc: object, _p: object) -> None:
        self.disconnected.set()
        self._connected.set()

    def _ack(self, mid: int, value: object) -> None:
        with self._lock:
            self._acks[mid] = value
            self._ack_events.setdefault(mid, threading.Event()).set()

    def _on_publish(self, _c: object, _u: object, mid: int, rc: ReasonCode, _p: object) -> None:
        self._ack(mid, rc)

    def _on_subscribe(
        self, _c: object, _u: object, mid: int, rcs: list[ReasonCode], _p: object
    ) -> None:
        self._ack(mid, rcs)

    def _wait_ack(self, mid: int) -> object:
        with self._lock:
            ev = self._ack_events.setdefault(mid, threading.Event())
        assert ev.wait(WAIT_S), f"no ack for mid {mid} within {WAIT_S}s"
        with self._lock:
            return self._acks[mid]

    def connect(self) -> ReasonCode | None:
        """Connect; the CONNACK reason code, or None if the broker never sent one."""
        self.client.reconnect_delay_set(min_delay=30, max_delay=60)  # no quick rejoin
        self.client.connect(self.broker.host, self.broker.port, keepalive=30)
        self.client.loop_start()
        assert self._connected.wait(WAIT_S), "neither CONNACK nor disconnect"
        return self.connack

    def publish(self, topic: str, payload: bytes = b"x", *, retain: bool = False) -> int:
        """QoS 1 publish; the PUBACK reason code value."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        rc = self._wait_ack(info.mid)
        assert isinstance(rc, ReasonCode)
        return int(rc.value)

    def publish_qos0(self, topic: str, payload: bytes = b"x") -> None:
        self.client.publish(topic, payload, qos=0).wait_for_publish(WAIT_S)

    def subscribe(self, topic: str) -> list[int]:
        """QoS 1 subscribe; the SUBACK reason code values."""
        _, mid = self.client.subscribe(topic, qos=1)
        assert mid is not None
        rcs = self._wait_ack(mid)
        assert isinstance(rcs, list)
        return [int(rc.value) for rc in rcs]

    def until(self, topic: str, payload: bytes) -> list[tuple[str, bytes]]:
        """Everything received up to and including (topic, payload); fails after WAIT_S."""
        seen: list[tuple[str, bytes]] = []
        while True:
            try:
                msg = self.messages.get(timeout=WAIT_S)
            except queue.Empty:
                pytest.fail(f"{topic} {payload!r} not received; got {seen}")
            seen.append((msg.topic, bytes(msg.payload)))
            if (msg.topic, msg.payload) == (topic, payload):
                return seen

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def drop(self) -> None:
        """Vanish without DISCONNECT, as a crashed client does (its will fires)."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.close()


@pytest.fixture
def connect(broker: Broker) -> Iterator[Callable[..., Client]]:
    """Connected clients on the module broker, closed at teardown."""
    made: list[Client] = []

    def make(creds: Credentials, **kwargs: Any) -> Client:
        c = Client(broker, creds, **kwargs)
        made.append(c)
        rc = c.connect()
        assert rc is not None and not rc.is_failure, f"{creds.username}: {rc}"
        return c

    yield make
    for c in made:
        c.close()


def _wait_log(broker: Broker, text: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while text not in broker.log_text():
        assert time.monotonic() < deadline, f"{text!r} not in the broker log"
        time.sleep(0.02)


def _tok() -> bytes:
    return uuid.uuid4().hex.encode()


# --------------------------------------------------------------------------- authentication


def test_wrong_password_refused(broker: Broker, make_account: MakeAccount) -> None:
    good = make_account("node-pw", "agent")
    bad = Credentials(good.username, good.password + "x", good.ca_file, None, None)
    c = Client(broker, bad)
    try:
        rc = c.connect()
    finally:
        c.close()
    assert rc is not None and rc.is_failure
    assert rc.value == NOT_AUTHORIZED, rc  # 2.0.11 never sends 0x86


def test_unknown_user_and_anonymous_refused(broker: Broker) -> None:
    stranger = Credentials("node-nobody", "secret", broker.ca_file, None, None)
    for creds in (stranger, None):
        c = Client(broker, creds)
        try:
            rc = c.connect()
        finally:
            c.close()
        assert rc is not None and rc.is_failure, (creds, rc)
        assert rc.value == NOT_AUTHORIZED, rc  # 2.0.11 never sends 0x86
    # The same refusals with MQTT 3.1.1: CONNACK return code 5, "not authorised".
    assert broker.probe(None, None) == 5
    assert broker.probe("node-nobody", "secret") == 5


def test_plain_tcp_to_tls_port_refused(broker: Broker, make_account: MakeAccount) -> None:
    creds = make_account("node-plain", "agent")
    with pytest.raises(OSError):
        mqtt_connect_probe(
            broker.host, broker.port, username=creds.username, password=creds.password,
            ca_file=None,
        )  # fmt: skip
    # And through paho without TLS: no CONNACK, only a disconnect.
    c = Client(broker, creds, tls=False)
    try:
        assert c.connect() is None
    finally:
        c.close()


def test_tls_needs_the_cfnet_ca(broker: Broker) -> None:
    ctx = ssl.create_default_context()  # system CAs only: the broker's cert is not trusted
    with (
        socket.create_connection((broker.host, broker.port), timeout=WAIT_S) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        ctx.wrap_socket(raw, server_hostname=broker.host)


def _opened_ports(log: str) -> list[str]:
    return [ln.split(": ", 1)[1] for ln in log.splitlines() if "listen socket on port" in ln]


def test_default_broker_has_only_the_tls_listener(broker: Broker) -> None:
    # What Mosquitto actually opened (a misplaced listener option opens 1883).
    assert _opened_ports(broker.log_text()) == [
        f"Opening ipv4 listen socket on port {broker.port}."
    ]
    conf = broker.conf_file.read_text().splitlines()
    listeners = [ln for ln in conf if ln.startswith("listener ")]
    assert listeners == [f"listener {broker.port} 127.0.0.1"]
    for needed in ("allow_anonymous false", "per_listener_settings false"):
        assert needed in conf
    assert any(ln.startswith("certfile ") for ln in conf)


def test_client_certificate_is_accepted(broker: Broker, make_account: MakeAccount) -> None:
    creds = make_account("node-mtls", "agent")
    assert creds.certfile is not None and creds.keyfile is not None
    c = Client(broker, creds, tls=False)
    c.client.tls_set(
        ca_certs=str(broker.ca_file), certfile=str(creds.certfile), keyfile=str(creds.keyfile)
    )
    try:
        rc = c.connect()
    finally:
        c.close()
    assert rc is not None and not rc.is_failure, rc


# --------------------------------------------------------------------------- agents


def test_agent_cannot_publish_for_another_node(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    a = connect(make_account("node-a", "agent"))
    make_account("node-b", "agent")
    core = connect(make_account("core-sec", "core"))
    assert core.subscribe(wire.TELEMETRY_WILDCARD) == [1]
    assert core.subscribe(wire.STATUS_WILDCARD) == [1]

    forged = b"forged-" + _tok()
    assert a.publish(wire.telemetry_topic("node-b"), forged) == NOT_AUTHORIZED
    assert a.publish(wire.status_topic("node-b"), forged) == NOT_AUTHORIZED
    a.publish_qos0(wire.telemetry_topic("node-b"), forged)  # no ack at QoS 0: dropped
    sentinel = _tok()
    assert a.publish(wire.telemetry_topic("node-a"), sentinel) in OK
    seen = core.until(wire.telemetry_topic("node-a"), sentinel)
    assert all(payload != forged for _, payload in seen), seen


def test_agent_cannot_write_placements_console_or_events(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    a = connect(make_account("node-c", "agent"))
    make_account("carol", "operator")
    for topic in (
        wire.placements_topic("node-c"),  # not even its own: only core places
        wire.request_topic("carol"),
        wire.response_topic("carol"),
        wire.EVENTS_TOPIC,
        "cfnet/v1/nodes/node-c/other",
        "$SYS/broker/x",
    ):
        assert a.publish(topic) == NOT_AUTHORIZED, topic


def test_agent_reads_own_placements_only(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    core = connect(make_account("core-sec", "core"))
    mine, theirs = _tok(), _tok()
    # Retained first: delivery of retained messages on SUBSCRIBE is checked too.
    assert core.publish(wire.placements_topic("node-e"), theirs, retain=True) in OK
    a = connect(make_account("node-d", "agent"))
    make_account("node-e", "agent")
    # Mosquitto 2.0.11 grants these SUBACKs; the ACL is applied per delivery.
    assert a.subscribe(wire.placements_topic("node-e")) == [1]
    assert a.subscribe("cfnet/v1/nodes/+/placements") == [1]
    assert a.subscribe("#") == [1]
    assert core.publish(wire.placements_topic("node-e"), theirs) in OK
    assert core.publish(wire.telemetry_topic("node-e"), theirs) == NOT_AUTHORIZED
    assert core.publish(wire.placements_topic("node-d"), mine, retain=True) in OK
    seen = a.until(wire.placements_topic("node-d"), mine)
    assert {t for t, _ in seen} == {wire.placements_topic("node-d")}, seen
    # Own retained placements arrive on a fresh subscription.
    a2 = connect(make_account("node-d", "agent"))
    assert a2.subscribe(wire.placements_topic("node-d")) == [1]
    assert a2.until(wire.placements_topic("node-d"), mine)
    assert core.publish(wire.placements_topic("node-d"), b"", retain=True) in OK
    assert core.publish(wire.placements_topic("node-e"), b"", retain=True) in OK
    # The core's end-to-end acks likewise: only the node's own reach it, and an
    # agent cannot forge one (to itself or anyone). (a2 took over a's session.)
    assert a2.subscribe("#") == [1]
    a = a2
    ack_theirs, ack_mine = _tok(), _tok()
    assert core.publish(wire.ack_topic("node-e"), ack_theirs) in OK
    assert core.publish(wire.ack_topic("node-d"), ack_mine) in OK
    seen = a.until(wire.ack_topic("node-d"), ack_mine)
    assert ack_theirs not in {p for _, p in seen}, seen
    assert a.publish(wire.ack_topic("node-d")) == NOT_AUTHORIZED
    assert a.publish(wire.ack_topic("node-e")) == NOT_AUTHORIZED


def test_agent_cannot_take_over_another_nodes_session(
    broker: Broker, make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    b = connect(make_account("node-tb", "agent"), client_id="agent-node-tb")
    # The attacker sends B's client id; the broker replaces it with "node-ta".
    a = connect(make_account("node-ta", "agent"), client_id="agent-node-tb")
    core = connect(make_account("core-sec", "core"))
    assert core.subscribe(wire.STATUS_WILDCARD) == [1]
    tok = _tok()
    assert a.publish(wire.status_topic("node-ta"), tok) in OK
    assert b.publish(wire.status_topic("node-tb"), tok) in OK  # B is still connected
    assert core.until(wire.status_topic("node-tb"), tok)
    assert not b.disconnected.is_set()


def test_agent_will_for_another_node_is_not_published(
    broker: Broker, make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    core = connect(make_account("core-sec", "core"))
    assert core.subscribe(wire.STATUS_WILDCARD) == [1]
    # Mosquitto 2.0.11 accepts the CONNECT; the will is checked when it fires.
    a = connect(make_account("node-wa", "agent"), will_topic=wire.status_topic("node-wb"))
    a.drop()
    _wait_log(broker, "Client node-wa closed its connection.")  # its will is done with
    honest = connect(make_account("node-wc", "agent"), will_topic=wire.status_topic("node-wc"))
    honest.drop()
    seen = core.until(wire.status_topic("node-wc"), b"offline")
    assert wire.status_topic("node-wb") not in {t for t, _ in seen}, seen


def test_oversized_packet_disconnects(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    a = connect(make_account("node-big", "agent"))
    topic = wire.telemetry_topic("node-big")
    assert a.publish(topic, b"x" * wire.MAX_PAYLOAD_BYTES) in OK
    a.client.publish(topic, b"x" * (MAX_PACKET_SIZE + 1), qos=1)
    assert a.disconnected.wait(WAIT_S), "broker kept a client that sent an oversized packet"


# --------------------------------------------------------------------------- operators


def test_operator_cannot_publish_telemetry(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    op = connect(make_account("alice", "operator"))
    make_account("node-f", "agent")
    for topic in (
        wire.telemetry_topic("alice"),
        wire.status_topic("alice"),
        wire.telemetry_topic("node-f"),
        wire.placements_topic("node-f"),
        wire.EVENTS_TOPIC,
        wire.request_topic("bob"),
        wire.response_topic("alice"),
    ):
        assert op.publish(topic) == NOT_AUTHORIZED, topic
    assert op.publish(wire.request_topic("alice")) in OK


def test_operator_cannot_read_another_operators_responses(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    alice = connect(make_account("alice", "operator"))
    make_account("bob", "operator")
    core = connect(make_account("core-sec", "core"))
    # Granted by Mosquitto 2.0.11 (QoS 1), but nothing is ever delivered.
    assert alice.subscribe(wire.response_topic("bob")) == [1]
    assert alice.subscribe("cfnet/v1/console/+/response") == [1]
    assert alice.subscribe(wire.request_topic("bob")) == [1]
    secret, sentinel = b"bob-only-" + _tok(), _tok()
    assert core.publish(wire.response_topic("bob"), secret) in OK
    assert core.publish(wire.response_topic("alice"), sentinel) in OK
    seen = alice.until(wire.response_topic("alice"), sentinel)
    assert all(payload != secret for _, payload in seen), seen


def test_operator_reads_events_and_core_reads_requests(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    alice = connect(make_account("alice", "operator"))
    core = connect(make_account("core-sec", "core"))
    assert alice.subscribe(wire.EVENTS_TOPIC) == [1]
    assert core.subscribe(wire.REQUEST_WILDCARD) == [1]
    req, ev = _tok(), _tok()
    assert alice.publish(wire.request_topic("alice"), req) in OK
    assert core.until(wire.request_topic("alice"), req)
    assert core.publish(wire.EVENTS_TOPIC, ev) in OK
    assert alice.until(wire.EVENTS_TOPIC, ev)


# --------------------------------------------------------------------------- core and sim


def test_core_reads_all_telemetry_and_shared_subscriptions(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    core = connect(make_account("core-sec", "core"))
    core2 = connect(make_account("core-sec2", "core"))
    assert core.subscribe(wire.TELEMETRY_WILDCARD) == [1]
    assert core2.subscribe("$share/ingest/" + wire.STATUS_WILDCARD) == [1]
    g, h = connect(make_account("node-g", "agent")), connect(make_account("node-h", "agent"))
    tg, th = _tok(), _tok()
    assert g.publish(wire.telemetry_topic("node-g"), tg) in OK
    assert core.until(wire.telemetry_topic("node-g"), tg)
    assert h.publish(wire.telemetry_topic("node-h"), th) in OK
    assert core.until(wire.telemetry_topic("node-h"), th)
    assert h.publish(wire.status_topic("node-h"), th) in OK
    assert core2.until(wire.status_topic("node-h"), th)


def test_core_cannot_speak_for_nodes_or_operators(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    core = connect(make_account("core-sec", "core"))
    for topic in (
        wire.telemetry_topic("node-g"),
        wire.status_topic("node-g"),
        wire.request_topic("alice"),
    ):
        assert core.publish(topic) == NOT_AUTHORIZED, topic


def test_sim_writes_any_node_reads_only_acks(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    sim = connect(make_account("sim-load", "sim"))
    core = connect(make_account("core-sec", "core"))
    assert core.subscribe(wire.TELEMETRY_WILDCARD) == [1]
    assert sim.subscribe("#") == [1]
    tok = _tok()
    for n in range(3):
        assert sim.publish(wire.telemetry_topic(f"node-sim{n}"), tok) in OK
        assert sim.publish(wire.status_topic(f"node-sim{n}"), tok) in OK
    assert core.until(wire.telemetry_topic("node-sim2"), tok)
    assert sim.publish(wire.placements_topic("node-sim0")) == NOT_AUTHORIZED
    assert sim.publish(wire.EVENTS_TOPIC) == NOT_AUTHORIZED
    assert sim.publish(wire.ack_topic("node-sim0")) == NOT_AUTHORIZED
    sentinel = _tok()
    assert core.publish(wire.EVENTS_TOPIC, sentinel) in OK
    assert core.publish(wire.placements_topic("node-sim1"), sentinel) in OK
    ack = _tok()
    assert core.publish(wire.ack_topic("node-sim1"), ack) in OK
    # '#' granted, yet the only thing a sim reads is the acks of the nodes it plays.
    seen = sim.until(wire.ack_topic("node-sim1"), ack)
    assert {t for t, _ in seen} == {wire.ack_topic("node-sim1")}, seen


def test_bridge_role_carries_reports_out_placements_and_acks_in(
    make_account: MakeAccount, connect: Callable[..., Client]
) -> None:
    br = connect(make_account("bridge-eu", "bridge"))
    core = connect(make_account("core-sec", "core"))
    assert core.subscribe(wire.TELEMETRY_WILDCARD) == [1]
    assert br.subscribe("#") == [1]
    tok = _tok()
    assert br.publish(wire.telemetry_topic("node-br1"), tok) in OK
    assert br.publish(wire.status_topic("node-br1"), tok) in OK
    assert core.until(wire.telemetry_topic("node-br1"), tok)
    for t in (wire.placements_topic("node-br1"), wire.ack_topic("node-br1"), wire.EVENTS_TOPIC,
              wire.request_topic("alice"), wire.response_topic("alice")):
        assert br.publish(t) == NOT_AUTHORIZED, t
    ev, pl, ack = _tok(), _tok(), _tok()
    assert core.publish(wire.EVENTS_TOPIC, ev) in OK
    assert core.publish(wire.placements_topic("node-br1"), pl) in OK
    assert core.publish(wire.ack_topic("node-br1"), ack) in OK
    seen = br.until(wire.ack_topic("node-br1"), ack)
    # one publisher, one order: the placements came first, the events never
    assert seen == [(wire.placements_topic("node-br1"), pl), (wire.ack_topic("node-br1"), ack)]


# --------------------------------------------------------------------------- accounts


def test_registry_refuses_clashes_and_bad_names(tmp_path: Path) -> None:
    store = CertStore(tmp_path / "pki")
    store.init()
    creds, created = store.add_account("node-1", "agent")
    assert created
    again, created_again = store.add_account("node-1", "agent")
    assert again == creds and not created_again  # idempotent: same password
    with pytest.raises(CertError, match="already a agent"):
        store.add_account("node-1", "operator")
    for name, role in (("core-x", "operator"), ("sim-x", "agent"), ("core-y", "sim"),
                       ("bridge-x", "agent"), ("sim-z", "bridge")):
        with pytest.raises(CertError, match="reserved"):
            store.add_account(name, role)  # type: ignore[arg-type]
    for bad in ("a/b", "+", "#", "Node", "", "x" * 64, "a b", "-a", "node-1\n", "a\nb"):
        with pytest.raises(CertError, match="not a valid id"):
            store.add_account(bad, "agent")
    with pytest.raises(CertError, match="unknown role"):
        store.add_account("node-2", "admin")  # type: ignore[arg-type]
    store.add_account("core-main", "core")  # any core-* name, explicit role
    assert store.accounts() == {"node-1": "agent", "core-main": "core"}


def test_acl_has_no_patterns_and_nothing_for_anonymous() -> None:
    text = render_acl({"node-1": "agent", "alice": "operator", "core-1": "core", "sim-1": "sim"})
    rules = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert not any(ln.startswith("pattern") for ln in rules)
    assert rules[0].startswith("user "), "a topic line before any user applies to anonymous"
    assert "%" not in text
    block = text.split("user alice\n")[1].split("\n\n")[0].splitlines()
    assert block == [
        "topic write cfnet/v1/console/alice/request",
        "topic read cfnet/v1/console/alice/response",
        "topic read cfnet/v1/events",
    ]


def _parse_acl(text: str) -> dict[str, list[tuple[str, str]]]:
    blocks: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if words[0] == "user":
            assert words[1] not in blocks, f"two blocks for {words[1]}"
            current = blocks[words[1]] = []
        else:
            assert words[0] == "topic" and current is not None, line
            current.append((words[1], words[2]))
    return blocks


_names = st.from_regex(wire.ID_RE, fullmatch=True)
_roles = st.sampled_from(["agent", "operator", "core", "sim", "bridge"])


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_names, _roles, max_size=6))
def test_acl_grants_each_account_only_its_own_topics(raw: dict[str, Role]) -> None:
    accounts: dict[str, Role] = {}
    for name, role in raw.items():
        with contextlib.suppress(CertError):
            check_name(name, role)
            accounts[name] = role
    blocks = _parse_acl(render_acl(accounts))
    assert set(blocks) == set(accounts)
    for name, rules in blocks.items():
        role = accounts[name]
        for access, topic in rules:
            if role in ("agent", "operator") and topic != wire.EVENTS_TOPIC:
                # Exactly one id level, and it is the account's own name.
                assert "+" not in topic and "#" not in topic, (name, topic)
                assert wire.split_topic(topic)[1] == name, (name, topic)
            if role == "agent":
                assert wire.split_topic(topic)[0] == "nodes"
            if role == "operator":
                assert topic == wire.EVENTS_TOPIC or wire.split_topic(topic)[0] == "console"
                assert access == "read" or topic.endswith("/request")
            if role == "sim":
                assert (access == "write" and topic.startswith("cfnet/v1/nodes/+/")) or (
                    (access, topic) == ("read", wire.ACK_WILDCARD)), (name, topic)
            if role == "bridge":
                assert topic.startswith("cfnet/v1/nodes/+/"), (name, topic)
                assert (access == "write") == topic.endswith(("/telemetry", "/status")), topic
            if role == "core" and "write" in access:
                assert not topic.endswith(("/telemetry", "/status", "/request")), topic
            assert "#" not in topic


def test_removed_account_is_refused_and_powerless(broker_factory: Callable[..., Broker]) -> None:
    b = broker_factory(persistence=False)
    core = Client(b, b.add_account("core-rm", "core"))
    victim = Client(b, b.add_account("node-rm", "agent"))
    try:
        assert core.connect() is not None and victim.connect() is not None
        assert core.subscribe(wire.TELEMETRY_WILDCARD) == [1]
        creds = b.credentials("node-rm")
        b.remove_account("node-rm")
        assert b.probe(creds.username, creds.password) == 5
        assert not (b.store.client_dir("node-rm")).exists()
        # Mosquitto 2.0.11 re-checks connected clients on reload and drops this one.
        assert victim.disconnected.wait(WAIT_S)
        again = Client(b, creds)
        try:
            rc = again.connect()
        finally:
            again.close()
        assert rc is not None and rc.value == NOT_AUTHORIZED
    finally:
        victim.close()
        core.close()


def test_account_added_while_running_is_live_at_once(broker_factory: Callable[..., Broker]) -> None:
    b = broker_factory(persistence=False)
    creds = b.add_account("node-late", "agent")
    assert b.probe(creds.username, creds.password) == 0


def test_restart_keeps_port_and_retained_messages(broker_factory: Callable[..., Broker]) -> None:
    b = broker_factory()
    core_creds = b.add_account("core-r", "core")
    port = b.port
    core = Client(b, core_creds)
    try:
        assert core.connect() is not None
        tok = _tok()
        assert core.publish(wire.placements_topic("node-r"), tok, retain=True) in OK
    finally:
        core.close()
    b.restart()
    assert b.port == port
    core = Client(b, core_creds)
    try:
        assert core.connect() is not None
        assert core.subscribe(wire.placements_topic("node-r")) == [1]
        assert core.until(wire.placements_topic("node-r"), tok)
    finally:
        core.close()


# --------------------------------------------------------------------------- production config

DEPLOY_CONF = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "mosquitto.conf"


def _directives(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


EXAMPLE_ACCOUNTS: dict[str, Role] = {
    "edge-berlin-01": "agent",
    "edge-paris-02": "agent",
    "alice": "operator",
    "core-1": "core",
    "bridge-eu-west": "bridge",
    "sim-load": "sim",
}


def test_shipped_example_acl_is_what_the_tool_renders() -> None:
    shipped = (DEPLOY_CONF.parent / "acl").read_text()
    assert shipped.endswith(render_acl(EXAMPLE_ACCOUNTS))


def test_production_conf_is_locked_down() -> None:
    lines = _directives(DEPLOY_CONF.read_text())
    for needed in (
        # per listener: the agents' certificate listener (agent-listener.conf) has %u
        # patterns that must not apply here; so this listener locks itself down below.
        "per_listener_settings true",
        "allow_anonymous false",
        "persistence true",
        "require_certificate false",
    ):
        assert needed in lines, needed
    keys = {ln.split()[0] for ln in lines}
    for key in (
        "password_file", "acl_file", "max_packet_size", "max_inflight_messages",
        "persistent_client_expiration", "cafile", "certfile", "keyfile",
    ):  # fmt: skip
        assert key in keys, key
    listeners = [ln for ln in lines if ln.startswith("listener ")]
    assert listeners == ["listener 8883"]
    # TLS and security settings follow the only listener, so they belong to it.
    after = lines[lines.index("listener 8883") :]
    assert any(ln.startswith("certfile ") for ln in after)
    for needed in ("allow_anonymous false", "password_file", "acl_file"):
        assert any(ln.startswith(needed) for ln in after), needed
    before = lines[: lines.index("listener 8883")]
    assert not [ln for ln in before if ln.split()[0] in ("allow_anonymous", "password_file",
                                                         "acl_file")]
    agent = _directives((DEPLOY_CONF.parent / "agent-listener.conf").read_text())
    assert agent[0] == "listener 8884"
    for needed in ("allow_anonymous false", "require_certificate true",
                   "use_identity_as_username true", "use_username_as_clientid true"):
        assert needed in agent, needed
    assert "password_file" not in {ln.split()[0] for ln in agent}


def test_production_conf_runs_with_cert_tool_output(tmp_path: Path) -> None:
    """The shipped config, pointed at a cert-tool directory, starts and refuses strangers."""
    if not os.access(MOSQUITTO, os.X_OK):
        pytest.skip(f"{MOSQUITTO} not installed")
    store = CertStore(tmp_path / "pki")
    store.init()
    creds, _ = store.add_account("node-prod", "agent")
    port = free_port()
    (tmp_path / "data").mkdir()
    conf = (
        DEPLOY_CONF.read_text()
        .replace("/etc/mosquitto/cfnet/", f"{store.root}/")
        .replace("/var/lib/mosquitto/", f"{tmp_path / 'data'}/")
        .replace("\nlistener 8883\n", f"\nlistener {port} 127.0.0.1\n")
        .replace("\nlog_dest stderr\n", f"\nlog_dest file {tmp_path / 'log'}\n")
    )
    if os.geteuid() == 0:  # the temp dir is root-only; production drops to 'mosquitto'
        conf = conf.replace("\nuser mosquitto\n", "\nuser root\n")
    (tmp_path / "m.conf").write_text(conf)
    proc = subprocess.Popen(
        [MOSQUITTO, "-c", str(tmp_path / "m.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        code: int | None = None
        while code is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                code = mqtt_connect_probe(
                    "127.0.0.1", port, username=creds.username, password=creds.password,
                    ca_file=store.ca_file,
                )  # fmt: skip
            except OSError:
                time.sleep(0.05)
        log = (tmp_path / "log").read_text(errors="replace")
        assert code == 0, (proc.poll(), log)
        assert _opened_ports(log) == [f"Opening ipv4 listen socket on port {port}."], log
        anon = mqtt_connect_probe(
            "127.0.0.1", port, username=None, password=None, ca_file=store.ca_file
        )
        assert anon == 5
        with pytest.raises(OSError):
            mqtt_connect_probe(
                "127.0.0.1", port, username=creds.username, password=creds.password,
                ca_file=None,
            )  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=WAIT_S)


def test_kill_then_start_on_the_same_port(broker_factory: Callable[..., Broker]) -> None:
    b = broker_factory(persistence=False)
    creds = b.add_account("node-k", "agent")
    port, pid = b.port, b.pid
    assert pid is not None
    b.kill()
    assert not b.running
    with pytest.raises(OSError):
        b.probe(creds.username, creds.password)
    b.start()
    assert b.port == port and b.pid != pid
    assert b.probe(creds.username, creds.password) == 0

