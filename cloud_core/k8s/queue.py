"""The scheduling queue of the Kubernetes loop, after kube-scheduler's.

Upstream (``pkg/scheduler/backend/queue/scheduling_queue.go``) keeps three queues:

* **activeQ**: pods to try now;
* **backoffQ**: pods that failed and wait out a per-pod exponential backoff
  (``podInitialBackoffSeconds`` 1 s doubling to ``podMaxBackoffSeconds`` 10 s, the defaults),
  moved to activeQ when it expires (upstream flushes every second; here every pop);
* **unschedulablePods**: pods that failed and wait for a cluster event that may help *them*.
  Each failure records what rejected the pod (here: :class:`Reject` categories read from the
  engine's and validator's reasons); an event moves a pod back only when a *queueing hint*
  says the event may make it schedulable (a deleted pod frees room only for a pod rejected
  for room, and only if the room freed on that node is enough; a node change helps pods a
  node rejected; a bound pod helps pods waiting for pod affinity or a spread ...). A pod
  whose backoff has not expired goes to backoffQ, else to activeQ. A pod left there longer
  than ``max_unschedulable_s`` is retried anyway (upstream
  ``podMaxInUnschedulablePodsDuration``, 5 min; here 30 s by default, since measured links,
  which no event announces, decide latency SLAs).

Events that arrive while a pod is being decided (in flight) are kept and looked at when its
failure is reported, as upstream's in-flight events: a pod that missed a helpful event goes
to backoffQ, not to unschedulablePods.

One thing upstream does not have: **fairness across namespaces**. activeQ is one FIFO per
namespace (priority first, then the time the pod entered the queue), and a batch takes pods
from the namespaces in turn, so one tenant's backlog of thousands of pods cannot hide another
tenant's pod: a pod is in the next batch whatever the size of other namespaces' backlogs.

The queue is a data structure: the actuator calls it under its own lock; it reads no clock
of its own (``now`` is passed in), so tests drive it with a fake clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

BACKOFF_INITIAL_S = 1.0  # kube-scheduler's podInitialBackoffSeconds default
BACKOFF_MAX_S = 10.0  # kube-scheduler's podMaxBackoffSeconds default
MAX_UNSCHEDULABLE_S = 30.0
MAX_IN_FLIGHT_EVENTS = 10_000  # beyond: every in-flight pod is taken to have missed one


class Reject(StrEnum):
    """What rejected a pod: decides which events may help it (queueing hints)."""

    RESOURCES = "resources"  # cpu / memory / GPUs / pods / extended resources / host ports
    NODE = "node"  # a node's labels, taints, health, region, security level, latency
    POD_AFFINITY = "pod_affinity"  # needs a matching pod somewhere
    ANTI_AFFINITY = "anti_affinity"  # a matching pod is in the way
    SPREAD = "spread"  # topology spread skew
    GANG = "gang"  # waits for the rest of its gang
    SPEC = "spec"  # its own spec is refused: only an update of the pod helps
    UNKNOWN = "unknown"  # any event may help


class Event(StrEnum):
    """A cluster change, as the hints know it."""

    NODE_CHANGED = "node"  # added, or labels / taints / allocatable / health changed
    POD_DELETED = "pod_deleted"  # a bound pod went away (or finished)
    POD_BOUND = "pod_bound"  # a pod was bound, or a bound pod's labels changed
    PENDING_ADDED = "pending_added"  # a pending pod arrived (gangs)


# Which events may help a pod rejected for each reason (the hints' first cut; RESOURCES on
# POD_DELETED also asks ``fits_after``).
_HELPS: dict[Reject, frozenset[Event]] = {
    Reject.RESOURCES: frozenset({Event.NODE_CHANGED, Event.POD_DELETED}),
    Reject.NODE: frozenset({Event.NODE_CHANGED}),
    Reject.POD_AFFINITY: frozenset({Event.NODE_CHANGED, Event.POD_BOUND}),
    Reject.ANTI_AFFINITY: frozenset({Event.NODE_CHANGED, Event.POD_DELETED}),
    Reject.SPREAD: frozenset({Event.NODE_CHANGED, Event.POD_DELETED, Event.POD_BOUND}),
    Reject.GANG: frozenset({Event.PENDING_ADDED, Event.NODE_CHANGED, Event.POD_DELETED}),
    Reject.SPEC: frozenset(),
    Reject.UNKNOWN: frozenset(Event),
}

# Words of the engine's and the validator's reasons (placement/filters.py FILTER_ORDER and
# their messages) → what rejected the pod. Looked for in the lower-cased message.
_WORDS: tuple[tuple[str, Reject], ...] = (
    ("anti-affinity", Reject.ANTI_AFFINITY), ("anti_affinity", Reject.ANTI_AFFINITY),
    ("pod affinity", Reject.POD_AFFINITY), ("pod_affinity", Reject.POD_AFFINITY),
    ("spread", Reject.SPREAD), ("skew", Reject.SPREAD),
    ("gang", Reject.GANG),
    ("insufficient", Reject.RESOURCES), ("too many pods", Reject.RESOURCES),
    ("host port", Reject.RESOURCES), ("host_port", Reject.RESOURCES),
    ("extended", Reject.RESOURCES), ("resources", Reject.RESOURCES),
    ("residency", Reject.NODE), ("security", Reject.NODE), ("selector", Reject.NODE),
    ("node affinity", Reject.NODE), ("node_affinity", Reject.NODE), ("taint", Reject.NODE),
    ("health", Reject.NODE), ("latency", Reject.NODE), ("cordon", Reject.NODE),
    ("unreachable", Reject.NODE), ("down", Reject.NODE),
)


def rejections(message: str) -> frozenset[Reject]:
    """What a FailedScheduling message says rejected the pod (UNKNOWN when it names
    nothing known: then any event may help, never a pod left waiting forever)."""
    m = message.lower()
    if m.startswith("invalid workload spec"):
        return frozenset({Reject.SPEC})
    found = frozenset(r for w, r in _WORDS if w in m)
    return found or frozenset({Reject.UNKNOWN})


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """One event for the hints: its kind, and for a deleted pod where room was freed."""

    kind: Event
    node: str | None = None
    namespace: str | None = None
    gang: str | None = None


# A hint's question about a RESOURCES-rejected pod and a deleted pod's node: would the pod
# (by key) fit the room now free there? The actuator answers from its sums.
FitsAfter = Callable[[str, str], bool]


@dataclass(slots=True)
class QueuedPod:
    """A pending pod's place in the queue (upstream's QueuedPodInfo)."""

    key: str
    namespace: str
    priority: int
    added: float  # when it entered the queue (FIFO within a priority)
    attempts: int = 0
    backoff_until: float = 0.0
    state: str = "active"  # active | backoff | unschedulable | in_flight
    seq: int = 0  # the heap entry that is current (older entries are skipped)
    rejected: frozenset[Reject] = frozenset()
    unschedulable_since: float = 0.0
    gang: str | None = None
    cycle: int = 0  # the pop that took it in flight


@dataclass
class QueueStats:
    """Counters for tests, /metrics and the benchmark."""

    popped: int = 0
    to_backoff: int = 0
    to_unschedulable: int = 0
    moved_by_event: int = 0
    skipped_by_hint: int = 0
    flushed: int = 0


@dataclass
class SchedulingQueue:
    """activeQ (fair across namespaces), backoffQ and unschedulable pods; see the module
    docstring. Not thread-safe: the caller holds its lock."""

    backoff_initial_s: float = BACKOFF_INITIAL_S
    backoff_max_s: float = BACKOFF_MAX_S
    max_unschedulable_s: float = MAX_UNSCHEDULABLE_S
    stats: QueueStats = field(default_factory=QueueStats)

    def __post_init__(self) -> None:
        self._pods: dict[str, QueuedPod] = {}
        self._active: dict[str, list[tuple[int, float, int, str]]] = {}  # ns → heap
        self._backoff: list[tuple[float, int, str]] = []
        self._unschedulable: dict[str, QueuedPod] = {}
        self._in_flight: dict[str, QueuedPod] = {}
        self._events: list[ClusterEvent] = []  # seen while pods were in flight
        self._events_overflow = False
        self._seq = 0
        self._cycle = 0
        self._rr = 0  # where the namespace round-robin starts next

    # -- arrivals and departures ---------------------------------------------------------
    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, key: str) -> bool:
        return key in self._pods

    def state(self, key: str) -> str | None:
        """Where pod ``key`` is (None: not queued)."""
        p = self._pods.get(key)
        return p.state if p is not None else None

    def add(self, key: str, namespace: str, priority: int, now: float,
            gang: str | None = None) -> None:
        """A pending pod arrived (or its spec changed: then it is tried again, after its
        backoff, like upstream's update of an unschedulable pod)."""
        p = self._pods.get(key)
        if p is None:
            p = self._pods[key] = QueuedPod(key, namespace, priority, now, gang=gang)
            self._activate(p)
            return
        p.priority, p.gang = priority, gang
        if p.state == "unschedulable":
            self._move(p, now)

    def remove(self, key: str) -> None:
        """The pod was bound (assumed), deleted, or is no longer pending."""
        p = self._pods.pop(key, None)
        if p is not None:
            self._unschedulable.pop(key, None)
            self._in_flight.pop(key, None)
            p.state = "gone"  # heap entries left behind are skipped

    # -- taking a batch ----------------------------------------------------------------------
    def has_active(self, now: float) -> bool:
        """Anything to try now (after moving expired backoffs and long-unschedulable pods)."""
        self._flush(now)
        return any(self._valid_top(ns) for ns in list(self._active))

    def has_in_flight(self) -> bool:
        """Pods a step has taken and not yet reported placed or not (a batch being decided)."""
        return bool(self._in_flight)

    def pop_batch(self, limit: int, now: float, retry_limit: int | None = None) -> list[str]:
        """Up to ``limit`` pods to try, taken from the namespaces in turn (each in priority,
        then arrival order), of which at most ``retry_limit`` tried before: a batch of
        retries (a flush of many distinct unschedulable pods) stays short, so a pod arriving
        meanwhile waits for a short batch, not for a thousand hopeless ones. They are in
        flight until ``failed`` / ``remove`` / ``requeue``; pods still in flight from an
        earlier pop (a step that never reported) are tried again first."""
        self._flush(now)
        self._cycle += 1
        for lost in list(self._in_flight.values()):  # an earlier step lost them: again
            self._activate(lost)
        self._in_flight.clear()
        self._events.clear()
        self._events_overflow = False
        out: list[str] = []
        retries = 0
        spaces = sorted(ns for ns in list(self._active) if self._valid_top(ns))
        if not spaces:
            return out
        start = self._rr % len(spaces)
        order = spaces[start:] + spaces[:start]
        self._rr += 1
        while len(out) < limit and order:
            nxt = []
            for ns in order:
                if len(out) >= limit:
                    nxt.append(ns)
                    continue
                if (retry_limit is not None and retries >= retry_limit
                        and self._top_attempts(ns) > 0):
                    continue  # this namespace's next pod is a retry: the budget is spent
                q = self._pop_active(ns)
                if q is None:
                    continue
                retries += q.attempts > 0
                q.state, q.cycle = "in_flight", self._cycle
                self._in_flight[q.key] = q
                out.append(q.key)
                nxt.append(ns)
            if len(out) >= limit:
                break
            order = [ns for ns in nxt if self._valid_top(ns)]
        self.stats.popped += len(out)
        return out

    def failed(self, key: str, reasons: Iterable[Reject], now: float,
               fits_after: FitsAfter | None = None) -> None:
        """Pod ``key`` was tried and not placed for ``reasons``: backoff doubles; it waits
        in unschedulablePods for a helpful event, or in backoffQ when one came while it was
        in flight."""
        p = self._pods.get(key)
        if p is None:
            return
        self._in_flight.pop(key, None)
        p.attempts += 1
        p.rejected = frozenset(reasons) or frozenset({Reject.UNKNOWN})
        p.backoff_until = now + self.backoff_s(p.attempts)
        missed = self._events_overflow or any(
            self._helps(p, ev, fits_after) for ev in self._events)
        if missed:
            self._to_backoff(p)
        else:
            p.state, p.unschedulable_since = "unschedulable", now
            self._unschedulable[key] = p
            self.stats.to_unschedulable += 1

    def requeue(self, key: str, now: float) -> None:
        """Try pod ``key`` again after its backoff (a binding failed, or the step lost it)."""
        p = self._pods.get(key)
        if p is None:
            return
        self._in_flight.pop(key, None)
        self._unschedulable.pop(key, None)
        p.attempts += 1
        p.backoff_until = now + self.backoff_s(p.attempts)
        self._to_backoff(p)

    def backoff_s(self, attempts: int) -> float:
        """Upstream's calculateBackoffDuration: initial × 2^(attempts-1), at most max."""
        if attempts <= 0:
            return 0.0
        return float(min(self.backoff_initial_s * 2 ** min(attempts - 1, 30), self.backoff_max_s))

    # -- events (queueing hints) -------------------------------------------------------------
    def on_event(self, ev: ClusterEvent, now: float,
                 fits_after: FitsAfter | None = None) -> int:
        """Move the unschedulable pods ``ev`` may help to backoffQ / activeQ; returns how
        many moved. Remembered for the pods in flight."""
        if self._in_flight:
            if len(self._events) < MAX_IN_FLIGHT_EVENTS:
                self._events.append(ev)
            else:
                self._events_overflow = True
        moved = 0
        for p in list(self._unschedulable.values()):
            if self._helps(p, ev, fits_after):
                self._move(p, now)
                moved += 1
            else:
                self.stats.skipped_by_hint += 1
        self.stats.moved_by_event += moved
        return moved

    def _helps(self, p: QueuedPod, ev: ClusterEvent, fits_after: FitsAfter | None) -> bool:
        for r in p.rejected:
            if ev.kind not in _HELPS[r]:
                continue
            if r is Reject.GANG and ev.kind is Event.PENDING_ADDED and (
                    ev.namespace != p.namespace or ev.gang != p.gang):
                continue  # another gang's pod (gangs are per namespace)
            if (r is Reject.RESOURCES and ev.kind is Event.POD_DELETED
                    and fits_after is not None and ev.node is not None
                    and not fits_after(p.key, ev.node)):
                continue  # the room freed there is not enough for this pod
            return True
        return False

    # -- internals ---------------------------------------------------------------------------
    def _activate(self, p: QueuedPod) -> None:
        self._seq += 1
        p.seq, p.state = self._seq, "active"
        heapq.heappush(self._active.setdefault(p.namespace, []),
                       (-p.priority, p.added, p.seq, p.key))

    def _to_backoff(self, p: QueuedPod) -> None:
        self._seq += 1
        p.seq, p.state = self._seq, "backoff"
        heapq.heappush(self._backoff, (p.backoff_until, p.seq, p.key))
        self.stats.to_backoff += 1

    def _move(self, p: QueuedPod, now: float) -> None:
        self._unschedulable.pop(p.key, None)
        if p.backoff_until > now:
            self._to_backoff(p)
        else:
            self._activate(p)

    def _flush(self, now: float) -> None:
        while self._backoff and self._backoff[0][0] <= now:
            _, seq, key = heapq.heappop(self._backoff)
            p = self._pods.get(key)
            if p is not None and p.state == "backoff" and p.seq == seq:
                self._activate(p)
        if self._unschedulable:
            old = [p for p in self._unschedulable.values()
                   if now - p.unschedulable_since >= self.max_unschedulable_s]
            for p in old:
                self._move(p, now)
            self.stats.flushed += len(old)

    def _valid_top(self, ns: str) -> bool:
        h = self._active.get(ns)
        while h:
            _, _, seq, key = h[0]
            p = self._pods.get(key)
            if p is not None and p.state == "active" and p.seq == seq:
                return True
            heapq.heappop(h)
        self._active.pop(ns, None)
        return False

    def _top_attempts(self, ns: str) -> int:
        if not self._valid_top(ns):
            return 0
        return self._pods[self._active[ns][0][3]].attempts

    def _pop_active(self, ns: str) -> QueuedPod | None:
        if not self._valid_top(ns):
            return None
        _, _, _, key = heapq.heappop(self._active[ns])
        return self._pods[key]
