"""The pool controller: pool-mode Deployments kept as OpenYurt / KubeEdge pool objects.

A Deployment annotated ``cfnet.io/pool-mode: openyurt`` or ``kubeedge`` has its replicas
placed per pool by the decision loop (``pool_loop.py``: one :class:`~cloud_core.loop.DecisionLoop`
per framework, over the loop's cluster snapshot restricted to pooled nodes) and written as a
YurtAppSet or EdgeApplication of the same name (``pool_objects.py``), owned by the Deployment (so
the garbage collector removes it with the Deployment). The counts change when the loop places
or moves replicas: the Deployment's replica count or template changed, a replica's node went
down or left its pool, a replica broke its latency SLA for enough intervals (strikes,
cool-down and events are the loop's). The object is deleted when the annotation goes. Pool
membership comes from the node labels and from the NodePool (v1beta2, ``status.nodes``) and
NodeGroup (``spec.nodes``, ``spec.matchLabels``) objects. The Deployment itself is the
template: create it with ``spec.paused: true`` so its own ReplicaSet makes no pods (a Warning
event says so when it is not).

A new leader reads the last plan back from the object cfnet owns (``cfnet.io/pool-plan``:
label and ownerReference checked, as for every write) and pins the replicas to the nodes it
names, so it keeps the split across a failover instead of re-splitting replicas between
equal pools. One tenant's Deployment (a refused spec, a name taken, a failed write) never
stops the others': its failure is its own event.

Which file to touch: this one for the controller (watching, leadership, events, deleting);
``pool_loop.py`` for how the counts are decided; ``pool_writer.py`` for writing, reading back
and deleting the objects (ownership, events); ``pool_objects.py`` for what they hold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cloud_core.errors import KubeError, KubeNotFound
from cloud_core.events import EventLog
from cloud_core.k8s.actuator import Actuator
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.informer import Reflector
from cloud_core.k8s.pool_loop import Key, PoolSide, WithoutHealth
from cloud_core.k8s.pool_objects import (
    CFNET,
    FLAVOURS,
    MANAGED_BY,
    MAX_NOTE_BYTES,
    MAX_POOL_REPLICAS,
    PLAN_NOTE,
    POOL_MODE,
    NotOwned,
    PoolPlan,
    apply_pool_plan,
    edge_application,
    plan_note,
    read_note,
    yurt_app_set,
)
from cloud_core.k8s.pool_writer import PoolWriter
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.loop import DecisionLoop
from cloud_core.placement.model import ClusterSnapshot

__all__ = ["CFNET", "FLAVOURS", "MANAGED_BY", "MAX_NOTE_BYTES", "MAX_POOL_REPLICAS",
           "NODEGROUPS", "NODEPOOLS", "PLAN_NOTE", "POOL_MODE", "NotOwned", "PoolController",
           "PoolPlan", "apply_pool_plan", "edge_application", "plan_note", "plan_pools",
           "read_note", "yurt_app_set"]

log = logging.getLogger(__name__)

NODEPOOLS = "/apis/apps.openyurt.io/v1beta2/nodepools"
NODEGROUPS = "/apis/apps.kubeedge.io/v1alpha1/nodegroups"
POOL_APIS = ((NODEPOOLS, "openyurt"), (NODEGROUPS, "kubeedge"))
# An API the server does not serve (the framework's CRDs not installed) is asked for again this
# often, so a framework installed after the core starts is read without a restart.
NOT_SERVED_RETRY_S = 60.0


def pool_loop(side: PoolSide, events: EventLog | None = None, engine_config: Any = None,
              replan_config: Any = None, replan_interval_s: float = 1.0,
              replan_max_share: float | None = None) -> DecisionLoop:
    """The decision loop of one framework's pool replicas (its node health is the pod loop's
    to say: those events are not repeated)."""
    return DecisionLoop(side, side, WithoutHealth(events or EventLog()),
                        engine_config=engine_config, replan_config=replan_config,
                        replan_interval_s=replan_interval_s, replan_max_share=replan_max_share,
                        report_assignments=False)


def plan_pools(snapshot: ClusterSnapshot, registry: NodeRegistry, deployment: JSON,
               flavour: str, *, engine_config: Any = None) -> PoolPlan:
    """One step of a pool loop for ``deployment`` alone on ``snapshot``, written nowhere: where
    its replicas go, pool by pool (raises ``SpecError``)."""
    md = deployment.get("metadata") or {}
    key = (str(md.get("namespace") or "default"), str(md.get("name")))
    side = PoolSide(flavour, lambda: snapshot, registry.membership)
    side.set_app(key, deployment)
    pool_loop(side, engine_config=engine_config).step()
    return side.plan(key)


class PoolController:
    """Keeps one YurtAppSet / EdgeApplication per pool-mode Deployment (module docstring)."""

    def __init__(self, client: KubeClient, actuator: Actuator, *,
                 is_leader: Callable[[], bool] = lambda: True, resync_s: float = 10.0) -> None:
        self.client = client
        self.actuator = actuator
        self.registry = actuator.registry
        self.is_leader = is_leader
        self.resync_s = resync_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.writer = PoolWriter(client, lambda: str(self.actuator.config.identity))
        self._forget = False  # leadership changed: read the plans back from the objects
        self._last_resync = 0.0
        self.sides: dict[str, PoolSide] = {}
        self.loops: dict[str, DecisionLoop] = {}
        self._new_loops()
        self.deployments = Reflector(client, "/apis/apps/v1/deployments", self._changed,
                                     name="deployments")
        self.extra: list[Reflector] = []
        self._unread: dict[str, float] = {path: 0.0 for path, _ in POOL_APIS}  # -> next probe
        self._probe_error: dict[str, str] = {}  # path -> last failure logged
        self._thread: threading.Thread | None = None

    def _new_loops(self) -> None:
        """A pool loop per framework, fresh (at start, and when leadership changes: the
        strikes and cool-downs of another term are not this one's)."""
        cfg = getattr(self.actuator, "config", None)
        events = getattr(getattr(self.actuator, "loop", None), "events", None)
        for flavour in FLAVOURS:
            side = PoolSide(flavour, self.actuator.snapshot, self.registry.membership,
                            write=self.writer.write, retry_s=self.resync_s)
            self.sides[flavour] = side
            self.loops[flavour] = pool_loop(
                side, events, getattr(cfg, "engine_config", None),
                getattr(cfg, "replan_config", None), getattr(cfg, "replan_interval_s", 1.0),
                # as the pod loop: re-planning thousands of replicas takes at most this share
                getattr(cfg, "replan_max_share", None))

    def start(self) -> None:
        self.deployments.start()
        self._read_pool_objects()
        self._thread = threading.Thread(target=self._run, name="cfnet-pools", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for r in (self.deployments, *self.extra):
            r.stop_event.set()
        if self._thread is not None:
            self._thread.join(10)

    def _read_pool_objects(self) -> None:
        """Start a reflector for each framework's pool objects once its API answers.

        Asked again on every round of the controller until it does: a cluster without the
        framework answers 404 (asked again every ``NOT_SERVED_RETRY_S``, quietly), while any
        other failure (a timeout or a 5xx under load, a 403 before the RBAC is in place) is
        logged once per distinct cause and retried on the next round (``resync_s``). Probing
        once at start and giving up on any error left a core that met one slow answer blind
        to its NodeGroups until restarted."""
        now = time.monotonic()
        for path, flavour in POOL_APIS:
            if path not in self._unread or now < self._unread[path]:
                continue
            try:
                self.client.get(path, limit=1)
            except KubeNotFound:
                self._unread[path] = now + NOT_SERVED_RETRY_S
                if self._probe_error.get(path) != "not served":
                    self._probe_error[path] = "not served"
                    log.info("%s is not served (no %s CRDs): pools of %s come from node "
                             "labels only; asking again every %.0f s", path, flavour,
                             flavour, NOT_SERVED_RETRY_S)
                continue
            except KubeError as e:
                if self._probe_error.get(path) != str(e):
                    self._probe_error[path] = str(e)
                    log.warning("reading %s failed: %s; retrying", path, e)
                continue
            del self._unread[path]
            self._probe_error.pop(path, None)
            r = Reflector(self.client, path, self._pool_object(flavour), name=path)
            r.start()
            self.extra.append(r)

    def _changed(self, kind: str, obj: JSON, old: JSON | None) -> None:
        self._wake.set()

    def _pool_object(self, flavour: str) -> Callable[[str, JSON, JSON | None], None]:
        def handle(kind: str, obj: JSON, old: JSON | None) -> None:
            name = str((obj.get("metadata") or {}).get("name"))
            if kind == "DELETED":
                self.registry.set_pool_object(flavour, name, None)
            elif flavour == "openyurt":
                nodes = (obj.get("status") or {}).get("nodes") or []
                self.registry.set_pool_object(flavour, name, [str(n) for n in nodes])
            else:
                spec = obj.get("spec") or {}
                self.registry.set_pool_object(flavour, name,
                                              [str(n) for n in spec.get("nodes") or []],
                                              spec.get("matchLabels") or {})
            self._wake.set()
        return handle

    def _wait_s(self) -> float:
        """Until the next round: ``resync_s``, or the next re-plan of a loop with replicas
        (so its SLA strikes are one interval apart, as the pod loop's)."""
        due = [self.loops[f].replan_in() for f, s in self.sides.items() if s.apps]
        if any(s.more for s in self.sides.values()):
            due.append(0.0)
        return max(0.05, min([self.resync_s, *due]))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._wait_s())
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._unread:
                self._read_pool_objects()
            if self._forget:
                self._forget_now()
            if not self.is_leader():
                continue
            if not (self.deployments.synced.is_set() and self.actuator.wait_ready(0)):
                # a plan on part of the nodes would re-split what a whole view keeps, and a
                # Deployment not listed yet would look gone: wait for both lists
                self._stop.wait(0.2)
                self._wake.set()
                continue
            self._stop.wait(0.2)  # let a burst of changes gather
            try:
                self.reconcile()
            except Exception:
                log.exception("pool reconcile failed")

    @property
    def plans(self) -> dict[str, PoolPlan]:
        """"ns/name" -> the last plan written (or read back)."""
        return self.writer.plans

    def forget_plans(self) -> None:
        """Leadership changed (any thread): the plans in memory may be stale; the pool
        objects hold the last ones (read back before planning, ``PoolWriter.restore``)."""
        self._forget = True
        self._wake.set()

    def _forget_now(self) -> None:
        self._forget = False
        self.writer.forget()
        self._new_loops()

    def reconcile(self) -> int:
        """Hand the pool-mode Deployments to their loops, step each loop that has some,
        delete objects whose Deployment left pool mode. Returns the objects written."""
        seen: dict[Key, str] = {}
        for dep in self.deployments.items():
            md = dep.get("metadata") or {}
            flavour = (md.get("annotations") or {}).get(POOL_MODE)
            if flavour not in FLAVOURS or md.get("deletionTimestamp"):
                continue
            key = (str(md.get("namespace")), str(md.get("name")))
            seen[key] = str(flavour)
            try:
                self._keep(dep, key, str(flavour))
            except Exception as e:
                self.writer.refused(dep, key, str(flavour), e)
        for flavour, side in self.sides.items():
            for key in [k for k in side.apps if seen.get(k) != flavour]:
                side.drop(key)
        for key in [k for k in self.writer.written if k not in seen]:
            self.writer.delete(key, self.writer.written[key][0])
        now = time.monotonic()
        if now - self._last_resync >= self.resync_s:
            self._last_resync = now
            for side in self.sides.values():
                side.touch_all()
        writes = 0
        for flavour, side in self.sides.items():
            if side.apps:
                writes += self.loops[flavour].step().applied
        return writes

    def _keep(self, dep: JSON, key: Key, flavour: str) -> None:
        """``dep``'s replicas in its loop (raises what stops it: SpecError)."""
        side = self.sides[flavour]
        pins: dict[int, str] | None = {}
        if key not in side.apps and key not in self.writer.written:
            pins = self.writer.restore(dep, key, flavour)
            if pins is None:
                return
        side.set_app(key, dep, pins)
