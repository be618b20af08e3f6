"""Pool-level placement: per-pool replica counts for OpenYurt and KubeEdge workloads.

A Deployment's replicas are placed one by one by the engine, restricted to the nodes of one
edge framework that belong to a pool; the chosen nodes are counted per pool. The counts are
written as

* OpenYurt: a ``YurtAppSet`` (``apps.openyurt.io/v1beta1``) whose ``spec.pools`` lists the
  pools with replicas and whose ``spec.workload.workloadTweaks`` sets ``replicas`` per pool;
* KubeEdge: an ``EdgeApplication`` (``apps.kubeedge.io/v1alpha1``) whose
  ``spec.workloadScope.targetNodeGroups`` carries a ``replicas`` overrider per NodeGroup.

The frameworks' own controllers then run the workloads inside each pool (edge autonomy).

:class:`PoolController` wires this into the running core: a Deployment annotated
``cfnet.io/pool-mode: openyurt`` or ``kubeedge`` is planned per pool on the loop's cluster
snapshot and written as a YurtAppSet or EdgeApplication of the same name, owned by the
Deployment (so the garbage collector removes it with the Deployment), re-planned when the
Deployment, the nodes or the pool objects change (and every ``resync_s``), and deleted when the
annotation goes. Pool membership comes from the node labels and from the NodePool (v1beta2,
``status.nodes``) and NodeGroup (``spec.nodes``, ``spec.matchLabels``) objects. The Deployment
itself is the template: create it with ``spec.paused: true`` so its own ReplicaSet makes no
pods (a Warning event says so when it is not); ``paused`` and ``replicas`` are not copied into
the framework object.

The last plan is kept on the pool object itself (annotation ``cfnet.io/pool-plan``: the
per-pool split, the replica count and digests of the pools' nodes and of the template it was
made on). A new leader reads it back from the object cfnet owns (label and ownerReference
checked, as for every write) before it plans, so it keeps the split across a failover instead
of re-splitting replicas between equal pools.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cloud_core.errors import CoreError, KubeConflict, KubeError, KubeNotFound, SpecError
from cloud_core.k8s.actuator import Actuator, parse_workload, run_engine
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.informer import Reflector, obj_key
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.placement.model import ClusterSnapshot

log = logging.getLogger(__name__)

POOL_MODE = "cfnet.io/pool-mode"
FLAVOURS = ("openyurt", "kubeedge")
NODEPOOLS = "/apis/apps.openyurt.io/v1beta2/nodepools"
NODEGROUPS = "/apis/apps.kubeedge.io/v1alpha1/nodegroups"

POOL_APIS = ((NODEPOOLS, "openyurt"), (NODEGROUPS, "kubeedge"))
# An API the server does not serve (the framework's CRDs not installed) is asked for again this
# often, so a framework installed after the core starts is read without a restart.
NOT_SERVED_RETRY_S = 60.0

# The most replicas cfnet plans for one pool-mode Deployment: each is a workload the engine
# places, so a tenant's ``replicas: 2000000`` is refused (an event names the bound) before
# anything is expanded, instead of costing the core gigabytes and minutes.
MAX_POOL_REPLICAS = 1000
# The label cfnet puts on the pool objects it creates. It updates or deletes only an object
# carrying it *and* an ownerReference to the Deployment it plans for; any other object of
# that name (the platform team's, another tool's) is never adopted.
MANAGED_BY = "app.kubernetes.io/managed-by"
CFNET = "cfnet"

# On the pool object: the plan it carries and what it was made on (read back by a new leader)
PLAN_NOTE = "cfnet.io/pool-plan"
MAX_NOTE_BYTES = 64 * 1024

YURT_API = "apps.openyurt.io/v1beta1"
KUBEEDGE_API = "apps.kubeedge.io/v1alpha1"


@dataclass(frozen=True)
class PoolPlan:
    """Where the replicas of one app go, pool by pool."""

    app: str
    flavour: str  # "openyurt" | "kubeedge"
    replicas: int
    per_pool: dict[str, int]
    assignments: dict[str, str]  # replica id → node
    unplaced: dict[str, str]  # replica id → engine's reason

    @property
    def placed(self) -> int:
        return sum(self.per_pool.values())


class NotOwned(CoreError):
    """A pool object of that name exists and cfnet did not create it for this Deployment."""


def pool_replicas(deployment: JSON) -> int:
    """``spec.replicas`` (default 1), bounded before anything is expanded (SpecError)."""
    raw = (deployment.get("spec") or {}).get("replicas", 1)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise SpecError("spec.replicas", f"{str(raw)[:40]!r} is not a replica count")
    if raw > MAX_POOL_REPLICAS:
        raise SpecError("spec.replicas", f"{raw} is more than cfnet plans for one pool-mode "
                        f"Deployment ({MAX_POOL_REPLICAS})")
    return raw


def owned_by(obj: JSON, deployment: JSON) -> bool:
    """``obj`` was created by cfnet for ``deployment``: cfnet's label and an ownerReference
    to that Deployment's uid."""
    md = obj.get("metadata") or {}
    uid = (deployment.get("metadata") or {}).get("uid")
    if (md.get("labels") or {}).get(MANAGED_BY) != CFNET:
        return False
    # a Deployment not read from the API server (no uid: a plan made by hand) is written
    # without an ownerReference, so only the label can say it
    return not uid or any(o.get("kind") == "Deployment" and o.get("uid") == uid
                          for o in md.get("ownerReferences") or [])


