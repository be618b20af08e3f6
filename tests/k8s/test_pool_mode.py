"""Pool mode wired: a Deployment annotated ``cfnet.io/pool-mode`` is planned per pool by the
running core and written as the framework's own object, under the unmodified upstream CRDs.

- OpenYurt: a YurtAppSet (``apps.openyurt.io/v1beta1``) whose per-pool replicas equal the
  engine's plan; one pool is known only from its NodePool object (``status.nodes``, v1beta2),
  the other from node labels; scaling the Deployment updates the object; deleting the
  Deployment removes it (ownerReference, kube-controller-manager's garbage collector).
- KubeEdge: an EdgeApplication (``apps.kubeedge.io/v1alpha1``) for a NodeGroup that lists its
  nodes in ``spec.nodes``.

The controller runs as cluster admin and under deploy/k8s's least-privilege ServiceAccount.
The objects are compared with what the server stored: a field the upstream schema does not
know would have been pruned, so equality shows they are valid under the upstream CRDs. No
yurt-manager / cloudcore runs: nothing acts on these objects here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from cloud_core.errors import KubeNotFound
from cloud_core.k8s.actuator import ActuatorConfig
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.pools import PoolController, edge_application, yurt_app_set
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.k8s.wiring import build_actuator
from tests.k8s.conftest import Cluster, wait_for

pytestmark = pytest.mark.slow


def pool_deployment(ns: str, name: str, replicas: int, flavour: str,
                    tolerate_edge: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "cfnet-scheduler", "containers": [
        {"name": "app", "image": "registry.example/app:1",
         "resources": {"requests": {"cpu": "1", "memory": "256Mi"}}}]}
    if tolerate_edge:
        spec["tolerations"] = [{"key": "node-role.kubernetes.io/edge", "operator": "Exists"}]
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name},
                         "annotations": {"cfnet.io/pool-mode": flavour}},
            "spec": {"replicas": replicas, "paused": True,
                     "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


@contextmanager
def pool_controller(client: KubeClient, identity: str, **actuator_kw: Any
                    ) -> Iterator[PoolController]:
    """An actuator with its caches synced and a pool controller on it (resync 1 s)."""
    act = build_actuator(client, NodeRegistry(), ActuatorConfig(identity=identity), **actuator_kw)
    act.start()
    try:
        assert act.wait_synced(30)
        pc = PoolController(client, act, resync_s=1.0)
        pc.start()
        try:
            yield pc
        finally:
            pc.stop()
    finally:
        act.stop()


@pytest.fixture
def pools(core_client: KubeClient, cluster: Cluster) -> Iterator[PoolController]:
    """The controller as cluster admin, and under deploy/k8s's ServiceAccount as written."""
    with pool_controller(core_client, "pool-test") as pc:
        yield pc


