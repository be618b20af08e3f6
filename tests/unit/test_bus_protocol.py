"""Every bus adapter is a ``Bus`` and declares what it can do; callers act on those
capabilities, not on which adapter they hold (the same adapters against real Mosquitto and
NATS: tests/integration/test_bus.py, test_mqtt_process.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cloud_core.bus_nats import NatsIngestSettings
from cloud_core.mqtt_process import MqttProcess
from edge_agent.agent import Agent
from edge_agent.buffer import ReportBuffer
from edge_agent.wire.bus import MQTT5, MQTT311_ON_NATS, Bus, BusCapabilities
from edge_agent.wire.mqtt import MqttClient, MqttSettings

V5 = MqttSettings(tls=False, client_id="c5")
V311 = MqttSettings(tls=False, client_id="c3", protocol="mqtt311")
NATS = NatsIngestSettings(urls=("nats://127.0.0.1:1",), username="core", password=None)


@pytest.mark.parametrize(("bus", "caps"), [
    (MqttClient(V5), MQTT5),
    (MqttClient(V311), MQTT311_ON_NATS),
    (MqttProcess(V5), MQTT5),
    (MqttProcess(V311), MQTT311_ON_NATS),
    (MqttProcess(V311, nats=NATS), BusCapabilities(
        mqtt5_properties=False, shared_subscriptions=True, cheap_qos1_subscriptions=False,
        edge_sites=True)),
], ids=["client-mqtt5", "client-nats", "process-mqtt5", "process-nats", "process-nats-ingest"])
def test_each_adapter_is_a_bus_and_declares_its_capabilities(
        bus: Any, caps: BusCapabilities) -> None:
    assert isinstance(bus, Bus)
    assert bus.capabilities == caps
    assert bus.edge_site_events() == {}  # nothing counted before it runs
    assert not bus.connected and bus.last_refusal == ""


class _RecordingBus:
    """A bus that records subscriptions (the unit test's I/O edge)."""

    def __init__(self, caps: BusCapabilities) -> None:
        self.capabilities = caps
        self.subs: list[tuple[str, int]] = []
        self.connected = False
        self.last_refusal = ""

    def subscribe(self, topic: str, qos: int = 1, *, no_local: bool = False,
                  retain_as_published: bool = False) -> None:
        self.subs.append((topic, qos))


class _NoProbe:
    name = "sockdiag"

    def collect(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("caps", "qos"), [(MQTT5, 1), (MQTT311_ON_NATS, 0)])
def test_the_agent_subscribes_to_its_acks_with_the_qos_the_bus_affords(
        tmp_path: Path, caps: BusCapabilities, qos: int) -> None:
    bus = _RecordingBus(caps)
    buf = ReportBuffer(tmp_path / "b.db")
    try:
        host: Any = None  # the agent samples its host only once it runs
        Agent(node="edge-q", interval_s=1.0, probe=_NoProbe(), host=host, mqtt=bus, buffer=buf)
    finally:
        buf.close()
    assert bus.subs == [("cfnet/v1/nodes/edge-q/ack", qos)]
