"""Kubernetes mode of the decision loop: informers in, ``pods/binding`` and evictions out.

Two reflectors (pods, nodes) keep local caches on every replica; only the leader acts. This
class is the loop's :class:`~cloud_core.loop.SourceOfTruth` (the pending pods whose
``schedulerName`` is ``cfnet-scheduler``, the bound ones, and a ``ClusterSnapshot`` from the
Node registry, the running pods and the agents' measured links) and its
:class:`~cloud_core.loop.StepActuator`: placing, validating and re-planning are
:class:`cloud_core.loop.DecisionLoop`'s, the same code as in local mode. Each placed pod is
bound through ``pods/binding`` with a UID precondition, with ``Scheduled`` /
``FailedScheduling`` events. Bound-but-not-yet-observed pods are "assumed" so the next batch
counts their resources.

Re-placement: when the loop moves a running pod (latency SLA broken for enough intervals, node
down), the pod is evicted through the Eviction API (PodDisruptionBudgets honoured: a refused
eviction is retried when the pod strikes out again) with a ``Rescheduling`` event in the
engine's words. The destination is remembered under the pod's controller and template
(``ownerReference`` uid + ``pod-template-hash`` / ``controller-revision-hash``); the next
pending pod of that controller and template (the replacement its controller creates) is bound
there if the validator still agrees. A pod no controller owns is not moved (``NotMoved``
event; cfnet creates no pods, k8s/evict.py); a copy an older leader made (annotated
``cfnet.io/replaces``) is still bound where its plan says.

Failure handling: a 409 on bind means the pod is already bound (by an earlier attempt whose
answer was lost, or another replica) or was replaced; the pod is re-read and never bound twice.
An unreachable API server leaves pods pending and retries with backoff; the reflectors
resume or relist (410) on their own. Pending pods wait in a scheduling queue like
kube-scheduler's (``queue.py``: per-pod backoff, queueing hints, fair across namespaces).

When a node's region / zone / security-level label changes, the change goes to the loop in the
next ``Observation`` (``revalidate``); the loop checks the running pods there with the
validator, and one that no longer fits raises an alert (``report_misfits``: a
``ConstraintViolated`` Warning event and ``on_alert``) and is moved by the re-planner like any
other move (cool-down, ``Rescheduling`` event, eviction, the replacement bound where it
planned).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cloud_core.errors import KubeConflict, KubeError, KubeNotFound, KubeUnavailable, SpecError
from cloud_core.events import EventLog
from cloud_core.health import combined_health
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.evict import exclusion, unowned
from cloud_core.k8s.informer import Reflector, obj_key
from cloud_core.k8s.queue import ClusterEvent, Event, SchedulingQueue, rejections
from cloud_core.k8s.registry import LabelChange, NodeRegistry
from cloud_core.loop import DecisionLoop, Move, Observation, PlaceOutcome, place_checked
from cloud_core.placement.model import (
    COUNT_MAX,
    ClusterSnapshot,
    Health,
    NodeInfo,
    Resources,
    RunningPod,
    Workload,
    bounded_resources,
)
from cloud_core.placement.spec import PodParser

log = logging.getLogger(__name__)

SCHEDULER_NAME = "cfnet-scheduler"
REPLACES = "cfnet.io/replaces"
PLANNED_NODE = "cfnet.io/planned-node"  # on a copy: where the move that made it planned it
PLANNED_FROM = "cfnet.io/planned-from"  # on a copy: the moved pod's uid (its cool-down)
RESERVATION_TTL_S = 120.0  # how long a move's destination waits for the replacement pod



def replacement_key(pod: Mapping[str, Any]) -> tuple[str, ...] | None:
    """What a pod and the replacement its controller creates have in common.

    Controller-owned: namespace, the controller's uid and the template's hash label. A copy
    cfnet made of a bare pod: the ``cfnet.io/replaces`` annotation naming the original.
    """
    md = pod.get("metadata") or {}
    ns = str(md.get("namespace", "default"))
    for o in md.get("ownerReferences") or []:
        if o.get("controller"):
            lab = md.get("labels") or {}
            tpl = lab.get("pod-template-hash") or lab.get("controller-revision-hash") or ""
            return ("owner", ns, str(o.get("uid")), str(tpl))
    rep = (md.get("annotations") or {}).get(REPLACES)
    return ("copy", ns, str(rep)) if rep else None


@dataclass(frozen=True)
class EngineOutcome:
    """What the engine decided for one batch: validated bindings and reasons for the rest."""

    assignments: dict[str, str]  # workload uid → node
    failures: dict[str, str]  # workload uid → FailedScheduling message
    violations: dict[str, list[str]]  # workload uid → validator complaints about a binding


def run_engine(snapshot: ClusterSnapshot, workloads: Sequence[Workload],
               config: Any = None) -> EngineOutcome:
    """Place a batch and validate the result (pool planning), with the loop's own
    engine + validator (``loop.place_checked``)."""
    c = place_checked(snapshot, workloads, config)
    return EngineOutcome(c.assignments, c.failures, c.violations)


def parse_workload(pod: Mapping[str, Any]) -> Workload:
    """A pod as the engine's ``Workload`` (raises ``SpecError``)."""
    from cloud_core.placement import parse_pod

    return parse_pod(pod)


