"""The scheduler cache: what the snapshot counts, and the pods assumed bound.

After kube-scheduler's ``pkg/scheduler/internal/cache``. It holds two things under one lock,
so that a step reads one consistent view:

* the bound pods, as the pod handler delivers them (``set_pod``): each pod's entry
  (:class:`Bound`, parsed once per version), the live pods, cfnet's own, and the requests per
  node, kept as the watch delivers so that a step reads the sums instead of walking every pod;
* the **assumed** pods: a binding decided and submitted, not yet shown by the watch.
  ``assume`` counts the pod on its node at once (the next batch sees it while the binding is
  in flight), ``forget`` drops it (the binding failed), ``finish_binding`` marks the binding
  made; the watch showing the pod bound (or deleted) spends the assumption (``set_pod``), and
  ``cleanup_expired`` drops pods whose binding finished ``ttl_s`` ago and which the watch
  still has not shown (``ttl_s`` None: never, as kube-scheduler's default).

Only this class writes the assumed pods (tests/unit/test_k8s_structure.py checks it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

from cloud_core.k8s.client import JSON
from cloud_core.placement.model import Resources, RunningPod, Workload


class Bound(NamedTuple):
    """A bound pod as the snapshot counts it, kept per pod uid while its version holds."""

    rv: Any
    node: str
    key: str  # namespace/name
    live: bool  # not Succeeded/Failed: counts on its node
    pod: RunningPod
    own: Workload | None  # cfnet's own, live, not being deleted: the re-planner may move it


@dataclass(slots=True)
class _Assumed:
    node: str
    pod: RunningPod | None  # as the snapshot counts it (None: its spec could not be read)
    deadline: float | None = None  # set when the binding finished (and a TTL applies)


@dataclass(frozen=True, slots=True)
class CacheView:
    """One consistent reading of the cache (``SchedulerCache.view``)."""

    usage: dict[str, list[int]]  # node -> [cpu milli, memory bytes, GPUs] of its live pods
    running: list[RunningPod]  # live bound pods, then the assumed ones
    own: list[tuple[JSON, Workload, str]]  # cfnet's own live pods: (pod, workload, node)
    # view(changes=True): the nodes whose sums changed since the last such view, and
    # ``usage`` holds only those (a node of them missing from it has none); None: every node
    changed: frozenset[str] | None = None


def accumulate(a: list[int], r: Resources, sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) ``r`` from a node's [cpu, memory, GPUs] sums."""
    a[0] += sign * r.cpu_milli
    a[1] += sign * r.mem_bytes
    a[2] += sign * r.gpus


def assumed_pod(key: str, node: str, w: Workload | None) -> RunningPod | None:
    """A binding made but not seen yet, as the snapshot counts it (built once, not per step)."""
    if w is None:
        return None
    ns, _, name = key.partition("/")
    return RunningPod.of(w, node, name=name, namespace=ns)


