"""The `local` actuator: each node's full workload set, retained on its placements topic.

Publishing the *whole* set for a node (not a delta) makes applying idempotent:
doing it twice after a crash leaves the node with exactly the same set, and an
agent that reconnects gets the current set from the retained message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Protocol

from cloud_core.errors import CoreError
from cloud_core.store import WorkloadRow
from edge_agent.wire import SCHEMA_VERSION, placements_topic


class Acknowledgeable(Protocol):
    """A QoS 1 publish in flight (``edge_agent.mqtt.PublishHandle`` or the MQTT process's)."""

    def wait(self, timeout_s: float) -> bool: ...


class ActuationError(CoreError):
    """An actuator could not apply a node's placement set (it will be retried)."""


def encode_placements(node: str, rows: list[WorkloadRow], ts: float) -> bytes:
    body = {
        "v": SCHEMA_VERSION,
        "node": node,
        "ts": ts,
        "workloads": [
            {"uid": r.uid, "name": r.name, "namespace": r.namespace, "spec": r.spec}
            for r in sorted(rows, key=lambda r: r.uid)
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


class LocalActuator:
    name = "local"

    def __init__(
        self,
        publish: Callable[[str, bytes], Acknowledgeable],
        ack_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._publish = publish
        self._ack_timeout_s = ack_timeout_s
        self._clock = clock

    def apply(self, node: str, rows: list[WorkloadRow]) -> None:
        handle = self._publish(placements_topic(node), encode_placements(node, rows, self._clock()))
        if not handle.wait(self._ack_timeout_s):
            raise ActuationError(f"broker did not acknowledge placements for {node}")
