"""The actuator's informer handlers, its pod cache and the sums per node the snapshot counts.

``_on_node`` / ``_on_pod`` are the reflectors' handlers (``informer.py``): a Node goes to the
registry (label changes to the loop's next ``Observation``), a pending cfnet pod to the
scheduling queue (``queue.py``), and a bound pod to what the snapshot counts: its entry
(``_Bound``, parsed once per version), the live pods, cfnet's own, and the requests per node,
kept as the watch delivers so that a step reads the sums instead of walking every pod. Pod and
node changes become the queue's cluster events (queueing hints).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from cloud_core.errors import SpecError
from cloud_core.k8s.actuator_state import ActuatorState
from cloud_core.k8s.client import JSON
from cloud_core.k8s.evict import exclusion
from cloud_core.k8s.informer import obj_key
from cloud_core.k8s.queue import ClusterEvent, Event
from cloud_core.placement.model import COUNT_MAX, Resources, RunningPod, Workload


def parse_workload(pod: Mapping[str, Any]) -> Workload:
    """A pod as the engine's ``Workload`` (raises ``SpecError``)."""
    from cloud_core.placement import parse_pod

    return parse_pod(pod)


class _Bound(NamedTuple):
    """A bound pod as the snapshot counts it, kept per pod uid while its version holds."""

    rv: Any
    node: str
    key: str  # namespace/name
    live: bool  # not Succeeded/Failed: counts on its node
    pod: RunningPod
    own: Workload | None  # cfnet's own, live, not being deleted: the re-planner may move it


def _assumed_pod(key: str, node: str, w: Workload | None) -> RunningPod | None:
    """A binding made but not seen yet, as the snapshot counts it (built once, not per step)."""
    if w is None:
        return None
    ns, _, name = key.partition("/")
    return RunningPod.of(w, node, name=name, namespace=ns)


def _accumulate(a: list[int], r: Resources, sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) ``r`` from a node's [cpu, memory, GPUs] sums."""
    a[0] += sign * r.cpu_milli
    a[1] += sign * r.mem_bytes
    a[2] += sign * r.gpus


def _priority(spec: Mapping[str, Any]) -> int:
    p = spec.get("priority")
    return p if isinstance(p, int) and not isinstance(p, bool) else 0


def _gang(pod: Mapping[str, Any]) -> str | None:
    g = ((pod.get("metadata") or {}).get("annotations") or {}).get("cfnet.io/gang")
    return str(g)[:253] if g is not None else None


