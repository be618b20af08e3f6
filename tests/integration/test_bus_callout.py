"""MQTT client IDs on the clustered bus: who may hold which session (docs/security.md).

On Mosquitto ``use_username_as_clientid`` makes the client ID the username. NATS's MQTT
listener has no such option. Shown here on a real 3-node cluster:

* **Current behaviour of a plain NATS config** (password users only, what
  ``python -m tools.nats.cluster accounts`` renders): node A's credentials connect with node
  B's client ID, are *accepted*, resume B's session (session present, B's subscription
  with it) and disconnect B. This test asserts that behaviour on purpose: it is the gap
  the callout closes, and it fails when a nats-server release closes it by itself.
* **With the auth callout** (``cloud_core.bus_callout``, ``NatsCluster(callout=True)``): A's
  credentials with B's ID are refused (CONNACK 5) and B stays connected; B's own IDs, A's
  own, an operator's server-assigned ID are accepted; the permissions the callout issues
  are the cfnet ACL; every refusal is answered with its reason and counted in the log.
* **Edge sites**: a site's leaf node still links up to the hub (its user bypasses the
  callout). Agents *at* a site connect to the leaf, which has no callout (docs/security.md).
* **Callout down**: fail closed. Clients already connected stay; every new connection,
  the edge agent's own client included, is refused until the callout is back; the agent
  keeps retrying (buffering meanwhile) and is admitted then, by itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edge_agent.wire import placements_topic
from edge_agent.wire.mqtt import MqttClient
from tests.integration.helpers import settings
from tools.broker import mqtt_connect_probe
from tools.nats.cluster import NatsCluster
from tools.nats.leaf import EdgeLeaf

WAIT_S = 20.0


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("plain")) as c:
        c.add_account("nodea", "agent")
        c.add_account("nodeb", "agent")
        yield c


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("callout"), callout=True, leafnodes=True) as c:
        c.add_account("nodea", "agent")
        c.add_account("nodeb", "agent")
        c.add_account("ops", "operator")
        yield c


class Client:
    """A paho 3.1.1 client that records CONNACK, SUBACK and disconnects."""

    def __init__(self, bus: NatsCluster, node: int, user: str, client_id: str,
                 *, clean: bool = False) -> None:
        creds = bus.credentials(user)
        self.connack = threading.Event()
        self.rc: int | None = None
        self.session_present: bool | None = None
        self.gone = threading.Event()
        self.suback = threading.Event()
        self.granted: list[int] = []
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                        protocol=paho.MQTTv311, clean_session=clean)
        c.username_pw_set(creds.username, creds.password)
        c.tls_set(ca_certs=str(bus.ca_file))
        c.on_connect = self._on_connect
        c.on_disconnect = lambda *_a: self.gone.set()
        c.on_subscribe = self._on_subscribe  # type: ignore[assignment]
        self.c = c
        host, port = bus.addresses[node]
        c.connect(host, port, keepalive=30)
        c.loop_start()
        assert self.connack.wait(WAIT_S), f"no CONNACK for {user} as {client_id!r}"

    def _on_connect(self, _c: object, _u: object, flags: object, rc: object,
                    _p: object = None) -> None:
        self.rc = int(getattr(rc, "value", rc))  # type: ignore[call-overload]
        self.session_present = bool(getattr(flags, "session_present", False))
        self.connack.set()

    def _on_subscribe(self, _c: object, _u: object, _mid: int, codes: list[object],
                      _p: object = None) -> None:
        self.granted = [int(getattr(x, "value", x)) for x in codes]  # type: ignore[call-overload]
        self.suback.set()

    def subscribe(self, topic: str) -> list[int]:
        self.suback.clear()
        self.c.subscribe(topic, qos=1)
        assert self.suback.wait(WAIT_S), f"no SUBACK for {topic}"
        return self.granted

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def _probe(bus: NatsCluster, user: str, client_id: str, node: int = 0) -> int:
    creds = bus.credentials(user)
    host, port = bus.addresses[node]
    # Past the server's auth timeout, so a callout that never answers shows as a refusal.
    return mqtt_connect_probe(host, port, username=creds.username, password=creds.password,
                              ca_file=bus.ca_file, client_id=client_id, timeout_s=WAIT_S)


def test_plain_config_current_behaviour_another_account_takes_the_session(
        plain: NatsCluster) -> None:
    """Documented limitation of a plain NATS config (no callout): asserted as it is."""
    victim = Client(plain, 0, "nodeb", "agent-nodeb")
    assert victim.rc == 0
    assert victim.subscribe(placements_topic("nodeb")) == [1]
    thief = Client(plain, 1, "nodea", "agent-nodeb")  # another node, another account
    try:
        assert thief.rc == 0, "NATS refused the takeover by itself: the limitation is gone"
        assert thief.session_present, "the thief did not get the victim's session"
        assert victim.gone.wait(WAIT_S), "the victim was not disconnected by the takeover"
    finally:
        thief.close()
        victim.close()


def test_callout_holds_every_account_to_its_own_client_id(guarded: NatsCluster) -> None:
    victim = Client(guarded, 0, "nodeb", "agent-nodeb")
    try:
        assert victim.rc == 0, "node B's own client ID refused"
        assert victim.subscribe(placements_topic("nodeb")) == [1]
        # Node A's credentials as node B's agent, or node B's name, on any node: refused.
        assert _probe(guarded, "nodea", "agent-nodeb", node=1) == 5
        assert _probe(guarded, "nodea", "nodeb", node=2) == 5
        assert _probe(guarded, "ops", "agent-nodeb") == 5, "an operator took a node's ID"
        assert not victim.gone.is_set(), "a refused takeover still disconnected node B"
        # Their own IDs are theirs; a console's empty ID is named by the server.
        assert _probe(guarded, "nodea", "agent-nodea", node=1) == 0
        assert _probe(guarded, "nodea", "nodea", node=2) == 0
        assert _probe(guarded, "ops", "") == 0, "an operator's server-assigned ID refused"
        assert _probe(guarded, "nodea", "") == 5, "an agent got a server-assigned ID"
        # The callout issues the cfnet ACL: A may not read B's placements.
        a = Client(guarded, 1, "nodea", "agent-nodea")
        try:
            assert a.subscribe(placements_topic("nodea")) == [1]
            assert a.subscribe(placements_topic("nodeb")) == [0x80]
        finally:
            a.close()
        # A wrong password is refused by the callout too.
        host, port = guarded.addresses[0]
        assert mqtt_connect_probe(host, port, username="nodeb", password="x" * 24,
                                  ca_file=guarded.ca_file, client_id="agent-nodeb") == 5
    finally:
        victim.close()
    log = Path(guarded.callout_log).read_text()
    assert "refused nodea: client id 'agent-nodeb' is not account 'nodea''s" in log, log[-2000:]
    assert "refused nodeb: bad credentials" in log, log[-2000:]


def test_callout_down_fails_closed_and_connected_clients_stay(guarded: NatsCluster) -> None:
    b = Client(guarded, 0, "nodeb", "agent-nodeb")
    # The agent's own client (edge_agent.wire.mqtt), as node A's agent connects: it keeps
    # retrying a refused CONNECT, so it comes back by itself once the callout does.
    conf = settings(guarded, guarded.credentials("nodea"),  # type: ignore[arg-type]
                    client_id="agent-nodea", reconnect_max_s=2.0)
    agent = MqttClient(conf)
    try:
        assert b.rc == 0
        guarded.stop_callout()
        try:
            agent.start()
            # The probe's refusal takes the server's auth timeout; the agent, started
            # first, has had its own attempts meanwhile (the server drops them unanswered).
            assert _probe(guarded, "nodea", "agent-nodea") == 5, "admitted with no callout"
            assert not agent.connected, "the agent was admitted with no callout"
            assert not b.gone.is_set(), "a connected client dropped with the callout"
        finally:
            guarded.start_callout()
        assert agent.wait_connected(WAIT_S), \
            f"the agent did not reconnect after the callout came back ({agent.last_refusal})"
        assert _probe(guarded, "nodea", "agent-nodea") == 0, "not admitted after the restart"
    finally:
        agent.stop()
        b.close()


def test_an_edge_sites_leaf_still_links_up_with_the_callout(guarded: NatsCluster,
                                                             tmp_path: Path) -> None:
    """The hub's leaf user is in ``auth_users``: the server admits it itself."""
    with EdgeLeaf(tmp_path / "leaf", guarded, site="edge") as leaf:  # waits for the uplink
        assert leaf.uplink_up()
