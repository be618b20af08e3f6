"""The informers' handlers: Nodes to the registry, pods to the queue and to the cache.

``on_node`` / ``on_pod`` are the reflectors' handlers (``informer.py``), after
kube-scheduler's ``eventhandlers.go``: a Node goes to the registry (its label changes wait
for the loop's next ``Observation``), a pending cfnet pod to the pending pods
(``pending.py``), and a bound pod to the scheduler cache (``cache.py``: its entry, parsed
once per version, counted on its node; the watch showing it bound spends its assumption).
Pod and node changes become the queue's cluster events (queueing hints). Every change that
may free room bumps the cluster generation the source compares against.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cloud_core.k8s.cache import Bound, SchedulerCache
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.config import ActuatorConfig, ActuatorStats
from cloud_core.k8s.evict import exclusion
from cloud_core.k8s.informer import obj_key
from cloud_core.k8s.pending import PendingPods
from cloud_core.k8s.queue import ClusterEvent, Event
from cloud_core.k8s.registry import LabelChange, NodeRegistry
from cloud_core.k8s.workloads import Workloads, pod_uid
from cloud_core.placement.model import COUNT_MAX, RunningPod, Workload

CHANGES_KEPT = 8  # what an alert names: the latest few label changes of the node


def node_may_help(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """A Node event that may make a pod fit: a new node, or a change of labels, taints,
    schedulability, allocatable or readiness (not a heartbeat)."""
    if old is None:
        return True
    nm, om = new.get("metadata") or {}, old.get("metadata") or {}
    ns, os_ = new.get("spec") or {}, old.get("spec") or {}
    nst, ost = new.get("status") or {}, old.get("status") or {}

    def ready(st: Mapping[str, Any]) -> Any:
        return [c.get("status") for c in st.get("conditions") or [] if c.get("type") == "Ready"]

    return (nm.get("labels") != om.get("labels") or ns.get("taints") != os_.get("taints")
            or ns.get("unschedulable") != os_.get("unschedulable")
            or nst.get("allocatable") != ost.get("allocatable") or ready(nst) != ready(ost))


def pod_event(prev: Bound | None, entry: Bound | None) -> ClusterEvent | None:
    """What a bound pod's change means to the queueing hints: room freed (it went away or
    finished), or a pod (new labels) for affinity and spread."""
    if prev is not None and prev.live and (entry is None or not entry.live
                                           or entry.node != prev.node):
        return ClusterEvent(Event.POD_DELETED, node=prev.node, namespace=prev.pod.namespace)
    if entry is not None and entry.live and (prev is None or prev.pod.labels
                                             != entry.pod.labels):
        return ClusterEvent(Event.POD_BOUND, node=entry.node, namespace=entry.pod.namespace)
    return None


def uncountable(w: Workload) -> bool:
    """Some figure of ``w``'s requests was clamped to what cfnet counts."""
    r = w.requests
    return (max(abs(r.cpu_milli), abs(r.mem_bytes), abs(r.gpus)) >= COUNT_MAX
            or any(abs(v) >= COUNT_MAX for v in w.extended.values()))


def running_pod(pod: JSON, node: str, w: Workload | None) -> RunningPod:
    md = pod.get("metadata") or {}
    return RunningPod.of(w, node, uid=str(md.get("uid")), name=str(md.get("name")),
                         namespace=str(md.get("namespace", "default")),
                         labels=dict(md.get("labels") or {}),
                         terminating=bool(md.get("deletionTimestamp")))


