"""The project's one MQTT adapter: a thin, typed wrapper over paho-mqtt 2.x, a
:class:`~edge_agent.wire.bus.Bus`.

Agents, the core and the console all talk MQTT through this module, so paho's
callback API, its property objects and its reason codes stay in one place.
Callbacks run on paho's network thread; handlers must be quick and must not
raise (a raising handler is logged and counted, never allowed to kill the loop).

Two dialects, chosen by ``MqttSettings.protocol`` (the ``bus`` setting of the agent
and the core, see :func:`protocol_for_bus`):

- ``mqtt5`` (Mosquitto, the default bus): session expiry, response topic,
  correlation data, message expiry, retain-as-published as MQTT 5 properties.
- ``mqtt311`` (NATS's MQTT listener, the clustered bus, which speaks 3.1.1 only).
  What replaces each MQTT 5 feature (docs/nats.md):
  session expiry -> ``clean_session=False`` (NATS keeps the session in JetStream
  until a clean connect with that client id removes it); correlation data and
  message expiry -> a small envelope before the payload (:func:`wrap`), written and
  read here so callers still see typed ``Message`` fields; response topic -> none
  needed (the contract fixes the reply topic to the operator's own); retain-as-
  published -> 3.1.1 marks a message retained only when it comes from the retained
  store; the core asks the bus's retained store about each live console request
  (``cloud_core/bus_retained.py``). The client id has no ``.`` (NATS refuses it):
  ``.`` becomes ``~``, a character no cfnet name contains, so ids stay distinct.
"""

from __future__ import annotations

import json
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edge_agent.lightimport import paho_imports
from edge_agent.wire.bus import MQTT5, MQTT311_ON_NATS, BusCapabilities, Message
from edge_agent.wire.errors import MqttError

with paho_imports():  # without urllib.request, unused here: ~2 MiB of the agent's RSS
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode
    from paho.mqtt.subscribeoptions import SubscribeOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """Where and how to connect. ``keepalive_s`` bounds offline detection (1.5x it)."""

    host: str = "127.0.0.1"
    port: int = 8883
    username: str | None = None
    password: str | None = None
    tls: bool = True
    ca_file: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None
    client_id: str = ""
    keepalive_s: int = 3
    # MQTT 5 session expiry: the broker keeps subscriptions and queued QoS 1
    # messages this long while the client is away (persistent session).
    session_expiry_s: int = 3600
    clean_start: bool = False
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    # QoS 1 messages sent before waiting for acknowledgements. An agent sends
    # one report a second, so 20 is plenty; a load generator speaking for
    # thousands of nodes over one connection needs up to the broker's limit.
    max_inflight: int = 20
    # "mqtt5" (Mosquitto) or "mqtt311" (NATS); see the module docstring.
    protocol: Literal["mqtt5", "mqtt311"] = "mqtt5"
    # Other addresses of the same clustered bus, tried in turn after a disconnect
    # or a failed connect (a killed NATS node: the client moves to the next one).
    failover: tuple[tuple[str, int], ...] = ()


BusKind = Literal["mosquitto", "nats"]
BUSES: tuple[BusKind, ...] = ("mosquitto", "nats")


def protocol_for_bus(bus: str) -> Literal["mqtt5", "mqtt311"]:
    """The MQTT dialect a bus speaks: Mosquitto MQTT 5, NATS's listener 3.1.1."""
    if bus == "mosquitto":
        return "mqtt5"
    if bus == "nats":
        return "mqtt311"
    raise MqttError(f"unknown bus {bus!r} (one of {', '.join(BUSES)})")


def wire_client_id(client_id: str, protocol: str) -> str:
    """The client id sent: on 3.1.1 (NATS) without ``.``, which NATS refuses."""
    return client_id.replace(".", "~") if protocol == "mqtt311" else client_id


# The 3.1.1 envelope: a record separator (no JSON payload starts with it), a
# version, a 2-byte header length, a JSON header {"c": correlation hex, "x":
# expiry UNIX time}, then the payload unchanged.
_ENVELOPE = b"\x1ecf1"
MAX_ENVELOPE_HEADER = 512


