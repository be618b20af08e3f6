"""On NATS the replicas' digests travel on the core's native NATS connection, not its MQTT
session (cloud_core/mqtt_process.py, cloud_core/bus_nats_ingest.py): the child serves the
digest subscription there, and the parent tells that connection's state apart from the
MQTT one's, for the fold gate (cloud_core/ownership.py)."""

from __future__ import annotations

from typing import Any

from cloud_core.bus_nats import NatsIngestSettings
from cloud_core.bus_nats_ingest import SharedIngest
from cloud_core.mqtt_process import MqttProcess, is_digest
from edge_agent.wire import DIGEST_WILDCARD, digest_topic
from edge_agent.wire.mqtt import MqttSettings

NATS = NatsIngestSettings(urls=("nats://127.0.0.1:1",), username="core", password=None)
V311 = MqttSettings(tls=False, client_id="c3", protocol="mqtt311")


class Pipe:
    """The child's end of the pipe, as the parent's reader sees it: these, then EOF."""

    def __init__(self, *msgs: tuple[str, Any]) -> None:
        self.msgs = list(msgs)

    def recv(self) -> tuple[str, Any]:
        if not self.msgs:
            raise EOFError
        return self.msgs.pop(0)

    def close(self) -> None:
        pass


def test_digest_topics_are_told_apart() -> None:
    assert is_digest(digest_topic("core-1"))
    assert not is_digest("cfnet/v1/nodes/n1/telemetry")
    assert not is_digest("cfnet/v1/core/core-1/other")
    assert not is_digest("not/a/cfnet/topic")


def test_the_digests_link_is_counted_apart_from_mqtt() -> None:
    p = MqttProcess(V311, nats=NATS)
    pipe: Any = Pipe(("state", (True, "", False)), ("state", (True, "", True)),
                     ("state", (True, "", False)), ("state", (True, "", True)))
    not_its_child: Any = object()  # read to the end, then return
    p._read(pipe, not_its_child)
    assert p.connects == 1 and p.digest_connects == 2
    assert not p.digests_up  # the reader's end: nothing is up any more


def test_a_stopped_ingest_publishes_nothing() -> None:
    s = SharedIngest(NATS, lambda *_a: None)
    s.add_plain(DIGEST_WILDCARD)
    assert not s.linked and s.publish(digest_topic("core"), b"x") is False
