"""Pool-level placement written to OpenYurt YurtAppSets and KubeEdge EdgeApplications (the
frameworks' unmodified upstream CRDs, tests/k8s/upstream-crds, installed in the real API
server), under the core's ServiceAccount."""

from __future__ import annotations

from typing import Any

import pytest

from cloud_core.errors import KubeError
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.pools import apply_pool_plan, plan_pools
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.placement import ClusterSnapshot
from tests.k8s.conftest import Cluster

pytestmark = pytest.mark.slow


def deployment(ns: str, name: str, replicas: int, *, residency: str,
               tolerate_edge: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "cfnet-scheduler",
        "containers": [{"name": "app", "image": "registry.example/app:1",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
    if tolerate_edge:
        spec["tolerations"] = [{"key": "node-role.kubernetes.io/edge", "operator": "Exists"}]
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name},
                                               "annotations": {"cfnet.io/residency": residency}},
                                  "spec": spec}}}


@pytest.fixture
def pooled(cluster: Cluster, service_account_client: KubeClient) -> tuple[NodeRegistry,
                                                                           ClusterSnapshot]:
    for pool, region in (("oy-eu-1", "eu-west"), ("oy-eu-2", "eu-central"), ("oy-us", "us-east")):
        for i in range(3):
            cluster.node(f"{pool}-{i}", region=region, openyurt_pool=pool)
    for group, region in (("ke-eu", "eu-west"), ("ke-us", "us-east")):
        for i in range(3):
            cluster.node(f"{group}-{i}", region=region, kubeedge_group=group)
    reg = NodeRegistry()
    for n in service_account_client.list("/api/v1/nodes")[0]:
        reg.upsert(n)
    return reg, ClusterSnapshot(nodes=reg.node_infos(), links={}, now=0.0)


def test_yurtappset_per_pool_replicas(cluster: Cluster, service_account_client: KubeClient,
                                      pooled: tuple[NodeRegistry, ClusterSnapshot]) -> None:
    reg, snap = pooled
    dep = deployment(cluster.namespace, "web", 12, residency="eu-west,eu-central")
    plan = plan_pools(snap, reg, dep, "openyurt")
    assert plan.placed == 12 and not plan.unplaced
    assert set(plan.per_pool) <= {"oy-eu-1", "oy-eu-2"}
    stored = apply_pool_plan(service_account_client, dep, plan)
    got = service_account_client.get(
        f"/apis/apps.openyurt.io/v1beta1/namespaces/{cluster.namespace}/yurtappsets/web")
    assert got["metadata"]["uid"] == stored["metadata"]["uid"]
    tweaks = got["spec"]["workload"]["workloadTweaks"]
    assert {t["pools"][0]: t["tweaks"]["replicas"] for t in tweaks} == plan.per_pool
    assert sorted(got["spec"]["pools"]) == sorted(plan.per_pool)
    tpl = got["spec"]["workload"]["workloadTemplate"]["deploymentTemplate"]
    assert tpl["spec"]["template"]["spec"]["schedulerName"] == "cfnet-scheduler"
    # Re-planning updates the same object (scale down to 5).
    dep["spec"]["replicas"] = 5
    plan2 = plan_pools(snap, reg, dep, "openyurt")
    apply_pool_plan(service_account_client, dep, plan2)
    got = service_account_client.get(
        f"/apis/apps.openyurt.io/v1beta1/namespaces/{cluster.namespace}/yurtappsets/web")
    assert sum(t["tweaks"]["replicas"] for t in got["spec"]["workload"]["workloadTweaks"]) == 5


def test_edgeapplication_per_nodegroup_overrides(
        cluster: Cluster, service_account_client: KubeClient,
        pooled: tuple[NodeRegistry, ClusterSnapshot]) -> None:
    reg, snap = pooled
    # 3 eu-west edge nodes x 4 cores: room for 12 one-core replicas, not 20.
    dep = deployment(cluster.namespace, "cam", 20, residency="eu-west", tolerate_edge=True)
    plan = plan_pools(snap, reg, dep, "kubeedge")
    assert plan.per_pool == {"ke-eu": 12}
    assert len(plan.unplaced) == 8
    assert all("cpu" in r for r in plan.unplaced.values())
    apply_pool_plan(service_account_client, dep, plan)
    got = service_account_client.get(
        f"/apis/apps.kubeedge.io/v1alpha1/namespaces/{cluster.namespace}/edgeapplications/cam")
    groups = got["spec"]["workloadScope"]["targetNodeGroups"]
    assert groups == [{"name": "ke-eu", "overriders": {"replicas": 12}}]
    assert got["spec"]["workloadTemplate"]["manifests"][0]["kind"] == "Deployment"
    assert got["metadata"]["annotations"]["cfnet.io/placed-replicas"] == "12"


def test_crd_schema_rejects_bad_overrides(cluster: Cluster, admin: KubeClient) -> None:
    with pytest.raises(KubeError) as ei:
        admin.create(f"/apis/apps.kubeedge.io/v1alpha1/namespaces/{cluster.namespace}/"
                     "edgeapplications", {
                         "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
                         "metadata": {"name": "bad"},
                         "spec": {"workloadScope": {"targetNodeGroups": [
                             {"name": "g", "overriders": {"replicas": "many"}}]}}})
    assert ei.value.status == 422