def wrap(payload: bytes, correlation_data: bytes | None, expires_at: float | None) -> bytes:
    """``payload`` with an envelope carrying what MQTT 5 would carry as properties."""
    head: dict[str, Any] = {}
    if correlation_data:
        head["c"] = correlation_data.hex()
    if expires_at:
        head["x"] = round(expires_at, 3)
    if not head:
        return payload
    h = json.dumps(head, separators=(",", ":")).encode()
    return _ENVELOPE + len(h).to_bytes(2, "big") + h + payload


def unwrap(payload: bytes) -> tuple[bytes, bytes | None, float | None]:
    """(payload, correlation data, expiry) from an enveloped payload; a payload
    without the envelope, or with a malformed one, comes back unchanged."""
    if not payload.startswith(_ENVELOPE):
        return payload, None, None
    n = len(_ENVELOPE)
    size = int.from_bytes(payload[n:n + 2], "big")
    if size > MAX_ENVELOPE_HEADER or len(payload) < n + 2 + size:
        return payload, None, None
    try:
        head = json.loads(payload[n + 2:n + 2 + size])
        corr = bytes.fromhex(head["c"]) if isinstance(head.get("c"), str) else None
        exp = head.get("x")
        exp = float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None
    except (ValueError, TypeError, AttributeError):
        return payload, None, None
    return payload[n + 2 + size:], corr, exp


@dataclass(frozen=True, slots=True)
class Will:
    """The last will the broker publishes for this client if it goes away uncleanly."""
    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


@dataclass(slots=True)
class _Stats:
    """The client's counters (connects, refusals, handler errors, expired messages)."""
    connects: int = 0
    disconnects: int = 0
    handler_errors: int = 0
    expired: int = 0  # 3.1.1: enveloped messages dropped past their expiry
    refused: dict[str, int] = field(default_factory=dict)


class PublishHandle:
    """Tracks one QoS>0 publish until the broker acknowledges (or refuses) it."""

    def __init__(self, info: paho.MQTTMessageInfo) -> None:
        self._info = info

    @property
    def mid(self) -> int:
        return int(self._info.mid)

    def wait(self, timeout_s: float) -> bool:
        """True once the broker acked the message; False on timeout or refusal."""
        if self._info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
            # Queued while disconnected: paho sends it after the reconnect, but its
            # wait_for_publish raises at once for such a message; poll instead.
            deadline = time.monotonic() + timeout_s
            while not self.done():
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)
            return True
        try:
            self._info.wait_for_publish(timeout_s)
        except (RuntimeError, ValueError):
            return False
        return self.done()

    def done(self) -> bool:
        """True once the broker acked the message (never raises)."""
        info = self._info
        if info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
            return bool(info._published)  # set by paho when the PUBACK finally arrives
        try:
            return info.is_published()
        except (RuntimeError, ValueError):
            return False


