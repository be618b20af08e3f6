"""Pods as the engine's workloads, parsed once per pod uid (the core's parse cache).

The pod handler parses a bound pod when it counts it, the source each pod of a batch, the
console a pod it explains; the queueing hints read a pending pod's requests from here. An
entry goes when its pod is deleted (``drop``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from cloud_core.errors import SpecError
from cloud_core.k8s.client import JSON
from cloud_core.placement.model import Workload


def parse_workload(pod: Mapping[str, Any]) -> Workload:
    """A pod as the engine's ``Workload`` (raises ``SpecError``)."""
    from cloud_core.placement import parse_pod

    return parse_pod(pod)


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid"))


class Workloads:
    """Pod uid -> its parsed workload (None: not readable). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_uid: dict[str, Workload | None] = {}

    def parse(self, pod: JSON) -> Workload | None:
        """``pod`` as the engine's Workload (cached per uid); a pod whose spec cannot be read
        is still counted for what it takes from its node (``usage_workload``)."""
        uid = pod_uid(pod)
        with self._lock:
            if uid in self._by_uid:
                return self._by_uid[uid]
        try:
            w: Workload | None = parse_workload(pod)
        except SpecError:
            from cloud_core.placement.spec import usage_workload

            w = usage_workload(pod)  # still count what it takes from its node
        with self._lock:
            self._by_uid[uid] = w
        return w

    def put(self, uid: str, w: Workload) -> None:
        """``w`` is pod ``uid``'s workload (parsed by the step's own parser)."""
        with self._lock:
            self._by_uid[uid] = w

    def get(self, uid: str) -> Workload | None:
        with self._lock:
            return self._by_uid.get(uid)

    def drop(self, uid: str) -> None:
        """Pod ``uid`` was deleted."""
        with self._lock:
            self._by_uid.pop(uid, None)
