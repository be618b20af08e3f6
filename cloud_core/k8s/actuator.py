"""Kubernetes actuator: watch pending cfnet pods, place them in batches, bind, report events.

Two reflectors (pods, nodes) keep local caches on every replica; only the leader acts. The
scheduling loop takes the pending pods whose ``schedulerName`` is ``cfnet-scheduler``, builds a
``ClusterSnapshot`` from the node registry and the running pods, runs the engine and its
validator (``run_engine``: the one place that calls the engine), binds each placed pod through
``pods/binding`` with a UID precondition, and writes ``Scheduled`` / ``FailedScheduling``
events. Bound-but-not-yet-observed pods are "assumed" so the next batch counts their resources.

Failure handling: a 409 on bind means the pod is already bound (by an earlier attempt whose
answer was lost, or another replica) or was replaced; the pod is re-read and never bound twice.
An unreachable API server leaves pods pending and retries with backoff; the reflectors
resume or relist (410) on their own. Unschedulable pods wait for a cluster change (node or pod
event) or ``retry_unschedulable_s``.

When a node's region / zone / security-level label changes, the running cfnet pods there are
re-validated; a pod that no longer fits raises an alert (a Warning event and ``on_alert``) and
is re-placed: evicted, and for a pod without a controller a replacement copy is created, which
the loop then places like any pending pod.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from cloud_core.errors import KubeConflict, KubeError, KubeNotFound, KubeUnavailable, SpecError
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.informer import Reflector, obj_key
from cloud_core.k8s.registry import LabelChange, NodeRegistry
from cloud_core.placement.model import ClusterSnapshot, Resources, RunningPod, Workload

log = logging.getLogger(__name__)

SCHEDULER_NAME = "cfnet-scheduler"
REPLACES = "cfnet.io/replaces"


@dataclass(frozen=True)
class EngineOutcome:
    """What the engine decided for one batch: validated bindings and reasons for the rest."""

    assignments: dict[str, str]  # workload uid → node
    failures: dict[str, str]  # workload uid → FailedScheduling message
    violations: dict[str, list[str]]  # workload uid → validator complaints about a binding


def run_engine(snapshot: ClusterSnapshot, workloads: Sequence[Workload],
               config: Any = None) -> EngineOutcome:
    """Place a batch and validate the result (the only call into the placement engine)."""
    from cloud_core.placement import place, validate

    result = place(snapshot, workloads, config) if config is not None else \
        place(snapshot, workloads)
    problems: dict[str, list[str]] = {}
    for v in validate(snapshot, workloads, result.assignments, config):
        problems.setdefault(v.workload_uid, []).append(f"{v.constraint}: {v.detail}")
    assignments = {u: n for u, n in result.assignments.items() if n and u not in problems}
    failures = {d.workload_uid: d.summary for d in result.decisions
                if not d.node and d.workload_uid not in assignments}
    for u, p in problems.items():
        failures[u] = "validator rejected the engine's choice: " + "; ".join(p)
    return EngineOutcome(assignments, failures, problems)


def parse_workload(pod: Mapping[str, Any]) -> Workload:
    """A pod as the engine's ``Workload`` (raises ``SpecError``)."""
    from cloud_core.placement import parse_pod

    return parse_pod(pod)


def validate_binding(snapshot: ClusterSnapshot, workload: Workload, node: str,
                     config: Any = None) -> list[str]:
    """The validator's complaints about ``workload`` running on ``node`` (empty: fine).

    ``snapshot`` must not count ``workload`` itself among the running pods.
    """
    from cloud_core.placement import validate

    return [f"{v.constraint}: {v.detail}" for v in validate(snapshot, [workload], {
        workload.uid: node}, config)]


@dataclass
class ActuatorConfig:
    """Knobs of the scheduling loop."""

    scheduler_name: str = SCHEDULER_NAME
    batch_wait_s: float = 0.3  # gather arrivals this long before placing a batch
    max_batch: int = 500
    bind_workers: int = 24  # concurrent pods/binding calls (keep-alive connections)
    retry_unschedulable_s: float = 30.0
    unavailable_backoff_max_s: float = 5.0
    engine_config: Any = None
    identity: str = "cfnet-core"
    replace_on_violation: bool = True


