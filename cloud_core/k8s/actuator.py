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

The code is split by responsibility (``actuator_state.py`` declares what the parts share):
``podcache.py`` (informer handlers, pod cache, sums per node), ``queue.py`` (the scheduling
queue), ``source.py`` (``observe``: the loop's source of truth), ``binder.py`` (binding and
its events), ``moves.py`` (evictions, reservations, copies, alerts), ``gc_tuning.py``; this
file holds the configuration, the counters and the thread that runs the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cloud_core.errors import KubeUnavailable
from cloud_core.events import EventLog
from cloud_core.k8s import objects
from cloud_core.k8s.binder import Binder
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.evict import DEFAULT_POLICY, EvictionPolicy
from cloud_core.k8s.gc_tuning import _GC_TUNED, settle_listed, tune_gc
from cloud_core.k8s.informer import Reflector
from cloud_core.k8s.ledger import MoveLedger
from cloud_core.k8s.moves import (
    PLANNED_FROM,
    PLANNED_NODE,
    REPLACES,
    RESERVATION_TTL_S,
    Moves,
    replacement_key,
)
from cloud_core.k8s.podcache import PodCache, _Bound, parse_workload
from cloud_core.k8s.prefetch import (
    BOUND_PODS,
    NODES_PATH,
    PAGE_SIZE,
    PODS_PATH,
    FirstLists,
)
from cloud_core.k8s.queue import SchedulingQueue
from cloud_core.k8s.registry import LabelChange, NodeRegistry
from cloud_core.k8s.source import Source
from cloud_core.loop import DecisionLoop
from cloud_core.placement.model import Health, RunningPod, Workload
from cloud_core.placement.spec import SCHEDULER_NAME as PARSER_SCHEDULER
from cloud_core.placement.spec import PodParser

__all__ = ["PLANNED_FROM", "PLANNED_NODE", "REPLACES", "RESERVATION_TTL_S", "SCHEDULER_NAME",
           "_GC_TUNED", "Actuator", "ActuatorConfig", "ActuatorStats",
           "parse_workload", "replacement_key", "settle_listed", "tune_gc"]

log = logging.getLogger(__name__)

SCHEDULER_NAME = "cfnet-scheduler"


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
    # an event per decided placement (the loop's "uid -> node: why"); cfnet-core turns it
    # off: its event per binding made ("ns/pod bound to node: why", wiring.py) says the same
    # a moment later, and each event is logged and published (half the events of a burst)
    placement_events: bool = True
    # what is never evicted, for a move or the console's drain (k8s/evict.py; the chart's
    # core.eviction.excludeNamespaces is its excluded_namespaces)
    eviction: EvictionPolicy = DEFAULT_POLICY


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
    moves_unrecorded: int = 0  # moves not made: their reservation could not go on the Lease
    moves_restored: int = 0  # times planned moves of an earlier leader were read back
    pinned_bound: int = 0
    uncountable: int = 0  # bound pods whose requests cfnet clamped (RequestsUncountable)
    bound_pods: deque[str] = field(default_factory=lambda: deque(maxlen=100_000))
    # FailedScheduling per namespace: what a tenant's (or a test's) own pods met, apart from
    # the other namespaces' backlogs in the same count
    failed_by_namespace: Counter[str] = field(default_factory=Counter)