@dataclass
class ActuatorConfig:
    """Knobs of the scheduling loop."""

    scheduler_name: str = SCHEDULER_NAME
    batch_wait_s: float = 0.3  # gather arrivals this long before placing a batch
    max_batch: int = 1000
    # The first batch is smaller: its bindings go out while the next, full one is decided
    # (deciding has a fixed cost per batch: one snapshot over every node and pod).
    first_batch: int = 100
    bind_workers: int = 24  # concurrent pods/binding calls (keep-alive connections)
    retry_unschedulable_s: float = 30.0
    # pods tried before, at most this many a batch (queue.py pop_batch): a flush of many
    # distinct unschedulable pods is taken in short batches, not one long one
    max_retries_per_batch: int = 100
    unavailable_backoff_max_s: float = 5.0
    engine_config: Any = None
    identity: str = "cfnet-core"
    replan_config: Any = None
    replan_interval_s: float = 1.0
    # re-planning (a snapshot and plan_moves over every running pod) takes at most this share
    # of the loop's time: at 10,000 pods the interval stretches to a few seconds
    replan_max_share: float = 0.1


def tune_gc(young: int = 20_000) -> None:
    """Collect the young generation every ``young`` allocations instead of 700.

    A scheduler's caches hold millions of long-lived objects (10,000 pods as JSON: about
    3 million) and almost no reference cycles. With CPython's default thresholds every growth
    of the heap by a quarter triggered a full collection that walked all of them: 2.7 s of
    the 11.6 s of CPU that binding 10,000 pods at 5,000 nodes took (13 full collections);
    with 20,000, 0.7 s and none (measured with ``gc.callbacks``). Called by the entry points
    (``python -m cloud_core.k8s``, ``cfnet-core --kubernetes``), not on import.
    """
    _, second, third = gc.get_threshold()
    gc.set_threshold(young, max(second, 20), max(third, 20))
    _GC_TUNED.set()


_GC_TUNED = threading.Event()  # set by tune_gc: this process is a scheduler, its heap ours


def settle_listed() -> None:
    """After a listed page entered the caches: its objects live until their next version,
    so move the heap out of the cycle collector's generations (``gc.freeze``). The
    collections the list itself triggers then no longer rescan every object listed before
    it: decoding the 10,000 pods of a backlog took 0.19-0.35 s with them and 0.12 s
    without (22 MB, measured). API objects are JSON trees (no cycles): a frozen one is
    still freed by its reference count when the cache lets it go; what the freeze can keep
    is the odd cycle another thread created just then, once per page of a (re)list.
    Only in a process ``tune_gc`` was called in (the entry points), never in a library
    caller's heap.
    """
    if _GC_TUNED.is_set():
        gc.freeze()