class EventHandlers:
    """The reflectors' handlers (see the module docstring)."""

    def __init__(self, client: KubeClient, config: ActuatorConfig, stats: ActuatorStats,
                 registry: NodeRegistry, cache: SchedulerCache, pending: PendingPods,
                 workloads: Workloads, wake: Callable[[], None],
                 on_deleted: Sequence[Callable[[str], None]] = ()) -> None:
        self._client = client
        self._config = config
        self._stats = stats
        self._registry = registry
        self._cache = cache
        self._pending = pending
        self._workloads = workloads
        self._wake = wake
        self._on_deleted = on_deleted  # what else forgets a deleted pod (by uid)
        self._lock = threading.Lock()
        self._generation = 0  # bumped on every cluster change that may free room
        self._label_changes: list[LabelChange] = []  # not yet handed to the loop
        self._changes: dict[str, list[LabelChange]] = {}  # node -> its changes, for alerts
        self._uncountable_warned: set[str] = set()  # pod uids told RequestsUncountable

    def generation(self) -> int:
        with self._lock:
            return self._generation

    def take_label_changes(self) -> list[LabelChange]:
        """The label changes since the last call (kept per node for ``recent_changes``)."""
        with self._lock:
            changes, self._label_changes = self._label_changes, []
            for c in changes:
                kept = self._changes.setdefault(c.node, [])
                kept.append(c)
                del kept[:-CHANGES_KEPT]
        return changes

    def recent_changes(self, node: str) -> list[LabelChange]:
        """The latest label changes of ``node`` handed to the loop."""
        with self._lock:
            return list(self._changes.get(node, ()))

    def on_node(self, kind: str, obj: JSON, old: JSON | None) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            self._registry.remove(name)
            with self._lock:
                self._changes.pop(name, None)
        else:
            changes = self._registry.upsert(obj)
            if changes:
                with self._lock:
                    self._label_changes.extend(changes)
        with self._lock:
            self._generation += 1
        if kind != "DELETED" and node_may_help(obj, old):
            self._pending.on_event(ClusterEvent(Event.NODE_CHANGED, node=name),
                                   time.monotonic())
        self._wake()

    def node_changed(self, node: JSON) -> None:
        """A Node the core itself just wrote (a cordon): take it in now, not at the watch."""
        self.on_node("MODIFIED", node, None)

    def on_pod(self, kind: str, obj: JSON, old: JSON | None) -> None:
        key = obj_key(obj)
        spec = obj.get("spec") or {}
        md = obj.get("metadata") or {}
        uid = str(md.get("uid"))
        node = spec.get("nodeName")
        deleted = kind == "DELETED"
        entry: Bound | None = None
        if not deleted and node:
            b = self._cache.entry(uid)
            rv = md.get("resourceVersion")
            # parsed outside any lock, once per version of a bound pod
            entry = b if b is not None and b.rv == rv and b.node == node \
                else self._bound_entry(obj, str(node), rv)
        now = time.monotonic()
        if not deleted and self._pending.holds(obj):
            self._pending.arrived(key, obj, old, now)
        else:
            self._pending.left(key)
        prev = self._cache.set_pod(key, uid, entry, obj, deleted)
        ev = pod_event(prev, entry)
        if ev is not None and self._pending.on_event(ev, now):
            self._wake()
        if deleted:
            self._workloads.drop(uid)
            for forget in self._on_deleted:
                forget(uid)
            with self._lock:
                self._uncountable_warned.discard(uid)
                self._generation += 1
        if deleted or (spec.get("schedulerName") == self._config.scheduler_name and not node):
            self._wake()

    def _bound_entry(self, pod: JSON, node: str, rv: Any) -> Bound:
        spec = pod.get("spec") or {}
        md = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        live = phase not in ("Succeeded", "Failed")
        w = self._workloads.parse(pod)
        # the re-planner's candidates: cfnet's own live pods that may be evicted (never a
        # DaemonSet, mirror/static, system-critical, kube-system or local-storage pod)
        mine = (live and spec.get("schedulerName") == self._config.scheduler_name
                and not md.get("deletionTimestamp")
                and exclusion(pod, self._config.eviction) is None)
        if live and w is not None and uncountable(w):
            self._warn_uncountable(pod, node, w)
        return Bound(rv=rv, node=node, key=obj_key(pod), live=live,
                     pod=running_pod(pod, node, w), own=w if mine else None)

    def _warn_uncountable(self, pod: JSON, node: str, w: Workload) -> None:
        """A bound pod (any scheduler's) asks for more than cfnet counts: it is counted as
        that much (its node is full for cfnet), said once per pod in a Warning event."""
        uid = pod_uid(pod)
        with self._lock:
            if uid in self._uncountable_warned:
                return
            self._uncountable_warned.add(uid)
        what = ", ".join(f"{k}" for k, v in (("cpu", w.requests.cpu_milli),
                                            ("memory", w.requests.mem_bytes),
                                            ("nvidia.com/gpu", w.requests.gpus),
                                            *w.extended.items()) if abs(v) >= COUNT_MAX)
        self._stats.add("uncountable")
        self._client.record_event(
            pod, reason="RequestsUncountable", event_type="Warning",
            instance=self._config.identity,
            message=f"{obj_key(pod)} on node {node} requests more {what} than cfnet counts "
                    f"({COUNT_MAX}); cfnet counts it as {COUNT_MAX}, so {node} takes no pod "
                    f"that needs {what}")
