"""The bus interface: what agents, the core and the console need of a connection to the bus.

Two buses carry the wire contract: Mosquitto (MQTT 5) and a NATS cluster (its MQTT 3.1.1
listener, with JetStream behind the core's shared ingest). Each adapter implements
:class:`Bus` and declares what it can do in :class:`BusCapabilities`, so a caller asks
the connection it holds what it can do, never which adapter or which bus it is:

- :class:`edge_agent.wire.mqtt.MqttClient`: one MQTT connection in this process, either
  dialect (``MqttSettings.protocol``);
- ``cloud_core.mqtt_process.MqttProcess``: the core's connection in a child process,
  which on NATS also serves ``$share`` subscriptions from a JetStream consumer.

Standard library only: the agent imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Message:
    """A message received from the bus."""
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    response_topic: str | None = None
    correlation_data: bytes | None = None
    user_properties: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class BusCapabilities:
    """What one bus connection can do, as its adapter declares it."""

    #: MQTT 5 properties reach the receiver: response topic, user properties, the
    #: publisher's retain flag on live messages (retain-as-published) and no-local.
    #: Correlation data and message expiry travel on every bus (an envelope on 3.1.1).
    mqtt5_properties: bool
    #: ``$share/<group>/<filter>`` subscriptions deliver (each message to one member).
    shared_subscriptions: bool
    #: A QoS 1 subscription costs the bus little. On NATS each is a JetStream consumer
    #: replicated on three servers (about 2 MiB and 4 ms of CPU a second per client):
    #: there a client that can make up for lost messages subscribes with QoS 0.
    cheap_qos1_subscriptions: bool
    #: The connection reports its edge sites' counters (:meth:`Bus.edge_site_events`).
    edge_sites: bool = False


#: Mosquitto, MQTT 5.
MQTT5 = BusCapabilities(mqtt5_properties=True, shared_subscriptions=True,
                        cheap_qos1_subscriptions=True)
#: NATS's MQTT 3.1.1 listener, one connection (no ``$share``: the core's MQTT process adds it).
MQTT311_ON_NATS = BusCapabilities(mqtt5_properties=False, shared_subscriptions=False,
                                  cheap_qos1_subscriptions=False)


class Delivery(Protocol):
    """One publish with QoS > 0, until the bus acknowledges (or refuses) it."""

    def wait(self, timeout_s: float) -> bool:
        """True once the bus acked the message; False on timeout or refusal."""
        ...

    def done(self) -> bool:
        """True once the bus acked the message (never raises)."""
        ...


@runtime_checkable
class Bus(Protocol):
    """A connection to the bus with automatic reconnect.

    Subscriptions are kept and sent again on every (re)connect. ``start`` returns at
    once; ``connected`` and ``wait_connected`` say when the connection is up.
    """

    @property
    def capabilities(self) -> BusCapabilities: ...

    @property
    def connected(self) -> bool: ...

    @property
    def last_refusal(self) -> str:
        """The bus's last refusal of a connection (e.g. 'Not authorized'), or ''."""
        ...

    def start(self) -> None: ...

    def stop(self, *, graceful: bool = True) -> None:
        """Disconnect. ``graceful=False`` drops the connection so the bus sends the will."""
        ...

    def wait_connected(self, timeout_s: float) -> bool: ...

    def subscribe(self, topic: str, qos: int = 1, *, no_local: bool = False,
                  retain_as_published: bool = False) -> None: ...

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False,
                response_topic: str | None = None, correlation_data: bytes | None = None,
                message_expiry_s: int | None = None) -> Delivery: ...

    def edge_site_events(self) -> dict[str, dict[str, int]]:
        """Event -> edge site -> count, for a connection with ``capabilities.edge_sites``
        (empty for the others)."""
        ...