class _Bound(NamedTuple):
    """A bound pod as the snapshot counts it, kept per pod uid while its version holds."""

    rv: Any
    node: str
    key: str  # namespace/name
    live: bool  # not Succeeded/Failed: counts on its node
    pod: RunningPod
    own: Workload | None  # cfnet's own, live, not being deleted: the re-planner may move it


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
    moves: int = 0
    evictions_blocked: int = 0
    pinned_bound: int = 0
    uncountable: int = 0  # bound pods whose requests cfnet clamped (RequestsUncountable)
    bound_pods: deque[str] = field(default_factory=lambda: deque(maxlen=100_000))
    # FailedScheduling per namespace: what a tenant's (or a test's) own pods met, apart from
    # the other namespaces' backlogs in the same count
    failed_by_namespace: Counter[str] = field(default_factory=Counter)


def _assumed_pod(key: str, node: str, w: Workload | None) -> RunningPod | None:
    """A binding made but not seen yet, as the snapshot counts it (built once, not per step)."""
    if w is None:
        return None
    ns, _, name = key.partition("/")
    return RunningPod.of(w, node, name=name, namespace=ns)


def _with_agent(n: NodeInfo, agent: Health | None) -> NodeInfo:
    """``n`` with its health as the Node's condition and its agent's verdict make it (the
    same object when nothing changes: the engine's per-node caches keep)."""
    h = combined_health(n.health, agent)
    return n if h is n.health else dataclasses.replace(n, health=h)


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