class SchedulerCache:
    """Bound pods' sums and assumed pods (see the module docstring). Thread-safe."""

    def __init__(self, ttl_s: float | None = None) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._assumed: dict[str, _Assumed] = {}  # pod key -> its assumed binding
        self._entries: dict[str, Bound] = {}  # pod uid -> its entry while bound
        self._bound_keys: set[str] = set()
        self._live: dict[str, RunningPod] = {}  # uid -> live bound pod
        self._own: dict[str, tuple[JSON, Workload, str]] = {}  # uid -> cfnet's own live pod
        self._usage: dict[str, list[int]] = {}  # node -> [cpu, memory, GPUs, pods]
        # nodes whose sums (bound or assumed) changed since the last view(changes=True); None:
        # no such view yet (the next one is whole)
        self._dirty: set[str] | None = None

    def _touch(self, node: str) -> None:
        if self._dirty is not None:
            self._dirty.add(node)

    # -- assumed pods ------------------------------------------------------------------------
    def assume(self, key: str, node: str, w: Workload | None) -> None:
        """Pod ``key`` is being bound to ``node``: count it there from now on."""
        entry = _Assumed(node, assumed_pod(key, node, w))
        with self._lock:
            old = self._assumed.get(key)
            if old is not None:
                self._touch(old.node)
            self._assumed[key] = entry
            self._touch(node)

    def forget(self, key: str) -> bool:
        """The binding of ``key`` failed: stop counting it (False: it was not assumed)."""
        with self._lock:
            a = self._assumed.pop(key, None)
            if a is not None:
                self._touch(a.node)
            return a is not None

    def finish_binding(self, key: str, now: float) -> None:
        """The API server accepted the binding of ``key``: its TTL starts (if any)."""
        if self.ttl_s is None:
            return
        with self._lock:
            a = self._assumed.get(key)
            if a is not None:
                a.deadline = now + self.ttl_s

    def cleanup_expired(self, now: float) -> list[str]:
        """Drop the assumed pods whose binding finished more than ``ttl_s`` ago; their keys."""
        if self.ttl_s is None:
            return []
        with self._lock:
            gone = [k for k, a in self._assumed.items()
                    if a.deadline is not None and a.deadline <= now]
            for k in gone:
                self._touch(self._assumed.pop(k).node)
        return gone

    def is_assumed(self, key: str) -> bool:
        with self._lock:
            return key in self._assumed

    def assumed(self) -> dict[str, str]:
        """The assumed pods: key -> node."""
        with self._lock:
            return {k: a.node for k, a in self._assumed.items()}

    # -- bound pods --------------------------------------------------------------------------
    def entry(self, uid: str) -> Bound | None:
        """Pod ``uid``'s entry while it is counted bound."""
        with self._lock:
            return self._entries.get(uid)

    def is_bound(self, key: str) -> bool:
        """A pod of that namespace/name is counted bound."""
        with self._lock:
            return key in self._bound_keys

    def set_pod(self, key: str, uid: str, entry: Bound | None, pod: JSON,
                deleted: bool = False) -> Bound | None:
        """Pod ``uid`` (``key``) is now ``entry`` (None: not bound, or gone) in what the
        snapshot counts; its earlier entry is returned. The watch showing it bound or deleted
        spends its assumption, under the same lock as the sums (one consistent view)."""
        with self._lock:
            prev = self._entries.get(uid)
            if prev is not entry:
                self._count(uid, prev, entry, pod)
            if deleted or entry is not None:
                a = self._assumed.pop(key, None)  # the informer caught up with our binding
                if a is not None:
                    self._touch(a.node)
            return prev

    def _count(self, uid: str, prev: Bound | None, entry: Bound | None, pod: JSON) -> None:
        if prev is not None:
            del self._entries[uid]
            self._bound_keys.discard(prev.key)
            self._touch_assumed(prev.key)
            if prev.live:
                del self._live[uid]
                self._add_usage(prev.node, prev.pod.requests, -1)
            self._own.pop(uid, None)
        if entry is not None:
            self._entries[uid] = entry
            self._bound_keys.add(entry.key)
            self._touch_assumed(entry.key)
            if entry.live:
                self._live[uid] = entry.pod
                self._add_usage(entry.node, entry.pod.requests, 1)
                if entry.own is not None:
                    self._own[uid] = (pod, entry.own, entry.node)

    def _touch_assumed(self, key: str) -> None:
        """A bound pod's key came or went: an assumed pod of that key counts or not."""
        a = self._assumed.get(key)
        if a is not None:
            self._touch(a.node)

    def _add_usage(self, node: str, r: Resources, sign: int) -> None:
        self._touch(node)
        a = self._usage.get(node)
        if a is None:
            a = self._usage[node] = [0, 0, 0, 0]
        accumulate(a, r, sign)
        a[3] += sign  # pods: the entry goes when its last pod does
        if not a[3]:
            del self._usage[node]

    def used(self, node: str) -> tuple[int, int, int]:
        """What the live bound pods on ``node`` request: cpu milli, memory bytes, GPUs."""
        with self._lock:
            a = self._usage.get(node)
            return (a[0], a[1], a[2]) if a is not None else (0, 0, 0)

    def view(self, exclude: frozenset[str] = frozenset(), changes: bool = False) -> CacheView:
        """The sums per node and the running pods, the assumed pods the watch has not shown
        yet counted in; pods whose uid is in ``exclude`` are left out (to re-validate them).

        ``changes`` (one reader only: the loop's source; no ``exclude``): the sums of only the
        nodes changed since its last such view (``CacheView.changed``), every node's the
        first time."""
        with self._lock:
            dirty: set[str] | None = None
            if changes and not exclude:
                dirty, self._dirty = self._dirty, set()
            if dirty is None:
                usage = {n: a[:3] for n, a in self._usage.items()}
            else:
                usage = {n: self._usage[n][:3] for n in dirty if n in self._usage}
            running = list(self._live.values())
            own = list(self._own.values())
            assumed = [a for k, a in self._assumed.items() if k not in self._bound_keys]
            gone = [self._entries[u] for u in exclude if u in self._live]
        for b in gone:  # left out to be re-validated
            accumulate(usage[b.node], b.pod.requests, -1)
        if gone:
            running = [p for p in running if p.uid not in exclude]
            own = [o for o in own if o[1].uid not in exclude]
        for a in assumed:
            if a.pod is not None:
                running.append(a.pod)
                if dirty is None or a.node in dirty:
                    accumulate(usage.setdefault(a.node, [0, 0, 0]), a.pod.requests, 1)
        return CacheView(usage, running, own, None if dirty is None else frozenset(dirty))
