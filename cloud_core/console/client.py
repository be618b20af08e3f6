"""MQTT 5 request/response client used by `cfnetctl` (and tests) to talk to the core."""

from __future__ import annotations

import threading
import uuid

from cloud_core.console.protocol import Request, Response, encode_request, parse_response
from cloud_core.errors import CoreError
from edge_agent.wire import WireError, request_topic, response_topic
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import MqttClient, MqttSettings


class ConsoleUnavailable(CoreError):
    """The broker or the core did not answer in time; the message says what to check."""


class ConsoleClient:
    def __init__(self, settings: MqttSettings, operator: str, timeout_s: float = 5.0) -> None:
        self.operator = operator
        self.timeout_s = timeout_s
        self.settings = settings
        self._pending: dict[bytes, tuple[threading.Event, list[Response]]] = {}
        self._lock = threading.Lock()
        self._mqtt = MqttClient(settings, on_message=self._on_message)
        self._mqtt.subscribe(response_topic(operator), qos=1)

    def __enter__(self) -> ConsoleClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self, timeout_s: float | None = None) -> None:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        self._mqtt.start()
        if not self._mqtt.wait_connected(timeout_s):
            why = self._mqtt.last_refusal
            self._mqtt.stop(graceful=False)
            where = f"{self.settings.host}:{self.settings.port}"
            if why:
                raise ConsoleUnavailable(
                    f"broker {where} refused operator {self.operator!r}: {why}; "
                    "check the username, password and CA file"
                )
            raise ConsoleUnavailable(
                f"no answer from broker {where} within {timeout_s:.0f}s; check that it runs, "
                "the host and port, and that TLS settings match"
            )

    def close(self) -> None:
        self._mqtt.stop()

    def call(
        self, cmd: str, args: dict[str, object] | None = None, timeout_s: float = 5.0
    ) -> Response:
        return self.call_raw(encode_request(Request(cmd, dict(args or {}))), timeout_s,
                             what=cmd)

    def call_raw(self, payload: bytes, timeout_s: float = 5.0, *, retain: bool = False,
                 what: str = "request") -> Response:
        """Send an already encoded request (tests send malformed ones this way)."""
        corr = uuid.uuid4().bytes
        ev = threading.Event()
        box: list[Response] = []
        with self._lock:
            self._pending[corr] = (ev, box)
        try:
            self._mqtt.publish(
                request_topic(self.operator),
                payload,
                qos=1,
                retain=retain,
                response_topic=response_topic(self.operator),
                correlation_data=corr,
                message_expiry_s=max(1, int(timeout_s)),
            )
            if not ev.wait(timeout_s):
                raise ConsoleUnavailable(
                    f"the core did not answer {what!r} within {timeout_s:.0f}s; check that "
                    "cfnet-core is running and connected to this broker"
                )
            return box[0]
        finally:
            with self._lock:
                self._pending.pop(corr, None)

    def _on_message(self, m: Message) -> None:
        if m.correlation_data is None:
            return
        with self._lock:
            slot = self._pending.get(bytes(m.correlation_data))
        if slot is None:
            return
        try:
            resp = parse_response(m.payload)
        except WireError as exc:
            resp = Response(ok=False, error=f"unreadable reply from core: {exc}")
        slot[1].append(resp)
        slot[0].set()
