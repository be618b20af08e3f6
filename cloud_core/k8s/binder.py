"""The loop's sink for placements: ``pods/binding`` and its events.

``commit_placements`` assumes each placed pod on its node in the scheduler cache
(``cache.py``: the next batch counts it before the watch shows the binding) and binds it in
the background (a pool of ``bind_workers``), with a UID precondition and a ``Scheduled``
event; a pod the engine could not place gets a ``FailedScheduling`` event and goes back to
the queue with what rejected it (with a ``ConflictReporter``, cloud_core/conflicts.py, the
event waits for cfnet's minimal conflict and nearest changes, computed on the reporter's own
thread). A step's only binding is made on the loop's own thread, at the end of
``commit_placements``: a pod that arrives alone is not handed to another thread, which on a
busy machine first waits to be scheduled and then for the interpreter; if the API server
asks it to wait (429), the binding goes to the lane, which waits as it asks. A
failed binding forgets its pod (placed again after its backoff); a 409 re-reads the pod
(never bound twice); an unreachable API server is reported at the next step
(``take_error``: back-off).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from cloud_core.conflicts import ConflictReporter
from cloud_core.errors import KubeConflict, KubeNotFound, KubeUnavailable
from cloud_core.k8s.cache import SchedulerCache
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.config import ActuatorConfig, ActuatorStats
from cloud_core.k8s.informer import obj_key
from cloud_core.k8s.pending import PendingPods
from cloud_core.loop import Observation, PlaceOutcome
from cloud_core.placement.model import Workload
from cloud_core.placement.quality import BatchQuality, QualityBook

log = logging.getLogger(__name__)


LANE_WORKERS = 4  # bindings of a step of at most this many pods: their own lane
TOO_MANY_REQUESTS = 429


class Binder:
    """Binding placed pods, and the events of a batch (see the module docstring)."""

    def __init__(self, client: KubeClient, config: ActuatorConfig, stats: ActuatorStats,
                 cache: SchedulerCache, pending: PendingPods, *,
                 is_leader: Callable[[], bool], wake: Callable[[], None],
                 consume_reservation: Callable[[JSON | None, str], None],
                 pages_go: threading.Event,
                 on_bound: Callable[[str, str], None] | None = None,
                 conflicts: ConflictReporter | None = None) -> None:
        self._client = client
        self._config = config
        self._stats = stats
        self._cache = cache
        self._pending = pending
        self._is_leader = is_leader
        self._wake = wake
        self._consume_reservation = consume_reservation  # a pinned replacement's (moves.py)
        self._pages_go = pages_go  # the pods' list goes on once the first batch is out
        self._on_bound = on_bound
        self._conflicts = conflicts  # off the binding path: the event's conflict answer
        self._pool = ThreadPoolExecutor(config.bind_workers, thread_name_prefix="bind")
        # a step of a few pods binds on a lane of its own: behind a large batch's bindings
        # in the pool (first in, first out) a pod that arrived alone waited for all of them
        # (a canary after a 339-pod batch: 3-9 s at load 9-14, tests/k8s/test_step_budget.py)
        self._lane = ThreadPoolExecutor(LANE_WORKERS, thread_name_prefix="bind-lane")
        self._lock = threading.Lock()
        self._binding = 0  # bindings submitted and not yet done
        self._error: KubeUnavailable | None = None  # from a binding in flight
        self._last_failure: dict[str, str] = {}  # pod uid -> last FailedScheduling message
        self.quality = QualityBook()  # pod uid -> the gap of the batch that placed it

    def in_flight(self) -> int:
        """Bindings submitted and not yet done."""
        with self._lock:
            return self._binding

    def has_error(self) -> bool:
        with self._lock:
            return self._error is not None

    def take_error(self) -> KubeUnavailable | None:
        """What a binding in flight met (the API server gone), once."""
        with self._lock:
            err, self._error = self._error, None
            return err

    def last_failure(self, uid: str) -> str | None:
        """The last FailedScheduling message for pod ``uid`` (None: none, or placed)."""
        with self._lock:
            return self._last_failure.get(uid)

    def forget_pod(self, uid: str) -> None:
        """Pod ``uid`` was deleted."""
        with self._lock:
            self._last_failure.pop(uid, None)
        self.quality.forget(uid)
        if self._conflicts is not None:
            self._conflicts.forget(uid)

    def unschedulable_by_constraint(self) -> dict[str, int]:
        """Unschedulable pods by the kind of each part of their conflict (a metric)."""
        return self._conflicts.counts() if self._conflicts is not None else {}

    def conflict_answers(self) -> dict[str, int]:
        """Events' conflict answers: diagnosed, skipped (queue full), failed."""
        return dict(self._conflicts.stats) if self._conflicts is not None else {}

    def close(self) -> None:
        """Wait for the bindings in flight; no more are taken."""
        self._pool.shutdown(wait=True)
        self._lane.shutdown(wait=True)
        if self._conflicts is not None:
            self._conflicts.close()

    def commit_placements(self, obs: Observation, outcome: PlaceOutcome) -> int:
        gen, pods = obs.generation, obs.objects
        for uid, msg in obs.invalid.items():
            self.unschedulable(pods[uid], gen, msg)
        if not obs.pending:
            return 0
        self._stats.add("batches")
        if not self._is_leader():
            return 0  # lost the lease while computing: the new leader redoes this batch
        wl = {w.uid: w for w in obs.pending}
        # Assume, then bind in the background (as kube-scheduler does): the next batch is
        # computed while these bind and counts them (the cache's view); a binding that fails
        # forgets its pod, and a KubeUnavailable is re-raised at the next step.
        todo = [(pods[u], node, wl[u]) for u, node in outcome.assignments.items()
                if u in pods and u in wl]
        for pod, node, w in todo:
            key = obj_key(pod)
            self._cache.assume(key, node, w)
            self._pending.taken(key)  # assumed: back in only if its binding fails
        self.quality.record([w.uid for _p, _n, w in todo],
                            BatchQuality.of(outcome.stats, time.time()))
        with self._lock:
            self._binding += len(todo)
        pool = self._lane if len(todo) <= LANE_WORKERS else self._pool
        for pod, node, w in todo if len(todo) > 1 else ():
            pool.submit(self._bind, pod, node, w, outcome.summaries.get(w.uid, ""),
                        w.uid in obs.pinned)
        self._pages_go.set()  # the first batch's bindings are out: the list may go on
        gangs = Counter(w.gang for w in obs.pending if w.gang is not None)
        for u, msg in outcome.failures.items():
            if u in pods:
                g = wl[u].gang if u in wl else None
                if g is not None and f"gang {g}" not in msg:
                    msg = f"gang {g}: {msg}"  # say which gang (namespace/name) waits
                self.unschedulable(pods[u], gen, msg, wl.get(u), gangs[g] if g else 1)
        # A pinned replacement takes its reservation now: its binding is assumed, and a
        # failed one is placed again by a later step like any pending pod.
        for u in outcome.assignments:
            if u in obs.pinned:
                self._consume_reservation(pods.get(u), obs.pinned[u][1])
        if len(todo) == 1:  # alone: bound here and now (see the module docstring)
            pod, node, w = todo[0]
            self._bind(pod, node, w, outcome.summaries.get(w.uid, ""), w.uid in obs.pinned,
                       here=True)
        return len(todo)

    def apply(self) -> int:
        return 0  # a binding takes effect when it is made (commit_placements)

    def requeue(self, stranded: Sequence[tuple[Workload, str]]) -> int:
        # On Kubernetes a pod stranded on a down node stays bound: the node lifecycle
        # controller's taint-based eviction removes it, and its controller's replacement is
        # placed as any pending pod.
        return 0

    def unschedulable(self, pod: JSON, gen: int, message: str, w: Workload | None = None,
                      gang_size: int = 1) -> None:
        """``pod`` was not placed: back to the queue with what rejected it, and a
        ``FailedScheduling`` event unless its last one said the same (so cfnet's answer in
        it is computed at most once per pod per back-off). ``w``: its workload, for that
        answer (None: its spec could not be read)."""
        md = pod.get("metadata") or {}
        uid = str(md.get("uid"))
        self._pending.failed(obj_key(pod), message, time.monotonic())
        with self._lock:
            repeat = self._last_failure.get(uid) == message
            self._last_failure[uid] = message
        if repeat:
            return
        self._stats.add("failed_scheduling")
        self._stats.failed_in(str(md.get("namespace", "")))
        if self._conflicts is not None and w is not None:
            self._conflicts.submit(pod, w, message, gang_size)  # never blocks
        else:
            self.record_failed(pod, message)

    def record_failed(self, pod: JSON, message: str) -> None:
        """Queue ``pod``'s ``FailedScheduling`` event (events.EventRecorder: never a blocking
        call per pod; repeats form a series)."""
        self._client.record_event(pod, reason="FailedScheduling", message=message,
                                  event_type="Warning", instance=self._config.identity)

    def bind(self, pod: JSON, node: str, w: Workload, why: str = "",
             pinned: bool = False) -> None:
        """Bind ``pod`` to ``node`` now, on this thread (``commit_placements`` submits this
        to the pool)."""
        with self._lock:
            self._binding += 1
        self._bind(pod, node, w, why, pinned)

    def _bind(self, pod: JSON, node: str, w: Workload, why: str = "",
              pinned: bool = False, here: bool = False) -> None:
        """``here``: on the loop's thread, a 429 handed to the lane instead of waited out."""
        handed = False
        try:
            if not self._bind_one(pod, node, w, why, pinned, wait=not here):
                # throttled: still in flight, on the lane (which waits as the server asks)
                self._lane.submit(self._bind, pod, node, w, why, pinned)
                handed = True
        finally:
            if not handed:
                with self._lock:
                    self._binding -= 1

    def _bind_one(self, pod: JSON, node: str, w: Workload, why: str, pinned: bool,
                  wait: bool = True) -> bool:
        """Bind ``pod``; False (nothing done) when the API server asked to wait and ``wait``
        is off."""
        md = pod.get("metadata") or {}
        ns, name, uid = str(md.get("namespace")), str(md.get("name")), str(md.get("uid"))
        key = f"{ns}/{name}"
        try:
            if not self._is_leader():
                raise KubeNotFound("lost the lease before binding")
            self._client.bind_pod(ns, name, uid, node, retry_after=wait)
        except BaseException as e:
            if not wait and isinstance(e, KubeUnavailable) and e.status == TOO_MANY_REQUESTS:
                return False
            self._cache.forget(key)  # placed again by a later batch
            if not isinstance(e, KubeConflict):
                self._pending.retry(key, time.monotonic())  # after its backoff
            if isinstance(e, KubeConflict):
                self._stats.add("conflicts")
                self._after_conflict(pod, w)
            elif isinstance(e, KubeUnavailable):
                with self._lock:
                    self._error = e
                self._wake()
            elif not isinstance(e, KubeNotFound):  # NotFound: deleted meanwhile
                log.warning("binding %s failed: %s", key, e)
            return True
        self._cache.finish_binding(key, time.monotonic())
        if self._conflicts is not None:
            self._conflicts.forget(uid)
        self._stats.add("bound")
        if pinned:
            self._stats.add("pinned_bound")
        self._stats.bound_pod(key)
        if self._on_bound is not None:
            self._on_bound(key, node)
        # queued (events.EventRecorder): never a blocking call per pod; repeats form a series
        self._client.record_event(pod, reason="Scheduled", instance=self._config.identity,
                                  action="Binding",
                                  message=f"Successfully assigned {key} to {node}"
                                  + (f" ({why})" if why else ""))
        return True

    def _after_conflict(self, pod: JSON, w: Workload) -> None:
        md = pod.get("metadata") or {}
        key = obj_key(pod)
        try:
            live = self._client.get(f"/api/v1/namespaces/{md.get('namespace')}/pods/"
                                    f"{md.get('name')}")
        except KubeNotFound:
            return
        node = (live.get("spec") or {}).get("nodeName")
        if node and (live.get("metadata") or {}).get("uid") == md.get("uid"):
            self._stats.add("already_bound")  # an earlier attempt (or another replica) won
            self._cache.assume(key, str(node), w)
            self._cache.finish_binding(key, time.monotonic())