def test_yurtappset_follows_the_deployment(admin: KubeClient, cluster: Cluster,
                                          pools: PoolController) -> None:
    ns = cluster.namespace
    for i in range(2):
        cluster.node(f"pm-a-{i}", region="eu", cpu="2", openyurt_pool="pm-pa")
        cluster.node(f"pm-b-{i}", region="eu", cpu="2")  # pool only from the NodePool object
    np = admin.create("/apis/apps.openyurt.io/v1beta2/nodepools", {
        "apiVersion": "apps.openyurt.io/v1beta2", "kind": "NodePool",
        "metadata": {"name": "pm-pb"}, "spec": {"type": "Edge"}})
    try:
        # yurt-manager's part (it fills status.nodes from the members it sees).
        np["status"] = {"nodes": ["pm-b-0", "pm-b-1"]}
        admin.replace("/apis/apps.openyurt.io/v1beta2/nodepools/pm-pb/status", np)
        wait_for(lambda: pools.registry.membership("openyurt").get("pm-b-1") == "pm-pb",
                 what="NodePool membership read")
        dep = admin.create(f"/apis/apps/v1/namespaces/{ns}/deployments",
                           pool_deployment(ns, "pm", 6, "openyurt"))
        path = f"/apis/apps.openyurt.io/v1beta1/namespaces/{ns}/yurtappsets/pm"

        def replicas_written(n: int) -> dict[str, Any] | None:
            try:
                got = admin.get(path)
            except KubeNotFound:
                return None
            tw = got["spec"]["workload"].get("workloadTweaks") or []
            return got if sum(t["tweaks"]["replicas"] for t in tw) == n else None

        got = wait_for(lambda: replicas_written(6), timeout=30, what="YurtAppSet for 6")
        # the controller records its plan right after the write the test may have seen first
        plan = wait_for(lambda: pools.plans.get(f"{ns}/pm"), what="plan recorded")
        got = admin.get(path)
        tw = {t["pools"][0]: t["tweaks"]["replicas"] for t in got["spec"]["workload"]
              ["workloadTweaks"]}
        assert tw == plan.per_pool and set(tw) == {"pm-pa", "pm-pb"}  # 2 cpus per node
        assert got["spec"] == yurt_app_set(dep, plan)["spec"]  # nothing pruned: schema-valid
        tpl = got["spec"]["workload"]["workloadTemplate"]["deploymentTemplate"]["spec"]
        assert "paused" not in tpl and "replicas" not in tpl
        assert got["metadata"]["ownerReferences"][0]["uid"] == dep["metadata"]["uid"]
        evs = [e for e in cluster.events("PoolPlan") if e["involvedObject"]["name"] == "pm"]
        assert any("6/6" in e["message"] for e in evs)

        admin.patch(f"/apis/apps/v1/namespaces/{ns}/deployments/pm", {"spec": {"replicas": 3}})
        wait_for(lambda: replicas_written(3), timeout=30, what="YurtAppSet scaled to 3")

        admin.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/pm")

        def gone() -> bool:
            try:
                admin.get(path)
            except KubeNotFound:
                return True
            return False

        wait_for(gone, timeout=60, what="YurtAppSet removed with its Deployment")
    finally:
        admin.delete("/apis/apps.openyurt.io/v1beta2/nodepools/pm-pb")


def test_edgeapplication_for_a_nodegroup_object(admin: KubeClient, cluster: Cluster,
                                                pools: PoolController) -> None:
    ns = cluster.namespace
    for i in range(2):
        cluster.node(f"pe-{i}", region="eu", cpu="2",
                     labels={"node-role.kubernetes.io/edge": ""}, edge_taint=False)
    admin.create("/apis/apps.kubeedge.io/v1alpha1/nodegroups", {
        "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "NodeGroup",
        "metadata": {"name": "pe-g"}, "spec": {"nodes": ["pe-0", "pe-1"]}})
    try:
        # as the OpenYurt test: the group's members read before the Deployment comes (a
        # plan made earlier places nothing and is rewritten once they are)
        try:
            wait_for(lambda: pools.registry.membership("kubeedge").get("pe-1") == "pe-g",
                     what="NodeGroup membership read")
        except AssertionError as e:  # say which half is missing: the object or the node
            raise AssertionError(
                f"{e}; pool objects read from {[r.path for r in pools.extra]}, "
                f"{len(pools.extra[-1].items()) if pools.extra else 0} listed; "
                f"node pe-1: {pools.registry.get('pe-1')}") from e
        dep = admin.create(f"/apis/apps/v1/namespaces/{ns}/deployments",
                           pool_deployment(ns, "cam", 5, "kubeedge", tolerate_edge=True))
        path = f"/apis/apps.kubeedge.io/v1alpha1/namespaces/{ns}/edgeapplications/cam"
        got = wait_for(lambda: admin.get(path), timeout=30, what="EdgeApplication")
        plan = wait_for(lambda: (p := pools.plans.get(f"{ns}/cam")) is not None
                        and p.per_pool and p, what="plan with the group's nodes recorded")
        got = admin.get(path)
        assert plan.per_pool == {"pe-g": 4} and len(plan.unplaced) == 1  # 2 nodes x 2 cpus
        assert got["spec"]["workloadScope"]["targetNodeGroups"] == [
            {"name": "pe-g", "overriders": {"replicas": 4}}]
        assert got["spec"] == edge_application(dep, plan)["spec"]
    finally:
        admin.delete("/apis/apps.kubeedge.io/v1alpha1/nodegroups/pe-g")
