"""Pool-mode Deployments through the decision loop: the per-pool replica counts are decided
by :class:`cloud_core.loop.DecisionLoop`, as pods are.

Each replica of a pool-mode Deployment is one workload of a ``DecisionLoop`` (one loop per
edge framework) whose source and sink are a :class:`PoolSide`:

* ``observe``: the core's cluster snapshot (the actuator's: Node registry, running pods, the
  agents' links and health) in which the nodes that belong to none of the framework's pools
  are tainted for the replicas (a replica tolerating every taint is refused there), with the
  replicas placed so far counted as running on their nodes; the replicas not placed yet are
  pending (one the engine could not place is tried again every ``retry_s``);
  a replica restored from a new leader's read of the ``cfnet.io/pool-plan`` note is pinned to
  the node the note names (the loop's validator checks it; the engine decides afresh where
  it no longer holds).
* the sink: a placement or a move of a replica records its node; a replica stranded on a down
  node goes back to pending; ``apply`` hands every Deployment whose replicas changed to the
  controller's writer (``pools.py``), which writes the counts per pool.

So the loop's place + validate decide the counts, and its re-planner moves replicas between
pools on SLA breaches (a replica's ``cfnet.io/max-latency-ms`` against the measured links)
and node health (a down node's replicas leave it), with the loop's strikes, cool-down and
events. The pods the frameworks run for a Deployment (its selector's ``matchLabels``, in its
namespace) are left out of the view: its replicas stand for them. What moves nothing: a node
joining a pool, capacity changing (the split is kept: moving replicas between equal pools
would churn the edge).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cloud_core.events import Event, EventLog
from cloud_core.k8s.client import JSON
from cloud_core.k8s.pool_objects import PoolPlan, digest, pool_replicas, template_digest
from cloud_core.k8s.workloads import parse_workload
from cloud_core.loop import Move, Observation, PlaceOutcome, with_placements
from cloud_core.placement.model import ClusterSnapshot, Health, Resources, Taint, Workload

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, Deployment name)
# on the nodes outside the framework's pools, in a pool loop's view only (never written)
NOT_IN_POOL = Taint("cfnet.io/not-in-pool", "", "NoSchedule")


def replica_workloads(deployment: JSON, count: int) -> list[Workload]:
    """``count`` replicas of ``deployment``'s template as the engine's workloads (parsed once:
    they differ only in name and uid; raises ``SpecError``)."""
    md = deployment.get("metadata") or {}
    app, ns = str(md.get("name")), str(md.get("namespace") or "default")
    tpl = (deployment.get("spec") or {}).get("template") or {}
    pmd = dict(tpl.get("metadata") or {})
    pmd.update({"name": f"{app}-0", "uid": f"{ns}/{app}/replica-0", "namespace": ns})
    first = parse_workload({"apiVersion": "v1", "kind": "Pod", "metadata": pmd,
                            "spec": tpl.get("spec") or {}})
    return [first] + [dataclasses.replace(first, name=f"{app}-{i}",
                                          uid=f"{ns}/{app}/replica-{i}")
                      for i in range(1, count)]


@dataclass
class PoolApp:
    """One pool-mode Deployment's replicas as the loop sees them."""

    deployment: JSON
    template: str  # digest of the template the workloads were parsed from
    workloads: list[Workload]
    assigned: dict[str, str] = field(default_factory=dict)  # replica uid -> node
    unplaced: dict[str, str] = field(default_factory=dict)  # replica uid -> why
    pins: dict[str, str] = field(default_factory=dict)  # replica uid -> node (a read note)
    retry_at: float = 0.0  # when the unplaced replicas are tried again


class WithoutHealth(EventLog):
    """The pool loop's events, but for node health: the pod loop says each change once."""

    def __init__(self, inner: EventLog) -> None:
        super().__init__(keep=16)
        self.inner = inner

    def emit(self, kind: str, message: str, **kw: Any) -> Event:
        if kind == "health":
            return super().emit(kind, message, **kw)
        return self.inner.emit(kind, message, **kw)


