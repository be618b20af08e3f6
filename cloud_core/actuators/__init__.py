"""Actuators turn placement decisions into effects: `local` (MQTT topics) or Kubernetes."""

from __future__ import annotations

from typing import Protocol

from cloud_core.store import WorkloadRow


class Actuator(Protocol):
    """Applies the full set of workloads assigned to one node; must be idempotent per UID."""

    name: str

    def apply(self, node: str, rows: list[WorkloadRow]) -> None: ...
