"""Kubernetes mode of the decision loop: informers in, ``pods/binding`` and evictions out.

Two reflectors (pods, nodes) keep local caches on every replica; only the leader acts. The
loop's :class:`~cloud_core.loop.SourceOfTruth` is ``source.py`` (the pending pods whose
``schedulerName`` is ``cfnet-scheduler``, the bound ones, and a ``ClusterSnapshot`` from the
Node registry, the running pods and the agents' measured links); its
:class:`~cloud_core.loop.StepActuator` is :class:`Effects`: ``binder.py`` binds each placed
pod through ``pods/binding`` with a UID precondition (``Scheduled`` / ``FailedScheduling``
events), ``moves.py`` carries out moves. Placing, validating and re-planning are
:class:`cloud_core.loop.DecisionLoop`'s, the same code as in local mode. Bound-but-not-yet-
observed pods are assumed in the scheduler cache (``cache.py``) so the next batch counts them.

Re-placement: when the loop moves a running pod (latency SLA broken for enough intervals, node
down), the pod is evicted through the Eviction API (PodDisruptionBudgets honoured) with a
``Rescheduling`` event; the destination is reserved for the replacement its controller
creates (``moves.py``). A label change of a node goes to the loop in the next
``Observation`` (``revalidate``); a running pod that no longer fits raises an alert and is
moved like any other move.

Failure handling: a 409 on bind means the pod is already bound or was replaced; the pod is
re-read and never bound twice. An unreachable API server leaves pods pending and retries with
backoff; the reflectors resume or relist (410) on their own. Pending pods wait in a
scheduling queue like kube-scheduler's (``queue.py``, ``pending.py``).

The parts, each its own object built once in ``wiring.build_actuator``: ``cache.py`` (bound
pods' sums, assumed pods), ``pending.py`` + ``queue.py`` (the scheduling queue),
``handlers.py`` (the informers' handlers), ``workloads.py`` (the parse cache),
``source.py``, ``binder.py``, ``moves.py``. :class:`Actuator` is the thin facade the callers
hold: the thread that runs the loop, and what the console, the pool controller and the
entry points read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cloud_core.errors import KubeUnavailable
from cloud_core.k8s.binder import Binder
from cloud_core.k8s.cache import SchedulerCache
from cloud_core.k8s.client import JSON
from cloud_core.k8s.config import SCHEDULER_NAME, ActuatorConfig, ActuatorStats
from cloud_core.k8s.gc_tuning import settle_listed, tune_gc
from cloud_core.k8s.handlers import EventHandlers
from cloud_core.k8s.informer import Reflector
from cloud_core.k8s.moves import (
    PLANNED_FROM,
    PLANNED_NODE,
    REPLACES,
    RESERVATION_TTL_S,
    Moves,
    replacement_key,
)
from cloud_core.k8s.pending import PendingPods
from cloud_core.k8s.queue import SchedulingQueue
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.k8s.source import Source
from cloud_core.k8s.workloads import Workloads, parse_workload
from cloud_core.loop import DecisionLoop, Move, Observation, PlaceOutcome
from cloud_core.placement.model import ClusterSnapshot, Workload
from cloud_core.placement.quality import BatchQuality

__all__ = ["PLANNED_FROM", "PLANNED_NODE", "REPLACES", "RESERVATION_TTL_S", "SCHEDULER_NAME",
           "Actuator", "ActuatorConfig", "ActuatorStats", "Effects", "Parts",
           "parse_workload", "replacement_key", "settle_listed", "tune_gc"]

log = logging.getLogger(__name__)


class Effects:
    """The loop's :class:`~cloud_core.loop.StepActuator`: placements to the binder, moves
    and misfits to the moves."""

    def __init__(self, binder: Binder, moves: Moves) -> None:
        self._binder = binder
        self._moves = moves

    def commit_placements(self, obs: Observation, outcome: PlaceOutcome) -> int:
        return self._binder.commit_placements(obs, outcome)

    def apply(self) -> int:
        return self._binder.apply()

    def commit_moves(self, obs: Observation, moves: Sequence[Move]) -> list[Move]:
        return self._moves.commit_moves(obs, moves)

    def requeue(self, stranded: Sequence[tuple[Workload, str]]) -> int:
        return self._binder.requeue(stranded)

    def report_misfits(self, obs: Observation,
                       misfits: Mapping[str, tuple[str, list[str]]]) -> None:
        self._moves.report_misfits(obs, misfits)


@dataclass(frozen=True)
class Parts:
    """The parts an :class:`Actuator` runs (``wiring.build_actuator`` builds them)."""

    config: ActuatorConfig
    stats: ActuatorStats
    is_leader: Callable[[], bool]
    registry: NodeRegistry
    cache: SchedulerCache
    pending: PendingPods
    workloads: Workloads
    handlers: EventHandlers
    source: Source
    binder: Binder
    moves: Moves
    loop: DecisionLoop
    nodes: Reflector
    pods: Reflector
    wake: threading.Event  # set: look for work now
    pages_go: threading.Event  # the pods' list pages go on (closed while a first batch is decided)


class Actuator:
    """Watches pods and nodes, and (while the leader) binds pending cfnet pods: the thread
    that runs the loop over the parts, and what callers read of them."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.config = parts.config
        self.stats = parts.stats
        self.is_leader = parts.is_leader
        self.registry = parts.registry
        self.cache = parts.cache
        self.binder = parts.binder
        self.moves = parts.moves
        self.handlers = parts.handlers
        self.source = parts.source
        self.loop = parts.loop
        self.nodes = parts.nodes
        self.pods = parts.pods
        self.pages_go = parts.pages_go
        self._pending = parts.pending
        self._wake = parts.wake
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def queue(self) -> SchedulingQueue:
        """The scheduling queue (for its stats: changes go through the pending pods)."""
        return self._pending.queue

    # -- what callers read -------------------------------------------------------------------
    def snapshot(self, exclude: frozenset[str] = frozenset()) -> ClusterSnapshot:
        return self.source.snapshot(exclude)

    def observe(self) -> Observation:
        return self.source.observe()

    def parse(self, pod: JSON) -> Workload | None:
        """``pod`` as the engine's Workload (cached per uid); None when it cannot be read."""
        return self.parts.workloads.parse(pod)

    def last_failure(self, uid: str) -> str | None:
        """The last FailedScheduling message for pod ``uid`` (None: none, or placed)."""
        return self.binder.last_failure(uid)

    def batch_of(self, uid: str) -> BatchQuality | None:
        """The cost, bound and gap of the batch that placed pod ``uid`` (None: not placed
        by this replica since it started)."""
        return self.binder.quality.get(uid)

    def node_changed(self, node: JSON) -> None:
        """A Node the core itself just wrote (a cordon): take it in now, not at the watch."""
        self.handlers.node_changed(node)

    def forget_moves(self) -> None:
        """Leadership taken or lost: the planned moves are read back at the next step."""
        self.moves.forget_moves()

    # -- the loop's thread -------------------------------------------------------------------
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
        self.binder.close()

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
        return (self.binder.in_flight() > 0 or not self.pods.synced.is_set()
                or self._pending.has_in_flight()
                or self._pending.has_active(time.monotonic()))

    def run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set() and not self.wait_ready(timeout=0.5):
            self.registry.say_problems()
        while not self._stop.is_set():
            # Asleep until something arrives or the next re-plan is due (at most 1 s): a
            # fixed 1 s sleep made re-plans 1.3 s apart, so an SLA breach that needs two
            # strikes waited 2.6 s for its move (bench_reaction_k8s).
            self._wake.wait(timeout=min(1.0, max(0.05, self.loop.replan_in())))
            if self._stop.is_set():
                return
            self._wake.clear()
            self.registry.say_problems()
            if not self.is_leader():
                continue
            # No gathering: a step takes what the queue holds when it starts. A pod that
            # arrives alone is decided and bound at once; the pods that arrive while a step
            # is decided are the next step's batch, so a burst batches by itself (the batch
            # follows the queue, not a clock).
            try:
                if not self.source.work_waiting() and (
                        not self.loop.replan_wanted()
                        or (self.source.backlog() and self.loop.defer_replan())):
                    # nothing to place, nothing changed, no re-plan due (or one a backlog
                    # still defers, as the step would find): no snapshot
                    continue
                if self.schedule_once():
                    self._wake.set()
                backoff = 0.2
            except KubeUnavailable as e:
                self.stats.add("unavailable")
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
        err = self.binder.take_error()
        if err is not None:
            raise err  # a binding of the last batch found the API server gone: back off
        self.cache.cleanup_expired(time.monotonic())
        self.source.more = False
        if not self.source.batches:
            self.pages_go.clear()  # opened again once its bindings are out (binder.py)
        try:
            self.loop.step()
        finally:
            self.pages_go.set()
        return self.source.more