def _replica_pod(deployment: JSON, app: str, i: int) -> JSON:
    tpl = (deployment.get("spec") or {}).get("template") or {}
    md = copy.deepcopy(tpl.get("metadata") or {})
    md.update({"name": f"{app}-{i}", "uid": f"{app}-replica-{i}",
               "namespace": (deployment.get("metadata") or {}).get("namespace", "default")})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": copy.deepcopy(tpl.get("spec") or {})}


def plan_pools(snapshot: ClusterSnapshot, registry: NodeRegistry, deployment: JSON,
               flavour: str, *, engine_config: Any = None) -> PoolPlan:
    """Place ``deployment``'s replicas on pooled nodes of ``flavour``; count them per pool."""
    app = str((deployment.get("metadata") or {}).get("name"))
    replicas = pool_replicas(deployment)
    pool_of = registry.membership(flavour)
    snap = replace(snapshot, nodes=tuple(n for n in snapshot.nodes if n.name in pool_of))
    workloads = [parse_workload(_replica_pod(deployment, app, i)) for i in range(replicas)]
    out = run_engine(snap, workloads, engine_config)
    per_pool = Counter(str(pool_of[n]) for n in out.assignments.values())
    return PoolPlan(app=app, flavour=flavour, replicas=replicas,
                    per_pool=dict(sorted(per_pool.items())), assignments=dict(out.assignments),
                    unplaced=dict(out.failures))


def _template_spec(obj: JSON) -> None:
    """The Deployment as a template: its own replica count and pause are not the pools'."""
    spec = obj.setdefault("spec", {})
    spec.pop("paused", None)
    spec.pop("replicas", None)


def _owned(obj: JSON, deployment: JSON) -> JSON:
    md = deployment.get("metadata") or {}
    obj["metadata"]["ownerReferences"] = [{
        "apiVersion": "apps/v1", "kind": "Deployment", "name": md.get("name"),
        "uid": md.get("uid"), "controller": False, "blockOwnerDeletion": False}]
    return obj


def yurt_app_set(deployment: JSON, plan: PoolPlan) -> JSON:
    """A YurtAppSet running ``deployment`` with ``plan``'s replicas in each NodePool."""
    md = deployment.get("metadata") or {}
    tpl = copy.deepcopy(deployment)
    tpl.pop("apiVersion", None)
    tpl.pop("kind", None)
    tpl.pop("status", None)
    tpl["metadata"] = {"labels": dict(md.get("labels") or {})}
    _template_spec(tpl)
    pools = [p for p, n in plan.per_pool.items() if n > 0]
    return {
        "apiVersion": YURT_API, "kind": "YurtAppSet",
        "metadata": {"name": md.get("name"), "namespace": md.get("namespace", "default"),
                     "annotations": {"cfnet.io/placed-replicas": str(plan.placed),
                                     "cfnet.io/requested-replicas": str(plan.replicas)}},
        "spec": {
            "pools": pools,
            "workload": {
                "workloadTemplate": {"deploymentTemplate": tpl},
                "workloadTweaks": [{"pools": [p], "tweaks": {"replicas": plan.per_pool[p]}}
                                   for p in pools],
            },
        },
    }


