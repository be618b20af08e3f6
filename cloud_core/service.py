"""The running core: one MQTT connection feeding ingest, and the console service answering.

This is where I/O meets the pure parts: messages from the broker are routed by
topic to ingest (telemetry, status) or to the console (requests); replies go
back on the request's MQTT 5 response topic with its correlation data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cloud_core.console.protocol import Response, encode_response, parse_request
from cloud_core.console.service import ConsoleService
from cloud_core.ingest import Ingest
from cloud_core.state import ClusterState
from edge_agent.mqtt import Message, MqttClient, MqttSettings
from edge_agent.wire import (
    REQUEST_WILDCARD,
    STATUS_WILDCARD,
    TELEMETRY_WILDCARD,
    WireError,
    response_topic,
    split_topic,
)

log = logging.getLogger(__name__)


class CoreService:
    def __init__(
        self,
        settings: MqttSettings,
        *,
        clock: Callable[[], float] = time.time,
        share_group: str | None = None,
    ) -> None:
        self.state = ClusterState()
        self.ingest = Ingest(self.state, clock)
        self.console = ConsoleService(self.state, self.ingest, clock)
        self.mqtt = MqttClient(settings, on_message=self._on_message)
        prefix = f"$share/{share_group}/" if share_group else ""
        for t in (TELEMETRY_WILDCARD, STATUS_WILDCARD):
            self.mqtt.subscribe(prefix + t, qos=1)
        self.mqtt.subscribe(REQUEST_WILDCARD, qos=1)

    def start(self) -> None:
        self.mqtt.start()

    def stop(self) -> None:
        self.mqtt.stop()

    def _on_message(self, m: Message) -> None:
        if m.topic.startswith("cfnet/v1/console/"):
            self._on_request(m)
        else:
            self.ingest.handle(m.topic, m.payload)

    def _on_request(self, m: Message) -> None:
        try:
            _area, operator, leaf = split_topic(m.topic)
            if leaf != "request":
                return
            req = parse_request(m.payload)
        except WireError as exc:
            log.warning("bad console request on %.80s: %s", m.topic, exc)
            return
        resp = self.console.handle(operator, req)
        self.reply(operator, m, resp)

    def reply(self, operator: str, m: Message, resp: Response) -> None:
        # Answer only on the operator's own response topic: a request naming
        # another operator's topic must not make us deliver there.
        own = response_topic(operator)
        topic = m.response_topic if m.response_topic == own else own
        self.mqtt.publish(topic, encode_response(resp), qos=1, correlation_data=m.correlation_data)
