"""Pool-level placement: per-pool replica counts for OpenYurt and KubeEdge workloads.

A Deployment's replicas are placed one by one by the engine, restricted to the nodes of one
edge framework that belong to a pool; the chosen nodes are counted per pool. The counts are
written as

* OpenYurt: a ``YurtAppSet`` (``apps.openyurt.io/v1beta1``) whose ``spec.pools`` lists the
  pools with replicas and whose ``spec.workload.workloadTweaks`` sets ``replicas`` per pool;
* KubeEdge: an ``EdgeApplication`` (``apps.kubeedge.io/v1alpha1``) whose
  ``spec.workloadScope.targetNodeGroups`` carries a ``replicas`` overrider per NodeGroup.

The frameworks' own controllers then run the workloads inside each pool (edge autonomy).
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from cloud_core.k8s.actuator import parse_workload, run_engine
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.placement.model import ClusterSnapshot

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
    replicas = int((deployment.get("spec") or {}).get("replicas", 1))
    pool_of = {r.name: r.pool for r in registry.records() if r.flavour == flavour and r.pool}
    snap = replace(snapshot, nodes=tuple(n for n in snapshot.nodes if n.name in pool_of))
    workloads = [parse_workload(_replica_pod(deployment, app, i)) for i in range(replicas)]
    out = run_engine(snap, workloads, engine_config)
    per_pool = Counter(str(pool_of[n]) for n in out.assignments.values())
    return PoolPlan(app=app, flavour=flavour, replicas=replicas,
                    per_pool=dict(sorted(per_pool.items())), assignments=dict(out.assignments),
                    unplaced=dict(out.failures))


def yurt_app_set(deployment: JSON, plan: PoolPlan) -> JSON:
    """A YurtAppSet running ``deployment`` with ``plan``'s replicas in each NodePool."""
    md = deployment.get("metadata") or {}
    tpl = copy.deepcopy(deployment)
    tpl.pop("apiVersion", None)
    tpl.pop("kind", None)
    tpl["metadata"] = {"labels": dict(md.get("labels") or {})}
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


def apply_pool_plan(client: KubeClient, deployment: JSON, plan: PoolPlan) -> JSON:
    """Create or update the framework object for ``plan``; returns what the server stored."""
    obj = yurt_app_set(deployment, plan) if plan.flavour == "openyurt" else \
        edge_application(deployment, plan)
    return client.apply(obj)