def edge_application(deployment: JSON, plan: PoolPlan) -> JSON:
    """An EdgeApplication running ``deployment`` with per-NodeGroup replica overrides."""
    md = deployment.get("metadata") or {}
    manifest = copy.deepcopy(deployment)
    manifest.setdefault("apiVersion", "apps/v1")
    manifest.setdefault("kind", "Deployment")
    manifest.pop("status", None)
    manifest["metadata"] = {"name": md.get("name"), "namespace": md.get("namespace", "default"),
                            "labels": dict(md.get("labels") or {})}
    _template_spec(manifest)
    return {
        "apiVersion": KUBEEDGE_API, "kind": "EdgeApplication",
        "metadata": {"name": md.get("name"), "namespace": md.get("namespace", "default"),
                     "annotations": {"cfnet.io/placed-replicas": str(plan.placed),
                                     "cfnet.io/requested-replicas": str(plan.replicas)}},
        "spec": {
            "workloadTemplate": {"manifests": [manifest]},
            "workloadScope": {"targetNodeGroups": [
                {"name": g, "overriders": {"replicas": n}}
                for g, n in plan.per_pool.items() if n > 0]},
        },
    }


def plan_note(plan: PoolPlan, members: str, template: str) -> str:
    """The ``cfnet.io/pool-plan`` annotation: the split and the digests it was made on."""
    return json.dumps({"replicas": plan.replicas, "per_pool": plan.per_pool,
                       "members": members, "template": template}, sort_keys=True)


