"""The pool objects cfnet writes, and what they carry: rendering, ownership, the plan note.

A pool-mode Deployment's per-pool replica counts (decided by the decision loop: ``pool_loop.py``)
are written as

* OpenYurt: a ``YurtAppSet`` (``apps.openyurt.io/v1beta1``) whose ``spec.pools`` lists the
  pools with replicas and whose ``spec.workload.workloadTweaks`` sets ``replicas`` per pool;
* KubeEdge: an ``EdgeApplication`` (``apps.kubeedge.io/v1alpha1``) whose
  ``spec.workloadScope.targetNodeGroups`` carries a ``replicas`` overrider per NodeGroup.

cfnet creates, replaces or deletes only an object carrying its label *and* an ownerReference
to the Deployment it plans for (:func:`owned_by`); any other object of that name is never
adopted (:class:`NotOwned`). The last plan rides on the object (annotation
``cfnet.io/pool-plan``: the split per pool and per node, the replica count and a digest of
the template it was made on), read back by a new leader (:func:`read_note`), bounded in size
and shape, what is malformed ignored.

Which file to touch: this one for what is written; ``pool_loop.py`` for how the counts are
decided (the loop's source and sink); ``pools.py`` for the controller (Deployments, pool
membership objects, leadership, events).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from cloud_core.errors import CoreError, SpecError
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.informer import obj_key

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
    # node -> replicas there, when read back from a note (``assignments`` is then empty)
    per_node: dict[str, int] = field(default_factory=dict)

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
        "metadata": _object_metadata(md, plan),
        "spec": {
            "pools": pools,
            "workload": {
                "workloadTemplate": {"deploymentTemplate": tpl},
                "workloadTweaks": [{"pools": [p], "tweaks": {"replicas": plan.per_pool[p]}}
                                   for p in pools],
            },
        },
    }


def _object_metadata(md: JSON, plan: PoolPlan) -> JSON:
    """The pool object's name and namespace (the Deployment's) and the plan's counts."""
    return {"name": md.get("name"), "namespace": md.get("namespace", "default"),
            "annotations": {"cfnet.io/placed-replicas": str(plan.placed),
                            "cfnet.io/requested-replicas": str(plan.replicas)}}


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
        "metadata": _object_metadata(md, plan),
        "spec": {
            "workloadTemplate": {"manifests": [manifest]},
            "workloadScope": {"targetNodeGroups": [
                {"name": g, "overriders": {"replicas": n}}
                for g, n in plan.per_pool.items() if n > 0]},
        },
    }


def plan_note(plan: PoolPlan, members: str, template: str) -> str:
    """The ``cfnet.io/pool-plan`` annotation: the split per pool and per node, and the digests
    it was made on. The per-node split is left out when it would not fit ``MAX_NOTE_BYTES``
    (a new leader then places the replicas afresh)."""
    note: dict[str, Any] = {"replicas": plan.replicas, "per_pool": plan.per_pool,
                            "members": members, "template": template}
    nodes = plan.per_node or dict(Counter(plan.assignments.values()))
    full = json.dumps({**note, "nodes": dict(sorted(nodes.items()))}, sort_keys=True)
    return full if len(full) <= MAX_NOTE_BYTES else json.dumps(note, sort_keys=True)


def _counts(value: Any, most: int) -> TypeGuard[dict[str, int]]:
    """``value`` is a bounded {name: count} map whose counts sum to at most ``most``."""
    return (isinstance(value, dict) and len(value) <= MAX_POOL_REPLICAS
            and all(isinstance(k, str) and len(k) <= 253 and type(v) is int and 0 <= v <= most
                    for k, v in value.items())
            and sum(value.values()) <= most)


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
    nodes = note.get("nodes", {})
    members, template = note.get("members"), note.get("template")
    if (type(reps) is not int or not 0 <= reps <= MAX_POOL_REPLICAS
            or not _counts(per_pool, reps) or not _counts(nodes, reps)
            or not isinstance(members, str) or not isinstance(template, str)):
        log.warning("%s on %s is malformed: ignored", PLAN_NOTE, obj_key(obj))
        return None
    plan = PoolPlan(app=app, flavour=flavour, replicas=reps, per_pool=dict(per_pool),
                    assignments={}, unplaced={}, per_node=dict(nodes))
    return plan, members, template


def digest(value: Any) -> str:
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

    def mine(live: JSON) -> None:
        if not owned_by(live, deployment):
            raise NotOwned(f"{obj['kind']} {md.get('namespace')}/{md['name']} exists and was "
                           f"not created by cfnet for this Deployment (label {MANAGED_BY}="
                           f"{CFNET} and an ownerReference to it): cfnet does not adopt "
                           "it") from None

    return client.apply(obj, guard=mine)


def template_digest(deployment: JSON) -> str:
    spec = dict(deployment.get("spec") or {})
    spec.pop("replicas", None)
    md = deployment.get("metadata") or {}
    return json.dumps([spec, md.get("labels"), md.get("annotations")], sort_keys=True)


def pool_path(flavour: str, ns: str, name: str) -> str:
    if flavour == "openyurt":
        return f"/apis/{YURT_API}/namespaces/{ns}/yurtappsets/{name}"
    return f"/apis/{KUBEEDGE_API}/namespaces/{ns}/edgeapplications/{name}"


