"""The actuator as the decision loop's sink for placements: ``pods/binding`` and its events.

``commit_placements`` assumes each placed pod on its node (the next batch counts it before the
watch shows the binding) and binds it in the background (a pool of ``bind_workers``), with a
UID precondition and a ``Scheduled`` event; a pod the engine could not place gets a
``FailedScheduling`` event and goes back to the queue with what rejected it. A 409 re-reads the
pod (never bound twice); an unreachable API server is reported at the next step (back-off).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from cloud_core.errors import KubeConflict, KubeNotFound, KubeUnavailable
from cloud_core.k8s.actuator_state import ActuatorState
from cloud_core.k8s.client import JSON
from cloud_core.k8s.informer import obj_key
from cloud_core.k8s.podcache import _assumed_pod, _gang, _priority
from cloud_core.k8s.queue import rejections
from cloud_core.loop import Observation, PlaceOutcome
from cloud_core.placement.model import Workload

log = logging.getLogger(__name__)


class Binder(ActuatorState):
    """Binding placed pods, and the events of a batch (see the module docstring)."""

    def commit_placements(self, obs: Observation, outcome: PlaceOutcome) -> int:
        gen, pods = obs.generation, obs.objects
        for uid, msg in obs.invalid.items():
            self._unschedulable_now(pods[uid], gen, msg)
        if not obs.pending:
            return 0
        self._count("batches")
        if not self.is_leader():
            return 0  # lost the lease while computing: the new leader redoes this batch
        wl = {w.uid: w for w in obs.pending}
        # Assume, then bind in the background (as kube-scheduler does): the next batch is
        # computed while these bind and counts them (snapshot() reads ``_assumed``); a binding
        # that fails forgets its pod, and a KubeUnavailable is re-raised at the next step.
        now = time.monotonic()
        todo = [(pods[u], node, wl[u]) for u, node in outcome.assignments.items()
                if u in pods and u in wl]
        with self._lock:
            for pod, node, w in todo:
                key = obj_key(pod)
                self._assumed[key] = (node, now, _assumed_pod(key, node, w))
                self.queue.remove(key)  # assumed: back in only if its binding fails
            self._binding += len(todo)
        for pod, node, w in todo:
            self._pool.submit(self._bind, pod, node, w, outcome.summaries.get(w.uid, ""),
                              w.uid in obs.pinned)
        self._pages_go.set()  # the first batch's bindings are out: the list may go on
        for u, msg in outcome.failures.items():
            if u in pods:
                g = wl[u].gang if u in wl else None
                if g is not None and f"gang {g}" not in msg:
                    msg = f"gang {g}: {msg}"  # say which gang (namespace/name) waits
                self._unschedulable_now(pods[u], gen, msg)
        # A pinned replacement takes its reservation now: its binding is assumed, and a
        # failed one is placed again by a later step like any pending pod.
        for u in outcome.assignments:
            if u in obs.pinned:
                self._consume_reservation(pods.get(u), obs.pinned[u][1])
        return len(todo)

    def apply(self) -> int:
        return 0  # a binding takes effect when it is made (commit_placements)

    def requeue(self, stranded: Sequence[tuple[Workload, str]]) -> int:
        # On Kubernetes a pod stranded on a down node stays bound: the node lifecycle
        # controller's taint-based eviction removes it, and its controller's replacement is
        # placed as any pending pod.
        return 0

    def _unschedulable_now(self, pod: JSON, gen: int, message: str) -> None:
        md = pod.get("metadata") or {}
        uid = str(md.get("uid"))
        with self._lock:
            self.queue.failed(obj_key(pod), rejections(message), time.monotonic(),
                              self._fits_after)
            repeat = self._last_failure.get(uid) == message
            self._last_failure[uid] = message
        if repeat:
            return
        self._count("failed_scheduling")
        with self._lock:
            self.stats.failed_by_namespace[str(md.get("namespace", ""))] += 1
        # queued (client.EventRecorder): never a blocking call per pod; repeats form a series
        self.client.record_event(pod, reason="FailedScheduling", message=message,
                                 event_type="Warning", instance=self.config.identity)

    def _bind(self, pod: JSON, node: str, w: Workload, why: str = "",
              pinned: bool = False) -> None:
        try:
            self._bind_one(pod, node, w, why, pinned)
        finally:
            with self._lock:
                self._binding -= 1

    def _bind_one(self, pod: JSON, node: str, w: Workload, why: str, pinned: bool) -> None:
        md = pod.get("metadata") or {}
        ns, name, uid = str(md.get("namespace")), str(md.get("name")), str(md.get("uid"))
        key = f"{ns}/{name}"
        try:
            if not self.is_leader():
                raise KubeNotFound("lost the lease before binding")
            self.client.bind_pod(ns, name, uid, node)
        except BaseException as e:
            with self._lock:
                self._assumed.pop(key, None)  # forget: placed again by a later batch
                if key in self._pending and not isinstance(e, KubeConflict):
                    p = self._pending[key]
                    self.queue.add(key, ns, _priority(p.get("spec") or {}), time.monotonic(),
                                   _gang(p))
                    self.queue.requeue(key, time.monotonic())  # after its backoff
            if isinstance(e, KubeConflict):
                self._count("conflicts")
                self._after_conflict(pod, w)
            elif isinstance(e, KubeUnavailable):
                self._bind_error = e
                self._wake.set()
            elif not isinstance(e, KubeNotFound):  # NotFound: deleted meanwhile
                log.warning("binding %s failed: %s", key, e)
            return
        self._count("bound")
        if pinned:
            self._count("pinned_bound")
        with self._lock:
            self.stats.bound_pods.append(key)
        if self.on_bound is not None:
            self.on_bound(key, node)
        # queued (client.EventRecorder): never a blocking call per pod; repeats form a series
        self.client.record_event(pod, reason="Scheduled", instance=self.config.identity,
                                 action="Binding",
                                 message=f"Successfully assigned {key} to {node}"
                                 + (f" ({why})" if why else ""))

    def _after_conflict(self, pod: JSON, w: Workload) -> None:
        md = pod.get("metadata") or {}
        key = obj_key(pod)
        try:
            live = self.client.get(f"/api/v1/namespaces/{md.get('namespace')}/pods/"
                                   f"{md.get('name')}")
        except KubeNotFound:
            return
        node = (live.get("spec") or {}).get("nodeName")
        if node and (live.get("metadata") or {}).get("uid") == md.get("uid"):
            self._count("already_bound")  # an earlier attempt (or another replica) won
            with self._lock:
                self._assumed[key] = (str(node), time.monotonic(),
                                      _assumed_pod(key, str(node), w))