@dataclass
class ActuatorStats:
    """Counters for tests and /metrics."""

    bound: int = 0
    conflicts: int = 0
    already_bound: int = 0
    failed_scheduling: int = 0
    unavailable: int = 0
    batches: int = 0
    alerts: int = 0
    replaced: int = 0
    bound_pods: deque[str] = field(default_factory=lambda: deque(maxlen=100_000))


def _with_allocation(snap: ClusterSnapshot, node: str, req: Resources) -> ClusterSnapshot:
    nodes = tuple(replace(n, allocated=n.allocated + req) if n.name == node else n
                  for n in snap.nodes)
    return replace(snap, nodes=nodes)


def _pod_requests(w: Workload | None) -> Resources:
    return w.requests if w is not None else Resources()


class Actuator:
    """Watches pods and nodes, and (while ``is_leader()``) binds pending cfnet pods."""

    def __init__(self, client: KubeClient, registry: NodeRegistry | None = None,
                 config: ActuatorConfig | None = None, *,
                 is_leader: Callable[[], bool] = lambda: True,
                 on_alert: Callable[[dict[str, Any]], None] | None = None,
                 on_bound: Callable[[str, str], None] | None = None,
                 links: Callable[[], Mapping[tuple[str, str], Any]] | None = None) -> None:
        self.client = client
        self.registry = registry or NodeRegistry()
        self.config = config or ActuatorConfig()
        self.is_leader = is_leader
        self.on_alert = on_alert
        self.on_bound = on_bound
        self.links = links or (lambda: {})
        self.stats = ActuatorStats()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._assumed: dict[str, tuple[str, float, Workload | None]] = {}  # pod key → node
        self._unschedulable: dict[str, tuple[float, int]] = {}  # pod key → (when, generation)
        self._last_failure: dict[str, str] = {}  # pod uid → last FailedScheduling message
        self._workloads: dict[str, Workload | None] = {}  # pod uid → parsed workload
        self._generation = 0  # bumped on every cluster change that may free room
        self._pending_changes: list[LabelChange] = []
        self._alerted: set[str] = set()  # pod uids already reported as violating
        self._to_replace: dict[str, JSON] = {}  # pod uid → pod whose re-placement must finish
        self._pool = ThreadPoolExecutor(self.config.bind_workers, thread_name_prefix="bind")
        self.pods = Reflector(client, "/api/v1/pods", self._on_pod, name="pods")
        self.nodes = Reflector(client, "/api/v1/nodes", self._on_node, name="nodes")
        self._thread: threading.Thread | None = None
        self._bind_error: KubeUnavailable | None = None  # from a binding in flight

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.nodes.start()
        self.pods.start()
        self._thread = threading.Thread(target=self.run, name="cfnet-actuator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.pods.stop_event.set()
        self.nodes.stop_event.set()
        if self._thread is not None:
            self._thread.join(30)
        self._pool.shutdown(wait=True)

    def wake(self) -> None:
        """Look for pending pods now (e.g. on becoming the leader)."""
        self._wake.set()

    def wait_synced(self, timeout: float = 30.0) -> bool:
        return self.pods.synced.wait(timeout) and self.nodes.synced.wait(timeout)

    # -- cache handlers ------------------------------------------------------------------------
    def _on_node(self, kind: str, obj: JSON, old: JSON | None) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            self.registry.remove(name)
        else:
            changes = self.registry.upsert(obj)
            if changes:
                with self._lock:
                    self._pending_changes.extend(changes)
        with self._lock:
            self._generation += 1
        self._wake.set()

    def _on_pod(self, kind: str, obj: JSON, old: JSON | None) -> None:
        key = obj_key(obj)
        spec = obj.get("spec") or {}
        with self._lock:
            if kind == "DELETED":
                self._assumed.pop(key, None)
                self._unschedulable.pop(key, None)
                uid = str((obj.get("metadata") or {}).get("uid"))
                self._workloads.pop(uid, None)
                self._last_failure.pop(uid, None)
                self._alerted.discard(uid)
                self._generation += 1
            elif spec.get("nodeName") and key in self._assumed:
                del self._assumed[key]  # the informer caught up with our binding
        if kind == "DELETED" or (spec.get("schedulerName") == self.config.scheduler_name
                                 and not spec.get("nodeName")):
            self._wake.set()

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    # -- state views ---------------------------------------------------------------------------
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

    def is_pending(self, pod: JSON) -> bool:
        spec = pod.get("spec") or {}
        md = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase", "Pending")
        return (spec.get("schedulerName") == self.config.scheduler_name
                and not spec.get("nodeName") and not md.get("deletionTimestamp")
                and phase == "Pending")

    def snapshot(self, exclude: frozenset[str] = frozenset()) -> ClusterSnapshot:
        """Registry nodes + running pods (+ assumed bindings) as the engine's snapshot.

        Pods whose uid is in ``exclude`` are left out (to re-validate them).
        """
        allocated: dict[str, Resources] = {}
        running: list[RunningPod] = []
        seen_bound: set[str] = set()
        # Assumptions first, then the cache: a binding the watch delivers in between (its
        # handler spends the assumption) is then counted once, never zero times.
        with self._lock:
            assumed_before = dict(self._assumed)
        for pod in self.pods.items():
            spec = pod.get("spec") or {}
            node = spec.get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            if node:
                seen_bound.add(obj_key(pod))
            if not node or phase in ("Succeeded", "Failed"):
                continue
            if str((pod.get("metadata") or {}).get("uid")) in exclude:
                continue
            w = self._workload(pod)
            running.append(self._running(pod, node, w))
            allocated[node] = allocated.get(node, Resources()) + _pod_requests(w)
        with self._lock:
            # The watch can deliver a binding before _bind records it as assumed; once the
            # cache shows the pod bound, the assumption is spent (never count a pod twice).
            for key in seen_bound & self._assumed.keys():
                del self._assumed[key]
            assumed = [(k, v) for k, v in {**assumed_before, **self._assumed}.items()
                       if k not in seen_bound]
        for key, (node, _, w) in assumed:
            ns, _, name = key.partition("/")
            if w is not None:
                running.append(RunningPod(uid=w.uid, name=name, namespace=ns, node=node,
                                          labels=w.labels, requests=w.requests,
                                          anti_affinity=w.pod_anti_affinity,
                                          host_ports=w.host_ports, extended=w.extended))
            allocated[node] = allocated.get(node, Resources()) + _pod_requests(w)
        return ClusterSnapshot(nodes=self.registry.node_infos(allocated),
                               links=dict(self.links()), now=time.time(), pods=tuple(running))

    @staticmethod
    def _running(pod: JSON, node: str, w: Workload | None) -> RunningPod:
        md = pod.get("metadata") or {}
        return RunningPod(uid=str(md.get("uid")), name=str(md.get("name")),
                          namespace=str(md.get("namespace", "default")), node=node,
                          labels=dict(md.get("labels") or {}), requests=_pod_requests(w),
                          anti_affinity=w.pod_anti_affinity if w else (),
                          host_ports=w.host_ports if w else (),
                          extended=w.extended if w else {})

    def pending(self) -> list[JSON]:
        now = time.monotonic()
        with self._lock:
            assumed = set(self._assumed)
            unsched = dict(self._unschedulable)
            gen = self._generation
        out = []
        for pod in self.pods.items():
            if not self.is_pending(pod):
                continue
            key = obj_key(pod)
            if key in assumed:
                continue
            u = unsched.get(key)
            if u is not None and u[1] == gen and now - u[0] < self.config.retry_unschedulable_s:
                continue
            out.append(pod)
        out.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp", "")))
        return out[: self.config.max_batch]

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        backoff = 0.2
        more = True  # at start-up, what is pending has waited long enough: no gathering
        while not self._stop.is_set() and not self.wait_synced(timeout=0.5):
            pass
        while not self._stop.is_set():
            self._wake.wait(timeout=1.0)
            if self._stop.is_set():
                return
            self._wake.clear()
            if not self.is_leader():
                continue
            if not more:  # a backlog needs no gathering: its next batch is already there
                self._stop.wait(self.config.batch_wait_s)  # let a burst of arrivals gather
            more = False
            try:
                self._handle_label_changes()
                more = self.schedule_once()
                backoff = 0.2
                if more:
                    self._wake.set()
            except KubeUnavailable as e:
                self._count("unavailable")
                log.info("API server unavailable (%s); retry in %.1fs", e, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.config.unavailable_backoff_max_s)
                self._wake.set()
            except Exception:
                log.exception("scheduling batch failed")
                self._stop.wait(backoff)
                self._wake.set()

    def schedule_once(self) -> bool:
        """Place and bind one batch; True when pods are left for another batch."""
        err, self._bind_error = self._bind_error, None
        if err is not None:
            raise err  # a binding of the last batch found the API server gone: back off
        pods = self.pending()
        if not pods:
            return False
        self._count("batches")
        with self._lock:
            gen = self._generation
        by_uid: dict[str, JSON] = {}
        workloads: list[Workload] = []
        for pod in pods:
            uid = str((pod.get("metadata") or {}).get("uid"))
            try:
                w = parse_workload(pod)
            except SpecError as e:
                self._unschedulable_now(pod, gen, f"invalid workload spec: {e}")
                continue
            by_uid[w.uid] = pod
            workloads.append(w)
            with self._lock:
                self._workloads[uid] = w
        if not workloads:
            return False
        snap = self.snapshot()
        try:
            out = run_engine(snap, workloads, self.config.engine_config)
        except Exception:
            # One bad workload must not block the whole batch: place them one by one, and
            # report the ones the engine chokes on.
            log.exception("placing a batch of %d failed; placing one by one", len(workloads))
            out = self._place_singly(snap, workloads, by_uid, gen)
        if not self.is_leader():
            return False  # lost the lease while computing: the new leader redoes this batch
        wl = {w.uid: w for w in workloads}
        # Assume, then bind in the background (as kube-scheduler does): the next batch is
        # computed while these bind and counts them; a binding that fails forgets its pod.
        now = time.monotonic()
        todo = [(by_uid[u], node, wl[u]) for u, node in out.assignments.items() if u in by_uid]
        with self._lock:
            for pod, node, w in todo:
                self._assumed[obj_key(pod)] = (node, now, w)
        for pod, node, w in todo:
            self._pool.submit(self._bind, pod, node, w)
        for u, msg in out.failures.items():
            if u in by_uid:
                self._unschedulable_now(by_uid[u], gen, msg)
        return len(pods) >= self.config.max_batch

    def _place_singly(self, snap: ClusterSnapshot, workloads: list[Workload],
                      by_uid: dict[str, JSON], gen: int) -> EngineOutcome:
        assignments: dict[str, str] = {}
        failures: dict[str, str] = {}
        for w in workloads:
            try:
                one = run_engine(snap, [w], self.config.engine_config)
            except Exception as e:
                self._unschedulable_now(by_uid[w.uid], gen,
                                        f"placement engine error: {type(e).__name__}: {e}")
                continue
            assignments.update(one.assignments)
            failures.update(one.failures)
            for node in one.assignments.values():  # account it before the next one
                snap = _with_allocation(snap, node, w.requests)
        return EngineOutcome(assignments, failures, {})

    def _unschedulable_now(self, pod: JSON, gen: int, message: str) -> None:
        md = pod.get("metadata") or {}
        uid = str(md.get("uid"))
        with self._lock:
            self._unschedulable[obj_key(pod)] = (time.monotonic(), gen)
            repeat = self._last_failure.get(uid) == message
            self._last_failure[uid] = message
        if repeat:
            return
        self._count("failed_scheduling")
        # queued (client.EventRecorder): never a blocking call per pod; repeats form a series
        self.client.record_event(pod, reason="FailedScheduling", message=message,
                                 event_type="Warning", instance=self.config.identity)

    def _bind(self, pod: JSON, node: str, w: Workload) -> None:
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
            if isinstance(e, KubeConflict):
                self._count("conflicts")
                self._after_conflict(pod, w)
            elif isinstance(e, KubeUnavailable):
                self._bind_error = e
                self._wake.set()
            elif not isinstance(e, KubeNotFound):  # NotFound: deleted meanwhile
                log.warning("binding %s failed: %s", key, e)
            return
        with self._lock:
            self._assumed[key] = (node, time.monotonic(), w)
            self._unschedulable.pop(key, None)
        self._count("bound")
        with self._lock:
            self.stats.bound_pods.append(key)
        if self.on_bound is not None:
            self.on_bound(key, node)
        self.client.record_event(pod, reason="Scheduled", instance=self.config.identity,
                                 action="Binding",
                                 message=f"Successfully assigned {key} to {node}")

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
                self._assumed[key] = (str(node), time.monotonic(), w)

    # -- residency / security re-validation ----------------------------------------------------
    def _handle_label_changes(self) -> None:
        with self._lock:
            changes, self._pending_changes = self._pending_changes, []
        nodes = {c.node for c in changes}
        for pod in self.pods.items() if nodes else []:
            spec = pod.get("spec") or {}
            node = spec.get("nodeName")
            md = pod.get("metadata") or {}
            if node not in nodes or spec.get("schedulerName") != self.config.scheduler_name:
                continue
            if md.get("deletionTimestamp") or str(md.get("uid")) in self._alerted:
                continue
            w = self._workload(pod)
            if w is None:
                continue
            snap = self.snapshot(exclude=frozenset({w.uid}))
            problems = validate_binding(snap, w, str(node), self.config.engine_config)
            if problems:
                self._alert(pod, str(node), problems, [c for c in changes if c.node == node])
                if self.config.replace_on_violation:
                    self._to_replace[str(md.get("uid"))] = pod
        for uid, pod in list(self._to_replace.items()):
            try:
                self._replace(pod)
            except KubeNotFound:
                pass
            except KubeError as err:  # retried on the next round (PDB said no, server down)
                log.info("re-placing %s failed, will retry: %s", obj_key(pod), err)
                continue
            del self._to_replace[uid]

    def _alert(self, pod: JSON, node: str, problems: list[str],
               changes: list[LabelChange]) -> None:
        key = obj_key(pod)
        self._alerted.add(str((pod.get("metadata") or {}).get("uid")))
        what = ", ".join(f"{c.key}: {c.old} -> {c.new}" for c in changes)
        msg = f"node {node} changed ({what}); pod no longer fits: {'; '.join(problems)}"
        self._count("alerts")
        alert = {"kind": "constraint-violation", "pod": key, "node": node, "problems": problems,
                 "changes": [c.__dict__ for c in changes]}
        if self.on_alert is not None:
            self.on_alert(alert)
        try:
            self.client.emit_event(pod, reason="ConstraintViolated", message=msg,
                                   event_type="Warning", instance=self.config.identity)
        except KubeError as err:
            log.warning("alert event for %s lost: %s", key, err)

    def _replace(self, pod: JSON) -> None:
        """Evict ``pod``; for a bare pod, create its unbound replacement (idempotent)."""
        md = pod.get("metadata") or {}
        key = obj_key(pod)
        ns, name = str(md.get("namespace")), str(md.get("name"))
        self.client.create(f"/api/v1/namespaces/{ns}/pods/{name}/eviction", {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns}})
        if any(o.get("controller") for o in md.get("ownerReferences") or []):
            self._count("replaced")  # its controller recreates it pending; we place that one
            return
        live = self.client.list(f"/api/v1/namespaces/{ns}/pods")[0]
        if any((p["metadata"].get("annotations") or {}).get(REPLACES) == key for p in live):
            return  # an earlier round created it
        clone = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{name.split('--')[0]}--", "namespace": ns,
                         "labels": dict(md.get("labels") or {}),
                         "annotations": {**(md.get("annotations") or {}), REPLACES: key}},
            "spec": {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"},
        }
        self.client.create(f"/api/v1/namespaces/{ns}/pods", clone)
        self._count("replaced")
