"""The Kubernetes core's knobs (:class:`ActuatorConfig`) and counters (:class:`ActuatorStats`).

Every part of the core (``wiring.build_actuator`` puts them together) reads the one
configuration and adds to the one set of counters; neither imports another part.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from cloud_core.k8s.evict import DEFAULT_POLICY, EvictionPolicy

SCHEDULER_NAME = "cfnet-scheduler"


@dataclass
class ActuatorConfig:
    """Knobs of the scheduling loop."""

    scheduler_name: str = SCHEDULER_NAME
    # a step takes what the queue holds, at most this many (no gathering: actuator.run)
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
    # how long a pod whose binding succeeded stays assumed without the watch showing it
    # (cache.py); None: until the watch shows it bound or deleted, as kube-scheduler's
    # default (durationToExpireAssumedPod 0)
    assumed_ttl_s: float | None = None
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
    # a FailedScheduling event also names the pod's minimal conflict and the nearest changes
    # that would make it fit (cloud_core/conflicts.py: on its own thread, at most this share of the
    # interpreter; 0 turns it off)
    conflict_share: float = 0.2
    # what is never evicted, for a move or the console's drain (k8s/evict.py; the chart's
    # core.eviction.excludeNamespaces is its excluded_namespaces)
    eviction: EvictionPolicy = DEFAULT_POLICY


@dataclass
class ActuatorStats:
    """Counters for tests and /metrics (``add`` from any thread)."""

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
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1) -> None:
        """Counter ``name`` goes up by ``n``."""
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def failed_in(self, namespace: str) -> None:
        """A FailedScheduling said in ``namespace``."""
        with self.lock:
            self.failed_by_namespace[namespace] += 1

    def bound_pod(self, key: str) -> None:
        """Pod ``key`` was bound."""
        with self.lock:
            self.bound_pods.append(key)