class PoolSide:
    """The source of truth and the sink of one framework's pool loop (module docstring)."""

    def __init__(self, flavour: str, snapshot: Callable[[], ClusterSnapshot],
                 membership: Callable[[str], dict[str, str]], *,
                 write: Callable[[Key, PoolApp, PoolPlan], int] | None = None,
                 retry_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.flavour = flavour
        self._snapshot = snapshot
        self._membership = membership
        self._write = write
        self.retry_s = retry_s
        self._clock = clock
        self.apps: dict[Key, PoolApp] = {}
        self._app_of: dict[str, Key] = {}  # replica uid -> its Deployment
        self._touched: set[Key] = set()  # replicas changed since written
        self.pool_of: dict[str, str] = {}  # node -> pool, as the last observation saw it
        self.more = False  # replicas went back to pending: step again soon

    # ------------------------------------------------------------ the Deployments

    def set_app(self, key: Key, deployment: JSON, pins: Mapping[int, str] | None = None) -> None:
        """Keep ``deployment``'s replicas (raises ``SpecError``: nothing changes then). A new
        template replaces every replica; a new count adds or drops the last ones."""
        count = pool_replicas(deployment)
        tdig = digest(template_digest(deployment))
        app = self.apps.get(key)
        if app is None or app.template != tdig:
            ws = replica_workloads(deployment, count) if count else []
            self.drop(key)
            app = self.apps[key] = PoolApp(deployment, tdig, ws)
            for i, node in (pins or {}).items():
                if 0 <= i < count:
                    app.pins[ws[i].uid] = node
            self._app_of.update((w.uid, key) for w in ws)
            self._touched.add(key)
            return
        app.deployment = deployment
        have = len(app.workloads)
        if count > have:
            more = replica_workloads(deployment, count)[have:]
            app.workloads.extend(more)
            self._app_of.update((w.uid, key) for w in more)
            self._touched.add(key)
        elif count < have:
            for w in app.workloads[count:]:
                self._forget(app, w.uid)
            del app.workloads[count:]
            self._touched.add(key)

    def _forget(self, app: PoolApp, uid: str) -> None:
        app.assigned.pop(uid, None)
        app.unplaced.pop(uid, None)
        app.pins.pop(uid, None)
        self._app_of.pop(uid, None)

    def drop(self, key: Key) -> None:
        app = self.apps.pop(key, None)
        if app is not None:
            for w in app.workloads:
                self._app_of.pop(w.uid, None)
        self._touched.discard(key)

    def touch_all(self) -> None:
        """Hand every Deployment to the writer on the next step (a periodic resync: a write
        refused earlier, NotOwned, is tried again)."""
        self._touched |= set(self.apps)

    def plan(self, key: Key) -> PoolPlan:
        """The counts per pool of ``key``'s replicas, as placed now."""
        app = self.apps[key]
        md = app.deployment.get("metadata") or {}
        per_pool = Counter(self.pool_of.get(n, "") for n in app.assigned.values())
        per_pool.pop("", None)
        return PoolPlan(app=str(md.get("name")), flavour=self.flavour,
                        replicas=len(app.workloads), per_pool=dict(sorted(per_pool.items())),
                        assignments=dict(app.assigned), unplaced=dict(app.unplaced))

    # ------------------------------------------------------------ source of truth

    def observe(self) -> Observation:
        pool_of = self._membership(self.flavour)
        self.pool_of = pool_of
        snap = self._without_app_pods(self._snapshot())
        # The nodes outside the framework's pools stay in the view, tainted so that no replica
        # goes there: a latency SLA may name one of them (a gateway, a site's other nodes),
        # and their pods count for (anti-)affinity.
        nodes = tuple(n if n.name in pool_of else
                      dataclasses.replace(n, taints=(*n.taints, NOT_IN_POOL))
                      for n in snap.nodes)
        names = {n.name for n in nodes if n.name in pool_of}
        snap = dataclasses.replace(snap, nodes=nodes)
        now = self._clock()
        self.more = False
        every: list[Workload] = []
        placed: dict[str, str] = {}
        running: list[tuple[Workload, str]] = []
        pending: list[Workload] = []
        pinned: dict[str, tuple[str, str]] = {}
        for key, app in self.apps.items():
            retry = now >= app.retry_at
            for w in app.workloads:
                node = app.assigned.get(w.uid)
                if node is not None and node not in names:
                    # its node left the pools (or the cluster): placed again
                    del app.assigned[w.uid]
                    self._touched.add(key)
                    node = None
                if node is not None:
                    every.append(w)
                    placed[w.uid] = node
                    running.append((w, node))
                elif w.uid not in app.unplaced or retry:
                    pending.append(w)
                    if w.uid in app.pins:
                        pinned[w.uid] = (app.pins[w.uid], w.uid)
        health = {n.name: Health.ONLINE if n.health is Health.CORDONED else n.health
                  for n in nodes if n.name in names}
        return Observation(health=health, snapshot=with_placements(snap, every, placed),
                           pending=pending, running=running, pinned=pinned)

    def _without_app_pods(self, snap: ClusterSnapshot) -> ClusterSnapshot:
        """``snap`` without the pods the frameworks run for these Deployments (in their
        namespace, matching their ``spec.selector.matchLabels``) and what they request: the
        replicas stand for them, and counting both would see their nodes twice as full (a
        pinned replica refused on a full node after a failover, a move refused by load)."""
        sel: dict[str, list[Mapping[str, Any]]] = {}
        for (ns, _), app in self.apps.items():
            ml = ((app.deployment.get("spec") or {}).get("selector") or {}).get("matchLabels")
            if isinstance(ml, dict) and ml:
                sel.setdefault(ns, []).append(ml)
        if not sel:
            return snap
        freed: dict[str, Resources] = {}
        kept = []
        for p in snap.pods:
            if p.namespace in sel and any(all(p.labels.get(k) == v for k, v in m.items())
                                          for m in sel[p.namespace]):
                freed[p.node] = freed.get(p.node, Resources()) + p.requests
            else:
                kept.append(p)
        if not freed:
            return snap
        nodes = tuple(dataclasses.replace(n, allocated=n.allocated - freed[n.name])
                      if n.name in freed else n for n in snap.nodes)
        return dataclasses.replace(snap, nodes=nodes, pods=tuple(kept))

    # ------------------------------------------------------------ sink

    def commit_placements(self, obs: Observation, outcome: PlaceOutcome) -> int:
        now = self._clock()
        for uid, node in outcome.assignments.items():
            key = self._app_of.get(uid)
            if key is None:
                continue
            app = self.apps[key]
            if node not in self.pool_of:  # a replica tolerating every taint
                app.unplaced[uid] = f"{node} is in no {self.flavour} pool"
                app.retry_at = now + self.retry_s
                self._touched.add(key)
                continue
            app.assigned[uid] = node
            app.unplaced.pop(uid, None)
            app.pins.pop(uid, None)
            self._touched.add(key)
        for uid, why in outcome.failures.items():
            key = self._app_of.get(uid)
            if key is None:
                continue
            app = self.apps[key]
            app.pins.pop(uid, None)
            if app.unplaced.get(uid) != why:
                self._touched.add(key)
            app.unplaced[uid] = why
            app.retry_at = now + self.retry_s
        return len(outcome.assignments)

    def apply(self) -> int:
        """Hand each Deployment whose replicas changed to the writer (it answers 1: written,
        0: nothing to write, -1: failed); one whose write failed is handed again on the next
        step. Returns how many were written."""
        if self._write is None:
            self._touched.clear()
            return 0
        done = 0
        for key in sorted(self._touched):
            app = self.apps.get(key)
            if app is None:
                self._touched.discard(key)
                continue
            try:
                got = self._write(key, app, self.plan(key))
            except Exception:
                log.exception("writing the pool object of %s/%s failed", *key)
                got = -1
            if got >= 0:
                done += got
                self._touched.discard(key)
        return done

    def commit_moves(self, obs: Observation, moves: Sequence[Move]) -> list[Move]:
        done = []
        for m in moves:
            key = self._app_of.get(m.workload_uid)
            if key is None or m.dst not in self.pool_of:
                continue
            self.apps[key].assigned[m.workload_uid] = m.dst
            self._touched.add(key)
            done.append(m)
        return done

    def requeue(self, stranded: Sequence[tuple[Workload, str]]) -> int:
        for w, _ in stranded:
            key = self._app_of.get(w.uid)
            if key is not None and self.apps[key].assigned.pop(w.uid, None) is not None:
                self._touched.add(key)
                self.more = True
        return len(stranded)

    def report_misfits(self, obs: Observation,
                       misfits: Mapping[str, tuple[str, list[str]]]) -> None:
        """Nothing to say: a pool loop's observation revalidates no node."""
