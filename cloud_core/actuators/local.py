"""The `local` actuator: each node's full workload set, retained on its placements topic.

Publishing the *whole* set for a node (not a delta) makes applying idempotent:
doing it twice after a crash leaves the node with exactly the same set, and an
agent that reconnects gets the current set from the retained message.

A set carries what the agent needs to know what runs on it (uid, name, namespace per
workload), never the submitted specs: one big spec must not be copied into every
replica's entry. The encoded set has a size budget below the broker's
``max_packet_size``; a set over it is not published (the broker would disconnect the
core, which would reconnect, republish and be cut off again, in a loop that survives a
restart) but refused with a critical event naming the node, the count and the size.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from cloud_core.errors import CoreError
from cloud_core.store import WorkloadRow
from edge_agent.wire import MAX_PAYLOAD_BYTES, SCHEMA_VERSION, placements_topic
from edge_agent.wire.bus import Delivery

# The broker's max_packet_size is MAX_PAYLOAD_BYTES + 16 KiB (topic, properties): a set
# within the wire's payload cap always passes.
MAX_PLACEMENT_BYTES = MAX_PAYLOAD_BYTES


class ActuationError(CoreError):
    """An actuator could not apply a node's placement set (it will be retried)."""


class PlacementSetTooLarge(ActuationError):
    """A node's set would not fit one message; it is refused, not published."""


def encode_placements(node: str, rows: list[WorkloadRow], ts: float) -> bytes:
    body = {
        "v": SCHEMA_VERSION,
        "node": node,
        "ts": ts,
        "workloads": [
            {"uid": r.uid, "name": r.name, "namespace": r.namespace}
            for r in sorted(rows, key=lambda r: r.uid)
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


class LocalActuator:
    name = "local"

    def __init__(
        self,
        publish: Callable[[str, bytes], Delivery],
        ack_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        on_refused: Callable[[str, str], object] | None = None,
        max_bytes: int = MAX_PLACEMENT_BYTES,
    ) -> None:
        self._publish = publish
        self._ack_timeout_s = ack_timeout_s
        self._clock = clock
        self._on_refused = on_refused
        self._max_bytes = max_bytes
        self._refused: dict[str, int] = {}  # node -> workload count last reported

    def apply(self, node: str, rows: list[WorkloadRow]) -> None:
        payload = encode_placements(node, rows, self._clock())
        if len(payload) > self._max_bytes:
            msg = (f"placement set for {node} not published: {len(rows)} workloads need "
                   f"{len(payload)} bytes, more than the {self._max_bytes} one message may "
                   "carry; move or delete workloads on this node")
            # one event per node and count, not one per retry
            if self._on_refused is not None and self._refused.get(node) != len(rows):
                self._on_refused(node, msg)
            self._refused[node] = len(rows)
            raise PlacementSetTooLarge(msg)
        self._refused.pop(node, None)
        handle = self._publish(placements_topic(node), payload)
        if not handle.wait(self._ack_timeout_s):
            raise ActuationError(f"broker did not acknowledge placements for {node}")
