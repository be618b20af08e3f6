"""The wire contract between agents, the core and the console: the one package both sides import.

- :mod:`~edge_agent.wire.topics`: topic names and the ids that fill them;
- :mod:`~edge_agent.wire.schema`: message schemas (frozen dataclasses) and their encoders;
- :mod:`~edge_agent.wire.decode`: the one parser and validator of wire messages;
- :mod:`~edge_agent.wire.names`: the one naming rule and Kubernetes' label syntax;
- :mod:`~edge_agent.wire.errors`: the package's errors (:class:`WireError`, ``MqttError``);
- :mod:`~edge_agent.wire.bus`: the :class:`~edge_agent.wire.bus.Bus` protocol every bus
  adapter implements, with its declared capabilities;
- :mod:`~edge_agent.wire.mqtt`: the MQTT adapter (paho-mqtt; imported only by who uses it);
- :mod:`~edge_agent.wire.logsetup`: logging set-up and ``--version`` of every command.

It stays light so the agent stays light: the standard library, and paho-mqtt in
:mod:`~edge_agent.wire.mqtt` only. It is the only part of ``edge_agent`` that
``cloud_core`` imports. The contract itself (topics, schemas, validation) is re-exported
here, so ``from edge_agent.wire import parse_report`` reads as the contract it is.
"""

from __future__ import annotations

from edge_agent.wire.decode import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    load_json,
    parse_ack,
    parse_report,
    parse_status,
)
from edge_agent.wire.errors import WireError
from edge_agent.wire.schema import (
    MAX_ACK_BOOTS,
    MAX_ACK_RANGES,
    MAX_GPUS,
    MAX_LINKS,
    MAX_PAYLOAD_BYTES,
    PROBES,
    SCHEMA_VERSION,
    AckBatch,
    Gpu,
    LinkSample,
    NodeStatus,
    Probe,
    Resources,
    RttStats,
    TelemetryReport,
    encode_ack,
    encode_report,
    encode_status,
    seq_ranges,
)
from edge_agent.wire.topics import (
    ACK_WILDCARD,
    DIGEST_WILDCARD,
    EVENTS_TOPIC,
    ID_RE,
    REQUEST_WILDCARD,
    STATUS_WILDCARD,
    TELEMETRY_WILDCARD,
    TOPIC_ROOT,
    ack_topic,
    digest_topic,
    placements_topic,
    request_topic,
    response_topic,
    split_topic,
    status_topic,
    telemetry_topic,
    valid_address,
    valid_id,
)

__all__ = [
    "ACK_WILDCARD", "DIGEST_WILDCARD", "EVENTS_TOPIC", "ID_RE", "MAX_ACK_BOOTS",
    "MAX_ACK_RANGES", "MAX_DEPTH", "MAX_GPUS", "MAX_INT_DIGITS", "MAX_LINKS",
    "MAX_PAYLOAD_BYTES", "PROBES", "REQUEST_WILDCARD", "SCHEMA_VERSION", "STATUS_WILDCARD",
    "TELEMETRY_WILDCARD", "TOPIC_ROOT", "AckBatch", "Gpu", "LinkSample", "NodeStatus",
    "Probe", "Resources", "RttStats", "TelemetryReport", "WireError", "ack_topic",
    "digest_topic", "encode_ack", "encode_report", "encode_status", "load_json",
    "parse_ack", "parse_report", "parse_status", "placements_topic", "request_topic",
    "response_topic", "seq_ranges", "split_topic", "status_topic", "telemetry_topic",
    "valid_address", "valid_id",
]
