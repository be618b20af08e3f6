"""Topic names of the wire contract (MQTT topics, schema v1) and the ids that fill them.

Node ids and operator names double as MQTT usernames and topic levels, so the broker's
ACL (``pattern write cfnet/v1/nodes/%u/#``) enforces that nobody speaks for another.
"""

from __future__ import annotations

import re

from edge_agent.wire.errors import WireError

TOPIC_ROOT = "cfnet/v1"
EVENTS_TOPIC = f"{TOPIC_ROOT}/events"
# Node and operator ids double as MQTT usernames and topic levels, so they must
# not contain '/', '+', '#' or whitespace. DNS-label-like, as Kubernetes node names.
ID_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
# an IPv4/IPv6 address as an agent writes it (hex, digits, '.', ':', an optional %zone)
ADDRESS_RE = re.compile(r"[0-9A-Za-z.:%_-]{1,64}")


def valid_id(value: str) -> bool:
    """A node id or operator name: ``edge_agent.wire.names``' rule at 63 characters."""
    return isinstance(value, str) and bool(ID_RE.fullmatch(value))


def valid_address(value: str) -> bool:
    return bool(ADDRESS_RE.fullmatch(value))


def telemetry_topic(node: str) -> str:
    return f"{TOPIC_ROOT}/nodes/{node}/telemetry"


def status_topic(node: str) -> str:
    return f"{TOPIC_ROOT}/nodes/{node}/status"


def placements_topic(node: str) -> str:
    return f"{TOPIC_ROOT}/nodes/{node}/placements"


def ack_topic(node: str) -> str:
    """Core -> agent: which of the node's reports the core has ingested (see AckBatch)."""
    return f"{TOPIC_ROOT}/nodes/{node}/ack"


def request_topic(operator: str) -> str:
    return f"{TOPIC_ROOT}/console/{operator}/request"


def response_topic(operator: str) -> str:
    return f"{TOPIC_ROOT}/console/{operator}/response"


TELEMETRY_WILDCARD = f"{TOPIC_ROOT}/nodes/+/telemetry"
# Core replicas that split ingest through $share tell each other what they took in.
DIGEST_WILDCARD = f"{TOPIC_ROOT}/core/+/digest"


def digest_topic(replica: str) -> str:
    return f"{TOPIC_ROOT}/core/{replica}/digest"


STATUS_WILDCARD = f"{TOPIC_ROOT}/nodes/+/status"
ACK_WILDCARD = f"{TOPIC_ROOT}/nodes/+/ack"
REQUEST_WILDCARD = f"{TOPIC_ROOT}/console/+/request"


def split_topic(topic: str) -> tuple[str, str, str]:
    """Return (area, id, leaf) for ``cfnet/v1/<area>/<id>/<leaf>``; WireError otherwise."""
    parts = topic.split("/")
    if len(parts) != 5 or f"{parts[0]}/{parts[1]}" != TOPIC_ROOT:
        raise WireError("topic", f"not a cfnet v1 topic: {topic[:120]!r}")
    area, ident, leaf = parts[2], parts[3], parts[4]
    if not valid_id(ident):
        raise WireError("topic", f"bad id in topic: {ident[:64]!r}")
    return area, ident, leaf
