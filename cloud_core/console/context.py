"""What the console's commands read and act on: the core's own parts, and the mode's cluster.

Measured links, ingest counters, events and the audit log are the core's own, the same in
both modes. Where workloads run, and what an operator may change there, depends on the mode:
the local core's store, node registry and scheduler (:class:`cloud_core.console.local.
LocalCluster`), or the Kubernetes cluster (:class:`cloud_core.k8s.console.KubernetesCluster`).
The commands that answer from it call the :class:`Cluster` the context holds, so each mode
provides its own implementation of them through that one object.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cloud_core.events import EventLog
from cloud_core.ingest import Ingest
from cloud_core.state import ClusterState, StateSnapshot


class Cluster(Protocol):
    """The commands whose answer depends on where workloads run. ``args`` are within the
    command's declared bounds (``cloud_core.console.commands``)."""

    def nodes(self) -> list[dict[str, Any]]: ...

    def workloads(self, args: dict[str, Any]) -> Any: ...

    def placements(self) -> dict[str, list[str]]: ...

    def explain(self, args: dict[str, Any]) -> Any: ...

    def what_if(self, specs: list[dict[str, Any]]) -> Any: ...

    def submit(self, op: str, specs: list[dict[str, Any]]) -> Any: ...

    def delete(self, op: str, args: dict[str, Any]) -> Any: ...

    def cordon(self, op: str, args: dict[str, Any]) -> Any: ...

    def uncordon(self, op: str, args: dict[str, Any]) -> Any: ...

    def drain(self, op: str, args: dict[str, Any]) -> Any: ...


def _no_audit(limit: int) -> list[dict[str, Any]]:
    return []


@dataclass(slots=True)
class ConsoleContext:
    """The parts the commands use. ``cluster`` is set once, before requests can arrive:
    :class:`cloud_core.service.CoreService` starts with the local one, and ``cfnet-core
    --kubernetes`` gives the Kubernetes one (``k8s.wiring.start_kubernetes``)."""

    cluster: Cluster
    state: ClusterState
    ingest: Ingest
    events: EventLog
    audit_log: Callable[[int], list[dict[str, Any]]] = _no_audit
    clock: Callable[[], float] = field(default=time.time)

    def snapshot(self) -> StateSnapshot:
        return self.state.snapshot(self.clock())