class Actuator(PodCache, Source, Binder, Moves):
    """Watches pods and nodes, and (while ``is_leader()``) binds pending cfnet pods."""

    def __init__(self, client: KubeClient, registry: NodeRegistry | None = None,
                 config: ActuatorConfig | None = None, *,
                 is_leader: Callable[[], bool] = lambda: True,
                 on_alert: Callable[[dict[str, Any]], None] | None = None,
                 on_bound: Callable[[str, str], None] | None = None,
                 links: Callable[[], Mapping[tuple[str, str], Any]] | None = None,
                 events: EventLog | None = None,
                 agent_health: Callable[[], Mapping[str, Health]] | None = None,
                 first: FirstLists | None = None) -> None:
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
        # ... also on the leader's Lease when set (wiring.py), read back on leading (moves.py)
        self.ledger: MoveLedger | None = None
        self._restore_due = True
        self._forget_due = False
        self._obs_gen = 0  # the cluster generation that step saw
        self._more = False
        self._binding = 0  # bindings submitted and not yet done
        self.loop = DecisionLoop(
            self, self, events or EventLog(lambda ev: None),
            engine_config=self.config.engine_config, replan_config=self.config.replan_config,
            replan_interval_s=self.config.replan_interval_s,
            replan_max_share=self.config.replan_max_share,
            report_assignments=self.config.placement_events)
        self._pool = ThreadPoolExecutor(self.config.bind_workers, thread_name_prefix="bind")
        # The pods already on a node are listed first: with them and the nodes the engine can
        # decide, so the first bindings go out while the backlog's pages still arrive. Those
        # pages are asked for once the nodes are in: nothing can be placed before, and until
        # then they only compete with the node list for the interpreter.
        # Decoded into what cfnet reads of them (objects.py): the rest is most of the bytes.
        # A pod's spec is whole when this scheduler places it, or when the spec parser
        # would read past its schedulerName (which refuses any other).
        # ``first``: these lists, asked for at the process start (prefetch.FirstLists);
        # each reflector takes its own if it was asked as the reflector would ask.
        self.nodes = Reflector(client, NODES_PATH, self._on_node, name="nodes",
                               after_page=settle_listed, schema=objects.NODE,
                               page_size=PAGE_SIZE,
                               first=first.nodes if first is not None else None)
        # Open but while the first batch is decided (schedule_once): the backlog's later
        # pages would only compete with it for the interpreter (first binding at 5,000
        # nodes / 10,000 pods: 20 pages of 500, ~40 ms each to decode and handle)
        self._pages_go = threading.Event()
        self._pages_go.set()
        self.pods = Reflector(client, PODS_PATH, self._on_pod, name="pods",
                              # the spec parser's own name (not prefetch's copy of it): a
                              # first list asked with another is not taken
                              schema=objects.PodSchema(frozenset(
                                  {self.config.scheduler_name, PARSER_SCHEDULER})),
                              prime=dict(BOUND_PODS), page_size=PAGE_SIZE,
                              pages_after=self.nodes.synced, after_page=settle_listed,
                              first=first.pods if first is not None else None,
                              first_prime=first.bound_pods if first is not None else None,
                              page_gate=self._pages_go)
        self._thread: threading.Thread | None = None
        self._bind_error: KubeUnavailable | None = None  # from a binding in flight

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

    def busy(self) -> bool:
        """A burst is under way: pods to try now, pods taken by a step and not yet bound
        (a batch being decided, or its bindings in flight), or the pods' first list still
        arriving (the background CP-SAT import waits for a lull: wiring.py). Without the
        batch being decided, a burst's last batches looked like a lull: the import (0.6 s
        holding the interpreter) landed in a 10,000-pod burst."""
        with self._lock:
            return (self._binding > 0 or not self.pods.synced.is_set()
                    or self.queue.has_in_flight()
                    or self.queue.has_active(time.monotonic()))

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def run(self) -> None:
        backoff = 0.2
        more = True  # at start-up, what is pending has waited long enough: no gathering
        while not self._stop.is_set() and not self.wait_ready(timeout=0.5):
            pass
        while not self._stop.is_set():
            # Asleep until something arrives or the next re-plan is due (at most 1 s): a
            # fixed 1 s sleep plus the gathering below made re-plans 1.3 s apart, so an SLA
            # breach that needs two strikes waited 2.6 s for its move (bench_reaction_k8s).
            woken = self._wake.wait(timeout=min(1.0, max(0.05, self.loop.replan_in())))
            if self._stop.is_set():
                return
            self._wake.clear()
            if not self.is_leader():
                continue
            # A backlog needs no gathering (its next batch is already there), nor do pods
            # still coming in by the page of the first list, nor anything before the first
            # batch (what is pending at start-up has waited long enough), nor a wake-up by
            # the clock (nothing arrived to gather with).
            if woken and not more and self._batches and self.pods.synced.is_set():
                self._stop.wait(self.config.batch_wait_s)  # let a burst of arrivals gather
            more = False
            try:
                if not self._work_waiting() and (
                        not self.loop.replan_wanted()
                        or (self._backlog() and self.loop.defer_replan())):
                    # nothing to place, nothing changed, no re-plan due (or one a backlog
                    # still defers, as the step would find): no snapshot
                    continue
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
        if not self._batches:
            self._pages_go.clear()  # opened again once its bindings are out (binder.py)
        try:
            self.loop.step()
        finally:
            self._pages_go.set()
        return self._more
