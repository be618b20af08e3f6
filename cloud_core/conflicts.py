"""cfnet's answer for a pod placed nowhere, computed off the binding path.

When the engine places a pod nowhere, the sink of the loop (Kubernetes: the binder, whose
answer goes into the pod's ``FailedScheduling`` event; local mode: the scheduler, whose
answer is a ``conflict`` event) hands the pod, its workload and the scheduler-style message
("0/50 nodes fit: ...") to :class:`ConflictReporter` and goes on.
One worker thread takes the pods in turn, finds each one's minimal conflict and the
validator-checked changes that would make it fit (``placement.relax.diagnose``, the pods
waiting together sharing one prepared snapshot), and records the event: the scheduler's
message first, cfnet's answer after it. It is bounded three ways:

* at most once per pod per back-off: the sink submits only when a pod's message changes
  (on Kubernetes the same rule that decides whether it records an event at all);
* a queue of ``queue_max`` pods: past it a pod's event is recorded at once with the
  scheduler's message alone (counted ``skipped``), never waiting;
* it waits for a lull (``busy()`` false: no pod to try, none being decided or bound), at
  most ``max_wait_s``, so a burst's bindings do not share the interpreter with it;
* ``busy_share``: after each round of diagnoses taking ``t`` seconds of its CPU the worker
  rests ``t * (1 / busy_share - 1)``, so it takes at most that share of the interpreter.

It also keeps, per unschedulable pod, the kinds of its conflict, exported as
``cfnet_unschedulable_pods{constraint}`` (``counts``); a bound or deleted pod is forgotten.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cloud_core.placement import EngineConfig
from cloud_core.placement.model import ClusterSnapshot, Workload
from cloud_core.placement.preempt import DisruptionBudget
from cloud_core.placement.relax import Diagnosis, diagnose_many

log = logging.getLogger(__name__)

Pod = dict[str, Any]  # the pod as its sink knows it (on Kubernetes, the API object)
NOTE_CHARS = 1024  # what the API server keeps of an event's note (events.event_body)
ROUND_MAX = 32  # pods diagnosed on one snapshot before the next is taken


@dataclass(frozen=True, slots=True)
class _Job:
    pod: Pod
    workload: Workload
    message: str
    gang_size: int


class ConflictReporter:
    """See the module docstring. ``snapshot``: the cluster now (called by the worker);
    ``record(pod, message)``: queue the ``FailedScheduling`` event (never blocking);
    ``budgets``: the PodDisruptionBudgets now (None: not known), for eviction suggestions."""

    def __init__(self, snapshot: Callable[[], ClusterSnapshot], config: EngineConfig,
                 record: Callable[[Pod, str], None], *, queue_max: int = 64,
                 busy_share: float = 0.2, busy: Callable[[], bool] = lambda: False,
                 max_wait_s: float = 30.0, start: bool = True,
                 budgets: Callable[[], Sequence[DisruptionBudget] | None] = lambda: None
                 ) -> None:
        self._snapshot = snapshot
        self._budgets = budgets  # None: not known, no eviction suggested
        self._config = config
        self._record = record
        self._queue_max = queue_max
        self._rest = 1.0 / min(max(busy_share, 0.01), 1.0) - 1.0
        self._busy = busy
        self._max_wait_s = max_wait_s
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}  # uid -> its latest job (a newer one replaces it)
        self._kinds: dict[str, tuple[str, ...]] = {}  # uid -> kinds of its conflict
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.stats: Counter[str] = Counter()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="cfnet-conflicts",
                                            daemon=True)
            self._thread.start()

    def submit(self, pod: Pod, w: Workload, message: str, gang_size: int = 1) -> None:
        """Queue ``pod``'s event with cfnet's answer; with the queue full, record it now
        with ``message`` alone."""
        with self._lock:
            full = w.uid not in self._jobs and len(self._jobs) >= self._queue_max
            if not full:
                self._jobs[w.uid] = _Job(pod, w, message, gang_size)
        if full:
            self.stats["skipped"] += 1
            self._record(pod, message)
            return
        self._wake.set()

    def forget(self, uid: str) -> None:
        """``uid`` is bound or gone: no longer unschedulable, and no event is due."""
        with self._lock:
            self._kinds.pop(uid, None)
            self._jobs.pop(uid, None)

    def retain(self, uids: set[str]) -> None:
        """Only ``uids`` are unschedulable now: forget every other pod (a sink that learns
        of placements and deletions only as the set of pods still waiting)."""
        with self._lock:
            for u in [u for u in self._kinds if u not in uids]:
                del self._kinds[u]
            for u in [u for u in self._jobs if u not in uids]:
                del self._jobs[u]

    def counts(self) -> dict[str, int]:
        """Unschedulable pods by the kind of each part of their conflict."""
        with self._lock:
            kinds = list(self._kinds.values())
        out: Counter[str] = Counter()
        for ks in kinds:
            out.update(ks)
        return dict(out)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def drain(self) -> int:
        """Diagnose and record every queued pod now (the worker's round; tests call it
        with ``start=False``). Returns how many were done."""
        with self._lock:
            uids = list(self._jobs)[:ROUND_MAX]
            jobs = [self._jobs.pop(u) for u in uids]
        if not jobs:
            return 0
        try:
            answers = diagnose_many(self._snapshot(), [(j.workload, j.gang_size)
                                                        for j in jobs], self._config,
                                    self._budgets())
        except Exception as exc:  # no snapshot, no answer: the events go out without one
            log.warning("conflicts: no answers for %d pods: %s", len(jobs), exc)
            answers = [exc] * len(jobs)
        for job, d in zip(jobs, answers, strict=True):
            self._one(job, d)
        return len(jobs)

    def _one(self, job: _Job, d: Diagnosis | Exception) -> None:
        text = ""
        kinds: tuple[str, ...] = ()
        if isinstance(d, Exception):  # a bug here must cost the event its answer, not more
            log.warning("conflict of %s: %r", job.workload.uid, d)
            self.stats["failed"] += 1
        else:
            kinds = tuple(sorted({c.kind for c in d.conflict.alone or d.conflict.constraints}))
            text = d.event_text(max(0, NOTE_CHARS - len(job.message) - 2))
            self.stats["diagnosed"] += 1
        with self._lock:
            if kinds:
                self._kinds[job.workload.uid] = kinds
            else:
                self._kinds.pop(job.workload.uid, None)
        self._record(job.pod, f"{job.message}. {text}" if text else job.message)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set():
                until = time.monotonic() + self._max_wait_s
                while self._busy() and time.monotonic() < until and not self._stop.wait(0.1):
                    pass
                t0 = time.thread_time()
                if not self.drain():
                    break
                # thread CPU, not wall time: waiting on the interpreter is not work done
                self._stop.wait((time.thread_time() - t0) * self._rest)