def read_note(obj: JSON, app: str, flavour: str) -> tuple[PoolPlan, str, str] | None:
    """The plan, members and template digests ``obj`` carries (None: none, or malformed)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(PLAN_NOTE)
    if not isinstance(raw, str) or len(raw) > MAX_NOTE_BYTES:
        return None
    try:
        note = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(note, dict):
        return None
    reps, per_pool = note.get("replicas"), note.get("per_pool")
    members, template = note.get("members"), note.get("template")
    if (type(reps) is not int or not 0 <= reps <= MAX_POOL_REPLICAS
            or not isinstance(per_pool, dict) or len(per_pool) > MAX_POOL_REPLICAS
            or not all(isinstance(k, str) and type(v) is int and 0 <= v <= reps
                       for k, v in per_pool.items())
            or sum(per_pool.values()) > reps
            or not isinstance(members, str) or not isinstance(template, str)):
        log.warning("%s on %s is malformed: ignored", PLAN_NOTE, obj_key(obj))
        return None
    plan = PoolPlan(app=app, flavour=flavour, replicas=reps, per_pool=dict(per_pool),
                    assignments={}, unplaced={})
    return plan, members, template


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]


def apply_pool_plan(client: KubeClient, deployment: JSON, plan: PoolPlan,
                    note: str | None = None) -> JSON:
    """Create or update the framework object for ``plan``; returns what the server stored.

    An existing object is replaced only when cfnet created it for this Deployment
    (:func:`owned_by`); otherwise :class:`NotOwned` (never adopted). The replace carries the
    live resourceVersion, so an object that changed hands meanwhile is a conflict."""
    obj = yurt_app_set(deployment, plan) if plan.flavour == "openyurt" else \
        edge_application(deployment, plan)
    obj["metadata"].setdefault("labels", {})[MANAGED_BY] = CFNET
    if note is not None:
        obj["metadata"]["annotations"][PLAN_NOTE] = note
    if (deployment.get("metadata") or {}).get("uid"):
        obj = _owned(obj, deployment)
    md = obj["metadata"]
    coll = client.resource_path(str(obj["apiVersion"]), str(obj["kind"]), md.get("namespace"))
    try:
        return client.create(coll, obj)
    except KubeConflict:
        path = f"{coll}/{md['name']}"
        live = client.get(path)
        if not owned_by(live, deployment):
            raise NotOwned(f"{obj['kind']} {md.get('namespace')}/{md['name']} exists and was "
                           f"not created by cfnet for this Deployment (label {MANAGED_BY}="
                           f"{CFNET} and an ownerReference to it): cfnet does not adopt "
                           "it") from None
        body = {**obj, "metadata": {**md, "resourceVersion":
                                    live["metadata"]["resourceVersion"]}}
        return client.replace(path, body)


def _template_digest(deployment: JSON) -> str:
    spec = dict(deployment.get("spec") or {})
    spec.pop("replicas", None)
    md = deployment.get("metadata") or {}
    return json.dumps([spec, md.get("labels"), md.get("annotations")], sort_keys=True)


def _pool_path(flavour: str, ns: str, name: str) -> str:
    if flavour == "openyurt":
        return f"/apis/{YURT_API}/namespaces/{ns}/yurtappsets/{name}"
    return f"/apis/{KUBEEDGE_API}/namespaces/{ns}/edgeapplications/{name}"


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
        self._written: dict[tuple[str, str], tuple[str, str]] = {}  # (ns, name) -> (flav, spec)
        self._warned: set[str] = set()
        self._owner: dict[tuple[str, str], str] = {}  # (ns, name) -> Deployment uid written for
        self._failed: dict[tuple[str, str], str] = {}  # (ns, name) -> last failure told
        self._members: dict[tuple[str, str], str] = {}  # digest of the pools planned on
        self._template: dict[tuple[str, str], str] = {}  # digest of the template planned
        self._forget = False  # leadership changed: read the plans back from the objects
        self.plans: dict[str, PoolPlan] = {}  # "ns/name" -> last plan written
        self.deployments = Reflector(client, "/apis/apps/v1/deployments", self._changed,
                                     name="deployments")
        self.extra: list[Reflector] = []
        self._unread: dict[str, float] = {path: 0.0 for path, _ in POOL_APIS}  # -> next probe
        self._probe_error: dict[str, str] = {}  # path -> last failure logged
        self._thread: threading.Thread | None = None

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

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.resync_s)
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

    def forget_plans(self) -> None:
        """Leadership changed (any thread): the plans in memory may be stale; the pool
        objects hold the last ones (read back before planning, ``_restore``)."""
        self._forget = True
        self._wake.set()

    def _forget_now(self) -> None:
        self._forget = False
        for d in (self._written, self._owner, self._members, self._template, self.plans):
            d.clear()

    def _restore(self, dep: JSON, key: tuple[str, str], flavour: str) -> bool:
        """Take the last plan from the pool object cfnet wrote for ``dep`` (a new leader);
        False if it could not be read (the Deployment waits for the next round)."""
        try:
            live = self.client.get(_pool_path(flavour, *key))
        except KubeNotFound:
            return True
        except KubeError as e:
            log.info("reading the %s object of %s failed, will retry: %s", flavour,
                     obj_key(dep), e)
            return False
        if not owned_by(live, dep):
            return True  # never adopted: the write says NotOwned
        got = read_note(live, key[1], flavour)
        if got is not None:
            plan, members, template = got
            self._written[key] = (flavour, "")
            self._owner[key] = str((dep.get("metadata") or {}).get("uid") or "")
            self._members[key], self._template[key] = members, template
            self.plans[obj_key(dep)] = plan
        return True

    def reconcile(self) -> int:
        """Write what changed; delete objects whose Deployment left pool mode. Returns writes."""
        writes = 0
        seen: set[tuple[str, str]] = set()
        snap = self.actuator.snapshot()
        for dep in self.deployments.items():
            md = dep.get("metadata") or {}
            flavour = (md.get("annotations") or {}).get(POOL_MODE)
            if flavour not in FLAVOURS or md.get("deletionTimestamp"):
                continue
            key = (str(md.get("namespace")), str(md.get("name")))
            seen.add(key)
            # one tenant's Deployment (a refused spec, a name taken, a failed write) never
            # stops the others': its failure is its own event
            try:
                writes += self._reconcile_one(dep, key, str(flavour), snap)
            except Exception as e:
                reason = ("PoolObjectNotOwned" if isinstance(e, NotOwned) else
                          "PoolPlanRefused" if isinstance(e, SpecError) else "PoolPlanFailed")
                msg = f"cfnet did not write the {flavour} pool object: {e}"
                if self._failed.get(key) != msg:
                    self._failed[key] = msg
                    log.warning("%s: %s", obj_key(dep), msg)
                    self._event(dep, reason, "Warning", msg)
        for key in [k for k in self._written if k not in seen]:
            self._delete(key, self._written[key][0])
        return writes

    def _reconcile_one(self, dep: JSON, key: tuple[str, str], flavour: str,
                       snap: ClusterSnapshot) -> int:
        """Plan and write one Deployment's pool object; 1 if written (raises what stops it:
        the caller turns that into this Deployment's event)."""
        if key not in self._written and not self._restore(dep, key, flavour):
            return 0
        plan = plan_pools(snap, self.registry, dep, flavour,
                          engine_config=self.actuator.config.engine_config)
        pool_of = self.registry.membership(flavour)
        members = _digest({n.name: f"{pool_of[n.name]} {n.capacity} {n.health}"
                           for n in snap.nodes if n.name in pool_of})
        template = _digest(_template_digest(dep))
        last = self.plans.get(obj_key(dep))
        if (last is not None and self._written.get(key, ("",))[0] == flavour
                and last.replicas == plan.replicas and plan.placed == last.placed
                and self._members.get(key) == members
                and self._template.get(key) == template):
            # Nothing that decides the plan changed (the template, the replica count,
            # the pools' nodes, their capacity and health) and the new one places no
            # more replicas: a time-limited solver may split equal pools differently from
            # run to run, and moving replicas between pools for that would churn the edge.
            return 0
        obj = yurt_app_set(dep, plan) if flavour == "openyurt" else edge_application(dep, plan)
        digest = json.dumps(obj, sort_keys=True)
        if self._written.get(key) == (flavour, digest):
            return 0
        try:
            apply_pool_plan(self.client, dep, plan, plan_note(plan, members, template))
        except KubeError as e:  # NotOwned is no KubeError: the caller tells the tenant
            log.warning("writing the %s object for %s failed: %s", flavour, obj_key(dep), e)
            return 0  # retried on the next round
        self._failed.pop(key, None)
        old = self._written.get(key)
        if old is not None and old[0] != flavour:
            self._delete(key, old[0])
        self._written[key] = (flavour, digest)
        self._owner[key] = str((dep.get("metadata") or {}).get("uid") or "")
        self._members[key] = members
        self._template[key] = template
        self.plans[obj_key(dep)] = plan
        self._event(dep, "PoolPlan", "Normal",
                    f"cfnet placed {plan.placed}/{plan.replicas} replicas per pool "
                    f"({flavour}): " + (", ".join(f"{p} {n}" for p, n in
                                                  plan.per_pool.items()) or "none")
                    + (f"; {len(plan.unplaced)} unplaced: "
                       f"{next(iter(plan.unplaced.values()))}" if plan.unplaced else ""))
        if not (dep.get("spec") or {}).get("paused") and obj_key(dep) not in self._warned:
            self._warned.add(obj_key(dep))
            self._event(dep, "PoolModeNotPaused", "Warning",
                        "pool-mode Deployment is not paused: its own ReplicaSet runs "
                        "replicas too; set spec.paused: true to use it as a template only")
        return 1

    def _delete(self, key: tuple[str, str], flavour: str) -> None:
        """Delete the pool object cfnet wrote for ``key``, only if it still is cfnet's (its
        label and an ownerReference to the Deployment it was written for), with the uid and
        resourceVersion read as preconditions: never an object that changed hands."""
        path = _pool_path(flavour, *key)
        try:
            live = self.client.get(path)
            lmd = live.get("metadata") or {}
            if owned_by(live, {"metadata": {"uid": self._owner.get(key)}}):
                self.client.request("DELETE", path, body={
                    "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {
                        "uid": lmd.get("uid"), "resourceVersion": lmd.get("resourceVersion")}})
            else:
                log.warning("not deleting %s: it is not the object cfnet wrote", path)
        except KubeNotFound:
            pass
        except KubeError as e:
            log.warning("deleting the %s object %s/%s failed: %s", flavour, *key, e)
            return
        self._written.pop(key, None)
        self._owner.pop(key, None)
        self._failed.pop(key, None)
        self._members.pop(key, None)
        self._template.pop(key, None)
        self.plans.pop("/".join(key), None)

    def _event(self, dep: JSON, reason: str, event_type: str, message: str) -> None:
        obj = {**dep, "apiVersion": "apps/v1", "kind": "Deployment"}
        try:
            self.client.emit_event(obj, reason=reason, message=message, event_type=event_type,
                                   instance=self.actuator.config.identity)
        except KubeError as e:
            log.warning("%s event for %s lost: %s", reason, obj_key(dep), e)
