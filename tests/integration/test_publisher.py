"""The simulator's lean publisher (tools.publisher) against the real TLS broker.

Every message it sends must arrive once and in order at a real subscriber
(through the project's paho adapter), retained flags must hold, refusals
(bad password, a topic the ACL denies) must be reported as such, and its
packet framing must survive acknowledgements split across reads.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import pytest

from edge_agent.wire import STATUS_WILDCARD, TELEMETRY_WILDCARD, status_topic, telemetry_topic
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import MqttClient, MqttSettings
from tests.integration.helpers import settings, wait_for
from tools.broker import Broker
from tools.publisher import Publisher, PublisherError, _read_varint, parse_properties, varint


class Collector:
    def __init__(self) -> None:
        self.got: list[Message] = []
        self._lock = threading.Lock()

    def __call__(self, m: Message) -> None:
        with self._lock:
            self.got.append(m)


@pytest.fixture
def listener(broker: Broker) -> Iterator[tuple[MqttClient, Collector]]:
    col = Collector()
    c = MqttClient(settings(broker, broker.add_account("core-publisher-test", "core"),
                            client_id="core-publisher-test"), on_message=col)
    c.subscribe(TELEMETRY_WILDCARD, qos=1)
    c.subscribe(STATUS_WILDCARD, qos=1)
    c.start()
    assert c.wait_connected(10)
    wait_for(lambda: c.connected, what="subscribed")
    yield c, col
    c.stop()


def sim_publisher(broker: Broker, name: str) -> Publisher:
    return Publisher(settings(broker, broker.add_account(name, "sim"), client_id=name,
                              session_expiry_s=0, clean_start=True, keepalive_s=10))


def test_every_message_arrives_once_and_in_order(
        broker: Broker, listener: tuple[MqttClient, Collector]) -> None:
    _, col = listener
    p = sim_publisher(broker, "sim-pub1")
    p.connect()
    assert p.receive_maximum >= 1  # from the broker's CONNACK
    n = 3000  # more than the window and than one 64 KiB write
    for i in range(n):
        p.publish(telemetry_topic("pub-a"), b"%d" % i)
    p.publish(status_topic("pub-a"), b'{"retained":1}', retain=True)
    assert p.drain(30)
    assert (p.sent, p.acked, p.refused) == (n + 1, n + 1, 0)
    p.close()
    wait_for(lambda: len(col.got) >= n + 1, what="all messages at the subscriber")
    tele = [m for m in col.got if m.topic == telemetry_topic("pub-a")]
    assert [int(m.payload) for m in tele] == list(range(n))
    # retained: a new subscriber gets the status from the broker's store
    late = Collector()
    c = MqttClient(settings(broker, broker.add_account("core-publisher-late", "core"),
                            client_id="core-publisher-late"), on_message=late)
    c.subscribe(status_topic("pub-a"), qos=1)
    c.start()
    try:
        wait_for(lambda: late.got, what="the retained status")
        assert late.got[0].payload == b'{"retained":1}' and late.got[0].retain
    finally:
        c.stop()


def test_a_topic_outside_the_acl_is_counted_as_refused(
        broker: Broker, listener: tuple[MqttClient, Collector]) -> None:
    _, col = listener
    p = sim_publisher(broker, "sim-pub2")
    p.connect()
    p.publish("cfnet/v1/nodes/pub-b/placements", b"{}")  # sim accounts may not write these
    p.publish(telemetry_topic("pub-b"), b"ok")
    assert p.drain(10)
    assert (p.acked, p.refused) == (1, 1)
    p.close()
    wait_for(lambda: any(m.topic == telemetry_topic("pub-b") for m in col.got),
             what="the allowed message")
    assert not any("placements" in m.topic for m in col.got)


def test_a_wrong_password_is_a_clear_error(broker: Broker) -> None:
    creds = broker.add_account("sim-pub3", "sim")
    s = settings(broker, creds, client_id="sim-pub3", session_expiry_s=0, clean_start=True)
    bad = Publisher(dataclasses.replace(s, password="not-the-password"))
    with pytest.raises(PublisherError, match=r"bad user name or password|not authorized"):
        bad.connect()


def test_framing_handles_acks_split_across_reads() -> None:
    p = Publisher(MqttSettings())
    p.sent = 3
    puback_ok = b"\x40\x02\x00\x01"
    puback_refused = b"\x40\x04\x00\x02\x87\x00"
    stream = puback_ok + puback_refused + b"\xd0\x00" + puback_ok
    for i in range(0, len(stream), 3):  # three bytes at a time
        p._in += stream[i:i + 3]
        p._consume()
    assert (p.acked, p.refused, p.in_flight) == (2, 1, 0)
    p._in += b"\xe0\x01\x8e"  # DISCONNECT: session taken over
    with pytest.raises(PublisherError, match="0x8e"):
        p._consume()


@pytest.mark.parametrize("n", [0, 127, 128, 16383, 16384, 2_097_152, 268_435_455])
def test_remaining_length_encoding(n: int) -> None:
    enc = varint(n)
    assert len(enc) == (1 if n < 128 else 2 if n < 16384 else 3 if n < 2_097_152 else 4)
    assert _read_varint(enc, 0) == (n, len(enc))
    assert _read_varint(enc[:-1], 0) is None or len(enc) == 1


def test_connack_properties_are_read_and_skipped() -> None:
    # Receive Maximum 100, a reason string, a user property, Maximum Packet Size
    props = (b"\x21\x00\x64" + b"\x1f\x00\x02ok" + b"\x26\x00\x01k\x00\x01v"
             + b"\x27\x00\x01\x00\x00")
    assert parse_properties(props) == {0x21: 100, 0x27: 65536}
    with pytest.raises(PublisherError):
        parse_properties(b"\x7f\x00")