def _spec_changed(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """An update that may change where the pod fits (upstream ignores status-only ones)."""
    nm, om = new.get("metadata") or {}, old.get("metadata") or {}
    return (new.get("spec") != old.get("spec") or nm.get("labels") != om.get("labels")
            or nm.get("annotations") != om.get("annotations"))


def _node_may_help(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
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


def _pod_event(prev: _Bound | None, entry: _Bound | None) -> ClusterEvent | None:
    """What a bound pod's change means to the queueing hints: room freed (it went away or
    finished), or a pod (new labels) for affinity and spread."""
    if prev is not None and prev.live and (entry is None or not entry.live
                                           or entry.node != prev.node):
        return ClusterEvent(Event.POD_DELETED, node=prev.node, namespace=prev.pod.namespace)
    if entry is not None and entry.live and (prev is None or prev.pod.labels
                                             != entry.pod.labels):
        return ClusterEvent(Event.POD_BOUND, node=entry.node, namespace=entry.pod.namespace)
    return None


def _uncountable(w: Workload) -> bool:
    """Some figure of ``w``'s requests was clamped to what cfnet counts."""
    r = w.requests
    return (max(abs(r.cpu_milli), abs(r.mem_bytes), abs(r.gpus)) >= COUNT_MAX
            or any(abs(v) >= COUNT_MAX for v in w.extended.values()))


class PodCache(ActuatorState):
    """Informer handlers, the pod cache and its sums (see the module docstring)."""

    def _on_node(self, kind: str, obj: JSON, old: JSON | None) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            self.registry.remove(name)
            with self._lock:
                self._changes.pop(name, None)
        else:
            changes = self.registry.upsert(obj)
            if changes:
                with self._lock:
                    self._pending_changes.extend(changes)
        with self._lock:
            self._generation += 1
            if kind != "DELETED" and _node_may_help(obj, old):
                self.queue.on_event(ClusterEvent(Event.NODE_CHANGED, node=name),
                                    time.monotonic())
        self._wake.set()

    def _on_pod(self, kind: str, obj: JSON, old: JSON | None) -> None:
        key = obj_key(obj)
        spec = obj.get("spec") or {}
        md = obj.get("metadata") or {}
        uid = str(md.get("uid"))
        node = spec.get("nodeName")
        entry: _Bound | None = None
        if kind != "DELETED" and node:
            b = self._running_cache.get(uid)
            rv = md.get("resourceVersion")
            # parsed outside the lock, once per version of a bound pod
            entry = b if b is not None and b.rv == rv and b.node == node \
                else self._bound_entry(obj, str(node), rv)
        now = time.monotonic()
        with self._lock:
            if kind != "DELETED" and self.is_pending(obj):
                self._pending[key] = obj
                if key not in self.queue or (old is not None and _spec_changed(obj, old)):
                    gang = _gang(obj)
                    self.queue.add(key, str(md.get("namespace", "default")),
                                   _priority(spec), now, gang)
                    if gang is not None:
                        self.queue.on_event(ClusterEvent(
                            Event.PENDING_ADDED, namespace=str(md.get("namespace")),
                            gang=gang), now)
            else:
                self._pending.pop(key, None)
                self.queue.remove(key)
            prev = self._running_cache.get(uid)
            self._count_bound(uid, entry, obj)
            ev = _pod_event(prev, entry)
            if ev is not None and self.queue.on_event(ev, now, self._fits_after):
                self._wake.set()
            if kind == "DELETED":
                self._assumed.pop(key, None)
                self._workloads.pop(uid, None)
                self._last_failure.pop(uid, None)
                self._alerted.discard(uid)
                self._uncountable_warned.discard(uid)
                self._generation += 1
            elif node and key in self._assumed:
                del self._assumed[key]  # the informer caught up with our binding
        if kind == "DELETED" or (spec.get("schedulerName") == self.config.scheduler_name
                                 and not node):
            self._wake.set()

    def _count_bound(self, uid: str, entry: _Bound | None, pod: JSON) -> None:
        """Pod ``uid`` is now ``entry`` (None: not bound, or gone) in what the snapshot
        counts: its requests on its node, its RunningPod, cfnet's own pods. Kept as the
        watch delivers, so a step reads the sums instead of walking every pod of the
        cluster (10,000 bound pods: 20-60 ms a step). Call with ``_lock`` held."""
        prev = self._running_cache.get(uid)
        if prev is entry:
            return
        if prev is not None:
            del self._running_cache[uid]
            self._bound_keys.discard(prev.key)
            if prev.live:
                del self._live[uid]
                self._add_usage(prev.node, prev.pod.requests, -1)
            self._own.pop(uid, None)
        if entry is not None:
            self._running_cache[uid] = entry
            self._bound_keys.add(entry.key)
            if entry.live:
                self._live[uid] = entry.pod
                self._add_usage(entry.node, entry.pod.requests, 1)
                if entry.own is not None:
                    self._own[uid] = (pod, entry.own, entry.node)

    def _add_usage(self, node: str, r: Resources, sign: int) -> None:
        a = self._usage.get(node)
        if a is None:
            a = self._usage[node] = [0, 0, 0, 0]
        _accumulate(a, r, sign)
        a[3] += sign  # pods: the entry goes when its last pod does
        if not a[3]:
            del self._usage[node]

    def _fits_after(self, key: str, node: str) -> bool:
        """Queueing hint for a pod rejected for room, after a pod on ``node`` went away:
        does ``key`` fit what is free there now (requested resources only, as
        NodeResourcesFit)? Extended resources, host ports and pod slots: assumed yes.
        Call with ``_lock`` held (the sums are the handler's, already updated)."""
        pod = self._pending.get(key)
        w = self._workloads.get(str(((pod or {}).get("metadata") or {}).get("uid")))
        rec = self.registry.get(node)
        if pod is None or w is None or rec is None:
            return True
        used = self._usage.get(node, [0, 0, 0, 0])
        cap = rec.capacity
        return all(want <= 0 or want <= have - u for want, have, u in (
            (w.requests.cpu_milli, cap.cpu_milli, used[0]),
            (w.requests.mem_bytes, cap.mem_bytes, used[1]),
            (w.requests.gpus, cap.gpus, used[2])))

    def _workload(self, pod: JSON) -> Workload | None:
        uid = str((pod.get("metadata") or {}).get("uid"))
        with self._lock:
            if uid in self._workloads:
                return self._workloads[uid]
        try:
            w: Workload | None = parse_workload(pod)
        except SpecError:
            from cloud_core.placement.spec import usage_workload

            w = usage_workload(pod)  # still count what it takes from its node
        with self._lock:
            self._workloads[uid] = w
        return w

    def parse(self, pod: JSON) -> Workload | None:
        """``pod`` as the engine's Workload (cached per uid); None when it cannot be read."""
        return self._workload(pod)

    def last_failure(self, uid: str) -> str | None:
        """The last FailedScheduling message for pod ``uid`` (None: none, or placed)."""
        with self._lock:
            return self._last_failure.get(uid)

    def node_changed(self, node: JSON) -> None:
        """A Node the core itself just wrote (a cordon): take it in now, not at the watch."""
        self._on_node("MODIFIED", node, None)

    def is_pending(self, pod: JSON) -> bool:
        spec = pod.get("spec") or {}
        md = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase", "Pending")
        return (spec.get("schedulerName") == self.config.scheduler_name
                and not spec.get("nodeName") and not md.get("deletionTimestamp")
                and phase == "Pending")

    def _bound_entry(self, pod: JSON, node: str, rv: Any) -> _Bound:
        spec = pod.get("spec") or {}
        md = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        live = phase not in ("Succeeded", "Failed")
        w = self._workload(pod)
        # the re-planner's candidates: cfnet's own live pods that may be evicted (never a
        # DaemonSet, mirror/static, system-critical, kube-system or local-storage pod)
        mine = (live and spec.get("schedulerName") == self.config.scheduler_name
                and not md.get("deletionTimestamp")
                and exclusion(pod, self.config.eviction) is None)
        if live and w is not None and _uncountable(w):
            self._warn_uncountable(pod, node, w)
        return _Bound(rv=rv, node=node, key=obj_key(pod), live=live,
                      pod=self._running(pod, node, w), own=w if mine else None)

    def _warn_uncountable(self, pod: JSON, node: str, w: Workload) -> None:
        """A bound pod (any scheduler's) asks for more than cfnet counts: it is counted as
        that much (its node is full for cfnet), said once per pod in a Warning event."""
        uid = str((pod.get("metadata") or {}).get("uid"))
        with self._lock:
            if uid in self._uncountable_warned:
                return
            self._uncountable_warned.add(uid)
        what = ", ".join(f"{k}" for k, v in (("cpu", w.requests.cpu_milli),
                                            ("memory", w.requests.mem_bytes),
                                            ("nvidia.com/gpu", w.requests.gpus),
                                            *w.extended.items()) if abs(v) >= COUNT_MAX)
        self._count("uncountable")
        self.client.record_event(
            pod, reason="RequestsUncountable", event_type="Warning",
            instance=self.config.identity,
            message=f"{obj_key(pod)} on node {node} requests more {what} than cfnet counts "
                    f"({COUNT_MAX}); cfnet counts it as {COUNT_MAX}, so {node} takes no pod "
                    f"that needs {what}")

    @staticmethod
    def _running(pod: JSON, node: str, w: Workload | None) -> RunningPod:
        md = pod.get("metadata") or {}
        return RunningPod.of(w, node, uid=str(md.get("uid")), name=str(md.get("name")),
                             namespace=str(md.get("namespace", "default")),
                             labels=dict(md.get("labels") or {}),
                             terminating=bool(md.get("deletionTimestamp")))
