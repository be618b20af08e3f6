"""The pending pods: the scheduling queue (``queue.py``) with the pods it names, thread-safe.

The pod handler adds a pending cfnet pod (``arrived``) and takes it out when it is bound,
deleted or no longer pending (``left``); the source takes the next batch (``pop``); the
binder reports a pod not placed (``failed``), assumed (``taken``) or whose binding failed
(``retry``). Cluster events reach the queueing hints through ``on_event``; a pod rejected for
room is moved by a deleted pod only if it fits the room freed on that node (``fits_after``:
its requests against the node's capacity and the cache's sums, as NodeResourcesFit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from cloud_core.k8s.cache import SchedulerCache
from cloud_core.k8s.client import JSON
from cloud_core.k8s.queue import ClusterEvent, Event, SchedulingQueue, rejections
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.k8s.workloads import Workloads, pod_uid


def priority(pod: Mapping[str, Any]) -> int:
    """The pod's ``spec.priority`` (0 when absent or not an integer)."""
    p = (pod.get("spec") or {}).get("priority")
    return p if isinstance(p, int) and not isinstance(p, bool) else 0


def gang(pod: Mapping[str, Any]) -> str | None:
    """The pod's ``cfnet.io/gang`` annotation, bounded."""
    g = ((pod.get("metadata") or {}).get("annotations") or {}).get("cfnet.io/gang")
    return str(g)[:253] if g is not None else None


def spec_changed(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """An update that may change where the pod fits (upstream ignores status-only ones)."""
    nm, om = new.get("metadata") or {}, old.get("metadata") or {}
    return (new.get("spec") != old.get("spec") or nm.get("labels") != om.get("labels")
            or nm.get("annotations") != om.get("annotations"))


def namespace_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("namespace", "default"))


class PendingPods:
    """The scheduling queue and the pending pods by key (see the module docstring)."""

    def __init__(self, scheduler_name: str, queue: SchedulingQueue, cache: SchedulerCache,
                 registry: NodeRegistry, workloads: Workloads) -> None:
        self.scheduler_name = scheduler_name
        self.queue = queue  # read its stats only: every change goes through this object
        self._cache = cache
        self._registry = registry
        self._workloads = workloads
        self._lock = threading.Lock()
        # pod key -> pod, of the pods ``holds`` is true for (so a step looks at the backlog,
        # not at every pod of the cluster)
        self._pods: dict[str, JSON] = {}

    def holds(self, pod: JSON) -> bool:
        """``pod`` waits for this scheduler: its own, not bound, not deleted, Pending."""
        spec = pod.get("spec") or {}
        md = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase", "Pending")
        return (spec.get("schedulerName") == self.scheduler_name
                and not spec.get("nodeName") and not md.get("deletionTimestamp")
                and phase == "Pending")

    def arrived(self, key: str, pod: JSON, old: JSON | None, now: float) -> None:
        """A pending pod arrived, or changed (tried again if its spec did)."""
        with self._lock:
            self._pods[key] = pod
            if key in self.queue and (old is None or not spec_changed(pod, old)):
                return
            g = gang(pod)
            ns = namespace_of(pod)
            self.queue.add(key, ns, priority(pod), now, g)
            if g is not None:
                self.queue.on_event(ClusterEvent(Event.PENDING_ADDED, namespace=str(
                    (pod.get("metadata") or {}).get("namespace")), gang=g), now)

    def left(self, key: str) -> None:
        """Pod ``key`` is bound, deleted or no longer pending."""
        with self._lock:
            self._pods.pop(key, None)
            self.queue.remove(key)

    def taken(self, key: str) -> None:
        """Pod ``key`` is assumed bound: out of the queue (back in only if binding fails)."""
        with self._lock:
            self.queue.remove(key)

    def retry(self, key: str, now: float) -> None:
        """The binding of ``key`` failed: tried again after its backoff, if still pending."""
        with self._lock:
            p = self._pods.get(key)
            if p is not None:
                self.queue.add(key, namespace_of(p), priority(p), now, gang(p))
                self.queue.requeue(key, now)

    def failed(self, key: str, message: str, now: float) -> None:
        """Pod ``key`` was tried and not placed, for what ``message`` says."""
        with self._lock:
            self.queue.failed(key, rejections(message), now, self._fits_after)

    def on_event(self, ev: ClusterEvent, now: float) -> int:
        """A cluster event for the queueing hints; how many pods it moved."""
        with self._lock:
            return self.queue.on_event(ev, now, self._fits_after)

    def pop(self, limit: int, now: float, retry_limit: int | None,
            skip: Callable[[str], bool]) -> list[JSON]:
        """The next batch (fair across namespaces; queue.py): up to ``limit`` pods, in flight
        until reported; a key ``skip`` names (assumed meanwhile) leaves the queue instead."""
        with self._lock:
            out = []
            for k in self.queue.pop_batch(limit, now, retry_limit):
                pod = self._pods.get(k)
                if pod is None or skip(k):
                    self.queue.remove(k)
                else:
                    out.append(pod)
            return out

    def has_active(self, now: float) -> bool:
        with self._lock:
            return self.queue.has_active(now)

    def has_in_flight(self) -> bool:
        with self._lock:
            return self.queue.has_in_flight()

    def _fits_after(self, key: str, node: str) -> bool:
        """Queueing hint for a pod rejected for room, after a pod on ``node`` went away:
        does ``key`` fit what is free there now (requested resources only, as
        NodeResourcesFit)? Extended resources, host ports and pod slots: assumed yes.
        Called with ``_lock`` held (the sums are the handler's, already updated)."""
        pod = self._pods.get(key)
        w = self._workloads.get(pod_uid(pod or {}))
        rec = self._registry.get(node)
        if pod is None or w is None or rec is None:
            return True
        used = self._cache.used(node)
        cap = rec.capacity
        return all(want <= 0 or want <= have - u for want, have, u in (
            (w.requests.cpu_milli, cap.cpu_milli, used[0]),
            (w.requests.mem_bytes, cap.mem_bytes, used[1]),
            (w.requests.gpus, cap.gpus, used[2])))
