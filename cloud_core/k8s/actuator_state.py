"""What the parts of the Kubernetes actuator share, declared once.

:class:`cloud_core.k8s.actuator.Actuator` is put together from one class per responsibility,
each in its own module:

* ``podcache.py`` (:class:`PodCache`): the informer handlers, the pod cache and the sums per
  node the snapshot counts;
* ``source.py`` (:class:`Source`): the loop's source of truth (``observe``: the next batch
  from the scheduling queue, ``queue.py``, and the snapshot);
* ``binder.py`` (:class:`Binder`): the loop's sink for placements (``pods/binding``,
  ``Scheduled`` / ``FailedScheduling`` events);
* ``moves.py`` (:class:`Moves`): re-placement (evictions, reservations for the replacement,
  bare-pod copies, constraint alerts);
* ``actuator.py``: the configuration, the counters, the thread that runs the loop.

They share one object, hence one lock (``_lock``) and the state below; ``ActuatorState`` only
declares it (``Actuator.__init__`` sets it), so that each part type-checks on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from cloud_core.errors import KubeUnavailable
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.informer import Reflector
from cloud_core.k8s.ledger import MoveLedger
from cloud_core.k8s.queue import SchedulingQueue
from cloud_core.k8s.registry import LabelChange, NodeRegistry
from cloud_core.loop import DecisionLoop
from cloud_core.placement.model import Health, RunningPod, Workload
from cloud_core.placement.spec import PodParser

if TYPE_CHECKING:
    from cloud_core.k8s.actuator import ActuatorConfig, ActuatorStats
    from cloud_core.k8s.podcache import _Bound


class ActuatorState:
    """The state the actuator's parts share (declarations only; see the module docstring)."""

    client: KubeClient
    registry: NodeRegistry
    config: ActuatorConfig
    stats: ActuatorStats
    is_leader: Callable[[], bool]
    on_alert: Callable[[dict[str, Any]], None] | None
    on_bound: Callable[[str, str], None] | None
    links: Callable[[], Mapping[tuple[str, str], Any]]
    agent_health: Callable[[], Mapping[str, Health]] | None
    loop: DecisionLoop
    nodes: Reflector
    pods: Reflector
    queue: SchedulingQueue
    _lock: threading.RLock
    _wake: threading.Event
    _pool: ThreadPoolExecutor
    _parser: PodParser
    # pod key -> (node, when, the pod as the snapshot counts it): bindings made, not seen yet
    _assumed: dict[str, tuple[str, float, RunningPod | None]]
    _last_failure: dict[str, str]  # pod uid -> last FailedScheduling message
    _workloads: dict[str, Workload | None]  # pod uid -> parsed workload
    # what the snapshot counts (podcache.py)
    _running_cache: dict[str, _Bound]
    _bound_keys: set[str]
    _live: dict[str, RunningPod]
    _own: dict[str, tuple[JSON, Workload, str]]
    _usage: dict[str, list[int]]
    _pending: dict[str, JSON]
    _batches: int
    _generation: int
    _pending_changes: list[LabelChange]
    _changes: dict[str, list[LabelChange]]
    _alerted: set[str]
    _uncountable_warned: set[str]
    # a move's destination per replacement key: [(node, moved pod uid, expiry)] (moves.py)
    _reserved: dict[tuple[str, ...], list[tuple[str, str, float]]]
    ledger: MoveLedger | None  # where the reservations outlive this leader (ledger.py)
    _restore_due: bool  # read the ledger back at the next step (taking the Lease)
    _forget_due: bool  # drop the reservations in memory at the next step (leadership changed)
    _obs_gen: int  # the cluster generation that step saw
    _more: bool
    _binding: int  # bindings submitted and not yet done
    # the pods' list pages go on (closed while the first batch is decided)
    _pages_go: threading.Event
    _bind_error: KubeUnavailable | None  # from a binding in flight

    # the parts' methods that other parts call
    _count: Callable[[str], None]
    _fits_after: Callable[[str, str], bool]
    _workload: Callable[[JSON], Workload | None]
    _scan: Callable[..., Any]
    _pinned: Callable[..., dict[str, tuple[str, str]]]
    _consume_reservation: Callable[[JSON | None, str], None]
    _event: Callable[[JSON, str, str, str], None]
    _unschedulable_now: Callable[[JSON, int, str], None]
    is_pending: Callable[[JSON], bool]
    pending: Callable[[], list[JSON]]
    _batch_limit: Callable[[], int]