class MqttClient:
    """One MQTT 5 connection with automatic, jittered reconnect.

    Subscriptions given to :meth:`subscribe` are re-sent on every (re)connect,
    so a broker that lost our session (restart without persistence) still
    delivers to us.
    """

    def __init__(
        self,
        settings: MqttSettings,
        *,
        on_message: Callable[[Message], None] | None = None,
        on_connect: Callable[[], None] | None = None,
        on_disconnect: Callable[[str], None] | None = None,
        will: Will | None = None,
    ) -> None:
        self.settings = settings
        self.stats = _Stats()
        self._on_message = on_message
        self._on_connect_cb = on_connect
        self._on_disconnect_cb = on_disconnect
        self._subs: dict[str, tuple[int, bool, bool]] = {}
        self._connected = threading.Event()
        self._stopping = threading.Event()
        self._last_refusal = ""
        self._lock = threading.Lock()
        self._v5 = settings.protocol == "mqtt5"
        # This address first, then the failover ones, round robin.
        self._addresses = [(settings.host, settings.port), *settings.failover]
        self._next_address = 0
        if self._v5:
            self._client = paho.Client(
                CallbackAPIVersion.VERSION2, client_id=settings.client_id,
                protocol=paho.MQTTv5, reconnect_on_failure=True)
        else:
            self._client = paho.Client(
                CallbackAPIVersion.VERSION2,
                client_id=wire_client_id(settings.client_id, settings.protocol),
                protocol=paho.MQTTv311, clean_session=settings.clean_start,
                reconnect_on_failure=True)
        c = self._client
        # paho sends (and on reconnect re-sends) in-flight QoS 1 messages in
        # order, and the broker keeps per-topic order, so a bounded window keeps
        # oldest-first delivery while not waiting a round trip per report.
        c.max_inflight_messages_set(settings.max_inflight)
        c.max_queued_messages_set(0)
        if settings.username is not None:
            c.username_pw_set(settings.username, settings.password)
        self._tls_ctx: ssl.SSLContext | None = None
        if settings.tls:
            ctx = ssl.create_default_context(
                cafile=str(settings.ca_file) if settings.ca_file else None
            )
            if settings.certfile and settings.keyfile:
                ctx.load_cert_chain(str(settings.certfile), str(settings.keyfile))
            c.tls_set_context(ctx)
            self._tls_ctx = ctx
        if will is not None:
            c.will_set(will.topic, will.payload, qos=will.qos, retain=will.retain)
        # paho doubles the delay between min and max; jitter is added in
        # _on_disconnect so thousands of agents do not reconnect in lockstep.
        c.reconnect_delay_set(
            min_delay=max(1, int(settings.reconnect_min_s)), max_delay=int(settings.reconnect_max_s)
        )
        c.on_connect = self._handle_connect
        c.on_connect_fail = self._handle_connect_fail
        c.on_disconnect = self._handle_disconnect
        c.on_message = self._handle_message

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Begin connecting in the background; returns at once. May follow a stop()."""
        self._stopping.clear()
        try:
            if self._v5:
                props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]  # paho: no hints
                props.SessionExpiryInterval = self.settings.session_expiry_s
                self._client.connect_async(
                    self.settings.host, self.settings.port, keepalive=self.settings.keepalive_s,
                    clean_start=self.settings.clean_start, properties=props)
            else:
                self._client.connect_async(self.settings.host, self.settings.port,
                                           keepalive=self.settings.keepalive_s)
        except (OSError, ValueError) as exc:
            raise MqttError(f"cannot connect to {self.settings.host}:{self.settings.port}") from exc
        self._client.loop_start()

    def reload_client_cert(self, certfile: Path, keyfile: Path) -> None:
        """Use a renewed client certificate from the next connection on (the one open now
        stays: the broker checked the old certificate when it was made)."""
        if self._tls_ctx is None:
            raise MqttError("no TLS: no client certificate to reload")
        self._tls_ctx.load_cert_chain(str(certfile), str(keyfile))

    @property
    def capabilities(self) -> BusCapabilities:
        """MQTT 5 (Mosquitto) or NATS's MQTT 3.1.1 listener: see the module docstring."""
        return MQTT5 if self._v5 else MQTT311_ON_NATS

    def edge_site_events(self) -> dict[str, dict[str, int]]:
        """None here: edge sites are the core's shared ingest (its MQTT process)."""
        return {}

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connected.wait(timeout_s)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def last_refusal(self) -> str:
        """The broker's last CONNACK refusal reason (e.g. 'Not authorized'), or ''."""
        return self._last_refusal

    def stop(self, *, graceful: bool = True) -> None:
        """Disconnect. ``graceful=False`` drops the socket so the broker sends our will."""
        self._stopping.set()
        if graceful and self._v5:
            props = Properties(PacketTypes.DISCONNECT)  # type: ignore[no-untyped-call]  # paho: no hints
            props.SessionExpiryInterval = self.settings.session_expiry_s
            self._client.disconnect(properties=props)
        elif graceful:
            self._client.disconnect()
        else:
            sock = self._client.socket()
            if sock is not None:
                sock.close()
        self._client.loop_stop()
        self._connected.clear()

    # ------------------------------------------------------------------ traffic

    def subscribe(self, topic: str, qos: int = 1, *, no_local: bool = False,
                  retain_as_published: bool = False) -> None:
        """``retain_as_published``: deliver the publisher's retain flag on live messages too
        (MQTT 5), so a consumer can refuse retained messages whenever they arrive."""
        if not self._v5 and topic.startswith("$share/"):
            # NATS grants it and delivers nothing: the core serves $share from a
            # JetStream consumer instead (cloud_core/bus_nats_ingest.py, in its MQTT process).
            raise MqttError(f"{topic!r}: MQTT 3.1.1 on NATS has no shared subscriptions")
        # Under the lock _handle_connect holds while it subscribes and sets
        # `connected`: a topic added during a connect is sent by one or the other.
        with self._lock:
            self._subs[topic] = (qos, no_local, retain_as_published)
            send = self.connected
        if send:
            self._send_subscribe(self._client, topic, qos, no_local, retain_as_published)

    def _send_subscribe(self, client: paho.Client, topic: str, qos: int, no_local: bool,
                        rap: bool) -> None:
        if self._v5:
            client.subscribe(topic, options=SubscribeOptions(qos=qos, noLocal=no_local,
                                                             retainAsPublished=rap))
        else:  # 3.1.1: no options; see the module docstring for what replaces them
            client.subscribe(topic, qos=qos)

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        message_expiry_s: int | None = None,
    ) -> PublishHandle:
        props: Properties | None = None
        if not self._v5:
            if correlation_data or message_expiry_s:
                payload = wrap(payload, correlation_data,
                               time.time() + message_expiry_s if message_expiry_s else None)
        elif response_topic or correlation_data or message_expiry_s:
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]  # paho: no hints
            if response_topic:
                props.ResponseTopic = response_topic
            if correlation_data:
                props.CorrelationData = correlation_data
            if message_expiry_s:
                props.MessageExpiryInterval = message_expiry_s
        info = self._client.publish(topic, payload, qos=qos, retain=retain, properties=props)
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            raise MqttError(f"publish to {topic} failed: {paho.error_string(info.rc)}")
        return PublishHandle(info)

    # ------------------------------------------------------------------ callbacks

    def _handle_connect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.ConnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason.is_failure:
            self._last_refusal = str(reason)
            self.stats.refused[str(reason)] = self.stats.refused.get(str(reason), 0) + 1
            log.warning("broker refused connection: %s", reason)
            return
        self.stats.connects += 1
        self._last_refusal = ""
        # Subscriptions go out before `connected` is set (a caller that waited for
        # the connection publishes after them), and under the lock subscribe() takes.
        with self._lock:
            for topic, (qos, no_local, rap) in self._subs.items():
                self._send_subscribe(client, topic, qos, no_local, rap)
            self._connected.set()
        if self._on_connect_cb is not None:
            self._safe(self._on_connect_cb)

    def _handle_disconnect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.DisconnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        was = self._connected.is_set()
        self._connected.clear()
        if was:
            self.stats.disconnects += 1
            log.info("disconnected from broker: %s", reason)
            if self._on_disconnect_cb is not None:
                self._safe(self._on_disconnect_cb, str(reason))
        if not self._stopping.is_set():
            self._rotate(client)
            # Jitter: spread reconnects of a fleet that lost the broker at once.
            time.sleep(random.uniform(0, self.settings.reconnect_min_s))

    def _handle_connect_fail(self, client: paho.Client, userdata: Any) -> None:
        if not self._stopping.is_set():
            self._rotate(client)

    def _rotate(self, client: paho.Client) -> None:
        """Point the next reconnect at the next address of a clustered bus."""
        if len(self._addresses) < 2:
            return
        self._next_address = (self._next_address + 1) % len(self._addresses)
        host, port = self._addresses[self._next_address]
        # paho's host/port setters refuse while its state is "connecting", which is
        # the state a refused reconnect leaves; the loop reads these two fields on
        # its next attempt, on this same thread.
        client._host, client._port = host, port
        log.info("next connection attempt to %s:%d", host, port)

    def _handle_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        if self._on_message is None:
            return
        payload = bytes(msg.payload)
        if self._v5:
            props = msg.properties
            resp = getattr(props, "ResponseTopic", None) if props else None
            corr = getattr(props, "CorrelationData", None) if props else None
            user = tuple(getattr(props, "UserProperty", ()) or ()) if props else ()
        else:
            payload, corr, expires = unwrap(payload)
            resp, user = None, ()
            if expires is not None and time.time() > expires:
                # MQTT 5's message expiry, done here: a console request queued for
                # a core that was away is not run after its sender gave up.
                self.stats.expired += 1
                return
        m = Message(
            topic=msg.topic,
            payload=payload,
            qos=msg.qos,
            retain=bool(msg.retain),
            response_topic=resp,
            correlation_data=corr,
            user_properties=user,
        )
        self._safe(self._on_message, m)

    def _safe(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self.stats.handler_errors += 1
            log.exception("MQTT handler failed")