class Actuator:
    """Watches pods and nodes, and (while ``is_leader()``) binds pending cfnet pods."""

    def __init__(self, client: KubeClient, registry: NodeRegistry | None = None,
                 config: ActuatorConfig | None = None, *,
                 is_leader: Callable[[], bool] = lambda: True,
                 on_alert: Callable[[dict[str, Any]], None] | None = None,
                 on_bound: Callable[[str, str], None] | None = None,
                 links: Callable[[], Mapping[tuple[str, str], Any]] | None = None,
                 events: EventLog | None = None,
                 agent_health: Callable[[], Mapping[str, Health]] | None = None) -> None:
        self.client = client
        self.registry = registry or NodeRegistry()
        self.config = config or ActuatorConfig()
        self.is_leader = is_leader
        self.on_alert = on_alert
        self.on_bound = on_bound
        self.links = links or (lambda: {})
        # Node name -> its agent's verdict (heartbeats, will, peers' links: cloud_core.health),
        # combined with the Node's Ready condition by health.combined_health
        self.agent_health = agent_health
        self.stats = ActuatorStats()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        # pod key → (node, when, the pod as the snapshot counts it): bindings made, not seen yet
        self._assumed: dict[str, tuple[str, float, RunningPod | None]] = {}
        # activeQ / backoffQ / unschedulable pods with queueing hints, fair across
        # namespaces (queue.py); called under ``_lock``
        self.queue = SchedulingQueue(max_unschedulable_s=self.config.retry_unschedulable_s)
        self._last_failure: dict[str, str] = {}  # pod uid → last FailedScheduling message
        self._workloads: dict[str, Workload | None] = {}  # pod uid → parsed workload
        self._parser = PodParser()  # the loop thread's: a controller's pods parsed once
        # What the snapshot counts, kept by the pod handler (_count_bound): pod uid → its
        # entry while bound; the keys of bound pods; live pods by uid; cfnet's own live pods;
        # per node, the requests of its live pods [cpu, memory, GPUs, pods].
        self._running_cache: dict[str, _Bound] = {}
        self._bound_keys: set[str] = set()
        self._live: dict[str, RunningPod] = {}
        self._own: dict[str, tuple[JSON, Workload, str]] = {}
        self._usage: dict[str, list[int]] = {}
        # pod key → pod, of the pods is_pending() holds for (kept by the pod handler, so a
        # step looks at the backlog, not at every pod of the cluster)
        self._pending: dict[str, JSON] = {}
        self._batches = 0  # steps that had pending pods to place
        self._generation = 0  # bumped on every cluster change that may free room
        self._pending_changes: list[LabelChange] = []  # not yet handed to the loop
        self._changes: dict[str, list[LabelChange]] = {}  # node -> its changes, for alerts
        self._alerted: set[str] = set()  # pod uids already reported as violating
        self._uncountable_warned: set[str] = set()  # pod uids told RequestsUncountable
        # A move's destination per replacement key: [(node, moved pod uid, expiry)].
        self._reserved: dict[tuple[str, ...], list[tuple[str, str, float]]] = {}
        self._obs_pods: dict[str, JSON] = {}  # uid -> pod, of the step being decided
        self._obs_gen = 0  # the cluster generation that step saw
        self._more = False
        self._binding = 0  # bindings submitted and not yet done
        self.loop = DecisionLoop(
            self, self, events or EventLog(lambda ev: None),
            engine_config=self.config.engine_config, replan_config=self.config.replan_config,
            replan_interval_s=self.config.replan_interval_s,
            replan_max_share=self.config.replan_max_share)
        self._pool = ThreadPoolExecutor(self.config.bind_workers, thread_name_prefix="bind")
        # The pods already on a node are listed first: with them and the nodes the engine can
        # decide, so the first bindings go out while the backlog's pages still arrive. Those
        # pages are asked for once the nodes are in: nothing can be placed before, and until
        # then they only compete with the node list for the interpreter.
        self.nodes = Reflector(client, "/api/v1/nodes", self._on_node, name="nodes",
                               after_page=settle_listed)
        self.pods = Reflector(client, "/api/v1/pods", self._on_pod, name="pods",
                              prime={"fieldSelector": "spec.nodeName!="},
                              pages_after=self.nodes.synced, after_page=settle_listed)
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
        """Both caches hold a whole list."""
        return self.pods.synced.wait(timeout) and self.nodes.synced.wait(timeout)

    def wait_ready(self, timeout: float = 30.0) -> bool:
        """Enough to decide: every node, and every pod already bound to one (the pending
        pods may still be arriving)."""
        return self.nodes.synced.wait(timeout) and self.pods.ready.wait(timeout)

    # -- cache handlers ------------------------------------------------------------------------
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

    def snapshot(self, exclude: frozenset[str] = frozenset()) -> ClusterSnapshot:
        """Registry nodes + running pods (+ assumed bindings) as the engine's snapshot.

        Pods whose uid is in ``exclude`` are left out (to re-validate them).
        """
        return self._scan(exclude)[0]

    def _scan(self, exclude: frozenset[str] = frozenset()
              ) -> tuple[ClusterSnapshot, list[tuple[JSON, Workload, str]]]:
        """The snapshot (the pod handler's sums per node, plus the assumed bindings the
        watch has not delivered yet), and cfnet's own bound, live pods. One consistent
        view: the handler updates the sums and spends an assumption under the same lock."""
        with self._lock:
            usage = {n: a[:3] for n, a in self._usage.items()}
            running = list(self._live.values())
            own = list(self._own.values())
            assumed = [(k, v) for k, v in self._assumed.items() if k not in self._bound_keys]
            gone = [self._running_cache[u] for u in exclude if u in self._live]
        for b in gone:  # left out to be re-validated
            _accumulate(usage[b.node], b.pod.requests, -1)
        if gone:
            running = [p for p in running if p.uid not in exclude]
            own = [o for o in own if o[1].uid not in exclude]
        for _, (node, _, rp) in assumed:
            if rp is not None:
                running.append(rp)
                _accumulate(usage.setdefault(node, [0, 0, 0]), rp.requests, 1)
        # a node's sum past what cfnet counts (pods of other schedulers asking for more than
        # any node has) is that much: the node is full, and no int64 sum overflows
        allocated = {n: bounded_resources(Resources(*a)) for n, a in usage.items()}
        nodes = self.registry.node_infos(allocated)
        agents = self.agent_health() if self.agent_health is not None else None
        if agents:
            nodes = tuple(_with_agent(n, agents.get(n.name)) for n in nodes)
        snap = ClusterSnapshot(nodes=nodes, links=dict(self.links()), now=time.time(),
                               pods=tuple(running))
        return snap, own

    def _bound_entry(self, pod: JSON, node: str, rv: Any) -> _Bound:
        spec = pod.get("spec") or {}
        md = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        live = phase not in ("Succeeded", "Failed")
        w = self._workload(pod)
        # the re-planner's candidates: cfnet's own live pods that may be evicted (never a
        # DaemonSet, mirror/static, system-critical, kube-system or local-storage pod)
        mine = (live and spec.get("schedulerName") == self.config.scheduler_name
                and not md.get("deletionTimestamp") and exclusion(pod) is None)
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

    def _work_waiting(self) -> bool:
        """Whether a step has anything to do besides re-planning: pods to place, a cluster
        change since the last step, a binding error to report."""
        now = time.monotonic()
        with self._lock:
            gen = self._generation
            return (self._bind_error is not None or gen != self._obs_gen
                    or self.queue.has_active(now))

    def pending(self) -> list[JSON]:
        """The next batch from the scheduling queue (fair across namespaces; see queue.py).
        The pods stay in flight until the step reports them placed or not."""
        now = time.monotonic()
        with self._lock:
            keys = self.queue.pop_batch(self._batch_limit(), now,
                                        self.config.max_retries_per_batch)
            out = []
            for k in keys:
                pod = self._pending.get(k)
                if pod is None or k in self._assumed:
                    self.queue.remove(k)
                else:
                    out.append(pod)
        return out

    def _batch_limit(self) -> int:
        return self.config.max_batch if self._batches else min(self.config.first_batch,
                                                                 self.config.max_batch)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        backoff = 0.2
        more = True  # at start-up, what is pending has waited long enough: no gathering
        while not self._stop.is_set() and not self.wait_ready(timeout=0.5):
            pass
        while not self._stop.is_set():
            self._wake.wait(timeout=1.0)
            if self._stop.is_set():
                return
            self._wake.clear()
            if not self.is_leader():
                continue
            # A backlog needs no gathering (its next batch is already there), nor do pods
            # still coming in by the page of the first list, nor anything before the first
            # batch (what is pending at start-up has waited long enough).
            if not more and self._batches and self.pods.synced.is_set():
                self._stop.wait(self.config.batch_wait_s)  # let a burst of arrivals gather
            more = False
            try:
                if not self._work_waiting() and not self.loop.replan_due():
                    continue  # nothing to place, nothing changed, no re-plan due: no snapshot
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
        """One step of the decision loop; True when pending pods are left for another."""
        err, self._bind_error = self._bind_error, None
        if err is not None:
            raise err  # a binding of the last batch found the API server gone: back off
        self._more = False
        self.loop.step()
        return self._more

    # -- SourceOfTruth -------------------------------------------------------------------------
    def observe(self) -> Observation:
        with self._lock:
            gen = self._generation
        limit = self._batch_limit()
        pods = self.pending()
        self._more = len(pods) >= limit
        self._batches += bool(pods)
        obs_pods: dict[str, JSON] = {}
        pending: list[Workload] = []
        invalid: dict[str, str] = {}
        for pod in pods:
            uid = str((pod.get("metadata") or {}).get("uid"))
            obs_pods[uid] = pod
            try:
                w = self._parser.parse(pod)
            except SpecError as e:
                invalid[uid] = f"invalid workload spec: {e}"
                continue
            pending.append(w)
            with self._lock:
                self._workloads[uid] = w
        snap, own = self._scan()
        running = []
        for pod, w, node in own:
            obs_pods[w.uid] = pod
            running.append((w, node))
        pinned = self._pinned(pending, obs_pods)
        # the loop's health map: a cordoned node is alive (its pods stay)
        health = {n.name: Health.ONLINE if n.health is Health.CORDONED else n.health
                  for n in snap.nodes}
        with self._lock:
            changes, self._pending_changes = self._pending_changes, []
            revalidate: dict[str, str] = {}
            for c in changes:
                kept = self._changes.setdefault(c.node, [])
                kept.append(c)
                del kept[:-8]  # what an alert names: the latest few changes of the node
                what = f"{c.key}: {c.old} -> {c.new}"
                revalidate[c.node] = f"{revalidate[c.node]}, {what}" \
                    if c.node in revalidate else what
        self._obs_pods = obs_pods
        self._obs_gen = gen
        return Observation(health=health, snapshot=snap, pending=pending, running=running,
                           invalid=invalid, pinned=pinned,
                           # more than the binding workers take at once still queued:
                           # the end of a burst is still on its way out
                           backlog=(self._more or not self.pods.synced.is_set()
                                    or self._binding > self.config.bind_workers),
                           revalidate=revalidate)

    def _pinned(self, pending: list[Workload], pods: Mapping[str, JSON]
                ) -> dict[str, tuple[str, str]]:
        now = time.monotonic()
        out: dict[str, tuple[str, str]] = {}
        with self._lock:
            for k in [k for k, v in self._reserved.items() if all(e < now for *_, e in v)]:
                del self._reserved[k]
            taken: dict[tuple[str, ...], int] = {}
            for w in pending:
                key = replacement_key(pods[w.uid])
                slots = [r for r in self._reserved.get(key, []) if r[2] >= now] if key else []
                i = taken.get(key, 0) if key else 0
                if key and i < len(slots):
                    out[w.uid] = (slots[i][0], slots[i][1])
                    taken[key] = i + 1
                    continue
                # A copy a leader made for a move it did not live to finish: the plan is in
                # the copy itself (a new leader has no reservation in memory)
                ann = (pods[w.uid].get("metadata") or {}).get("annotations") or {}
                planned = ann.get(PLANNED_NODE)
                if planned and ann.get(REPLACES):
                    out[w.uid] = (str(planned), str(ann.get(PLANNED_FROM, "")))
        return out

    # -- StepActuator --------------------------------------------------------------------------
    def commit_placements(self, obs: Observation, outcome: PlaceOutcome) -> int:
        gen = self._obs_gen
        for uid, msg in obs.invalid.items():
            self._unschedulable_now(self._obs_pods[uid], gen, msg)
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
        todo = [(self._obs_pods[u], node, wl[u]) for u, node in outcome.assignments.items()
                if u in self._obs_pods and u in wl]
        with self._lock:
            for pod, node, w in todo:
                key = obj_key(pod)
                self._assumed[key] = (node, now, _assumed_pod(key, node, w))
                self.queue.remove(key)  # assumed: back in only if its binding fails
            self._binding += len(todo)
        for pod, node, w in todo:
            self._pool.submit(self._bind, pod, node, w, outcome.summaries.get(w.uid, ""),
                              w.uid in obs.pinned)
        for u, msg in outcome.failures.items():
            if u in self._obs_pods:
                g = wl[u].gang if u in wl else None
                if g is not None and f"gang {g}" not in msg:
                    msg = f"gang {g}: {msg}"  # say which gang (namespace/name) waits
                self._unschedulable_now(self._obs_pods[u], gen, msg)
        # A pinned replacement takes its reservation now: its binding is assumed, and a
        # failed one is placed again by a later step like any pending pod.
        for u in outcome.assignments:
            if u in obs.pinned:
                self._consume_reservation(self._obs_pods.get(u), obs.pinned[u][1])
        return len(todo)

    def _consume_reservation(self, pod: JSON | None, moved_uid: str) -> None:
        key = replacement_key(pod) if pod is not None else None
        with self._lock:
            if key in self._reserved:
                self._reserved[key] = [r for r in self._reserved[key] if r[1] != moved_uid]
                if not self._reserved[key]:
                    del self._reserved[key]

    def apply(self) -> int:
        return 0  # a binding takes effect when it is made (commit_placements)

    def commit_moves(self, obs: Observation, moves: Sequence[Move]) -> list[Move]:
        if not self.is_leader():
            return []
        done = []
        for m in moves:
            pod = self._obs_pods.get(m.workload_uid)
            if pod is None:
                continue
            try:
                if self._move(pod, m):
                    done.append(m)
            except KubeNotFound:
                continue  # gone meanwhile
            except KubeError as err:
                log.info("moving %s failed, will retry: %s", obj_key(pod), err)
        return done

    def _move(self, pod: JSON, m: Move) -> bool:
        key = obj_key(pod)
        rkey = replacement_key(pod)
        bare = unowned(pod)
        if bare:  # evicted, it would be gone: cfnet creates no pods (k8s/evict.py)
            self.client.record_event(pod, reason="NotMoved", event_type="Warning",
                                     instance=self.config.identity, message=f"cfnet would move "
                                     f"{key} from {m.src} to {m.dst} ({m.reason}), but {bare}")
            return False
        slot = (m.dst, m.workload_uid, time.monotonic() + RESERVATION_TTL_S)
        assert rkey is not None
        with self._lock:  # before evicting: the replacement may appear at once
            self._reserved.setdefault(rkey, []).append(slot)
        if not self._replace(pod, m):
            with self._lock:
                left = [r for r in self._reserved.get(rkey, []) if r != slot]
                if left:
                    self._reserved[rkey] = left
                else:
                    self._reserved.pop(rkey, None)
            self._count("evictions_blocked")
            self._event(pod, "EvictionBlocked", "Warning",
                        f"cfnet would move {key} from {m.src} to {m.dst} ({m.reason}), but a "
                        "PodDisruptionBudget refused the eviction; will retry")
            return False
        self._count("moves")
        self._event(pod, "Rescheduling", "Warning",
                    f"cfnet moves {key} from {m.src} to {m.dst}: {m.reason}")
        return True

    def _event(self, pod: JSON, reason: str, event_type: str, message: str) -> None:
        try:
            self.client.emit_event(pod, reason=reason, message=message, event_type=event_type,
                                   instance=self.config.identity)
        except KubeError as err:
            log.warning("%s event for %s lost: %s", reason, obj_key(pod), err)

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

    # -- residency / security re-validation ----------------------------------------------------
    def report_misfits(self, obs: Observation,
                       misfits: Mapping[str, tuple[str, list[str]]]) -> None:
        """The loop found running pods that no longer fit their changed node: an alert each
        (``on_alert`` and a ``ConstraintViolated`` Warning event) before the re-planner moves
        them (its ``Rescheduling`` event, eviction, the replacement bound where it planned)."""
        for uid, (node, problems) in misfits.items():
            pod = self._obs_pods.get(uid)
            if pod is not None and uid not in self._alerted:
                with self._lock:
                    changes = list(self._changes.get(node, ()))
                self._alert(pod, node, problems, changes)

    def _alert(self, pod: JSON, node: str, problems: list[str],
               changes: list[LabelChange]) -> None:
        key = obj_key(pod)
        self._alerted.add(str((pod.get("metadata") or {}).get("uid")))
        what = ", ".join(f"{c.key}: {c.old} -> {c.new}" for c in changes)
        msg = f"node {node} changed ({what}); pod no longer fits: {'; '.join(problems)}"
        self._count("alerts")
        alert = {"kind": "constraint-violation", "pod": key, "node": node, "problems": problems,
                 "changes": [c.__dict__ for c in changes], "message": msg}
        if self.on_alert is not None:
            self.on_alert(alert)
        try:
            self.client.emit_event(pod, reason="ConstraintViolated", message=msg,
                                   event_type="Warning", instance=self.config.identity)
        except KubeError as err:
            log.warning("alert event for %s lost: %s", key, err)

    def _replace(self, pod: JSON, m: Move) -> bool:
        """Evict ``pod`` (False: a disruption budget refused); for a bare pod, create its
        unbound replacement (idempotent)."""
        md = pod.get("metadata") or {}
        key = obj_key(pod)
        ns, name = str(md.get("namespace")), str(md.get("name"))
        if not self.client.evict_pod(ns, name, str(md.get("uid") or "") or None):
            return False
        if any(o.get("controller") for o in md.get("ownerReferences") or []):
            self._count("replaced")  # its controller recreates it pending; we place that one
            return True
        live = self.client.list(f"/api/v1/namespaces/{ns}/pods")[0]
        if any((p["metadata"].get("annotations") or {}).get(REPLACES) == key for p in live):
            return True  # an earlier round created it
        clone = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{name.split('--')[0]}--", "namespace": ns,
                         "labels": dict(md.get("labels") or {}),
                         # the move's plan travels with the copy: a new leader reads it
                         "annotations": {**(md.get("annotations") or {}), REPLACES: key,
                                         PLANNED_NODE: m.dst,
                                         PLANNED_FROM: str(md.get("uid") or "")}},
            "spec": {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"},
        }
        self.client.create(f"/api/v1/namespaces/{ns}/pods", clone)
        self._count("replaced")
        return True
