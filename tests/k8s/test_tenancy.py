"""A cluster shared by tenants, against a real API server.

Each tenant is a real RBAC identity: a ServiceAccount bound to the ``admin`` ClusterRole in
its own namespace only. The core runs as ``cfnet-core --kubernetes`` runs it
(``start_kubernetes``: leader election, actuator, pool controller) with the ServiceAccount
and RBAC of ``deploy/k8s``. In each test a canary pod in another namespace must be bound
within 10 s while the tenant does its worst, and the core's memory stays within what the
chart's limit allows (``tests/k8s/tenants.py``: ``running_core``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from cloud_core.errors import KubeError
from cloud_core.k8s.client import KubeClient
from cloud_core.placement.model import COUNT_MAX
from tests.k8s.conftest import Cluster, wait_for
from tests.k8s.tenants import CANARY_S, MIB, Tenant, bound_within, rss_bytes, running_core
from tools.envtest import ControlPlane

MAX64 = 2**63 - 1


def _container(cpu: str, name: str = "app") -> dict[str, Any]:
    return {"name": name, "image": "registry.example/app:1",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}


def test_int64_requests_of_another_schedulers_pod(
        control_plane: ControlPlane, cluster: Cluster, tenant: Tenant,
        service_account_client: KubeClient) -> None:
    """A pod bound by ``nodeName`` whose containers each ask for int64's
    maximum of cpu fills its node for cfnet (with an event), and nothing else."""
    n1, n2 = f"{cluster.namespace}-n1", f"{cluster.namespace}-n2"
    cluster.node(n1, region="eu", cpu="4")
    cluster.node(n2, region="eu", cpu="4")
    with running_core(service_account_client, f"core-{cluster.namespace}") as core:
        tenant.pod("hog", [_container(f"{MAX64}m", f"c{i}") for i in range(3)],
                   schedulerName="default-scheduler", nodeName=n1)
        tenant.pod("greedy", [_container(f"{MAX64}m", f"c{i}") for i in range(3)])
        for i in range(3):
            node = bound_within(cluster, f"canary-{i}")
            assert node != n1, "a node holding the int64 pod takes no cpu-requesting pod"
        ev = wait_for(lambda: tenant.events("RequestsUncountable"), timeout=10,
                      what="a RequestsUncountable event on the hog pod")
        assert ev[0]["involvedObject"]["name"] == "hog"
        assert str(COUNT_MAX) in ev[0]["message"] and n1 in ev[0]["message"]
        fs = wait_for(lambda: [e for e in tenant.events("FailedScheduling")
                               if e["involvedObject"]["name"] == "greedy"], timeout=10,
                      what="the tenant's own int64 pod refused by name")
        assert "more than cfnet counts" in fs[0]["message"]
        assert core.actuator.stats.uncountable >= 1


def test_unschedulable_backlog_with_deletions_does_not_starve_another_namespace(
        control_plane: ControlPlane, cluster: Cluster, tenant: Tenant,
        service_account_client: KubeClient) -> None:
    """Distinct unschedulable pods plus a stream of deletions of bound pods in
    one namespace; another namespace's pods are bound within 10 s, and the deletions do not
    make every unschedulable pod eligible again (queueing hints)."""
    backlog = 300
    n1 = f"{cluster.namespace}-n1"
    cluster.node(n1, region="eu", cpu="8")
    with running_core(service_account_client, f"core-{cluster.namespace}") as core:
        q = core.actuator.queue
        for i in range(backlog):
            tenant.pod(f"big-{i}", [_container(f"{100 + i}")])  # fits no node, all distinct
        pool = [f"busy-{i}" for i in range(20)]
        for n in pool:
            tenant.pod(n, [_container("10m")], schedulerName="default-scheduler", nodeName=n1)
        wait_for(lambda: core.actuator.stats.failed_scheduling >= backlog, timeout=60,
                 what=f"the core trying all {backlog} backlog pods once")
        stop = threading.Event()
        deleted = [0]

        def churn() -> None:
            k = len(pool)
            while not stop.wait(0.05):  # 20 deletions (and creations) a second
                victim = pool.pop(0)
                with contextlib.suppress(KubeError):
                    tenant.c.delete(f"/api/v1/namespaces/{tenant.ns}/pods/{victim}",
                                    grace_period_s=0)
                    deleted[0] += 1
                with contextlib.suppress(KubeError):
                    tenant.pod(f"busy-{k}", [_container("10m")],
                               schedulerName="default-scheduler", nodeName=n1)
                pool.append(f"busy-{k}")
                k += 1

        moved0 = q.stats.moved_by_event
        t = threading.Thread(target=churn, daemon=True)
        t.start()
        try:
            for i in range(3):
                bound_within(cluster, f"canary-{i}")
            wait_for(lambda: deleted[0] >= 40, timeout=30, what="40 deletions")
        finally:
            stop.set()
            t.join(10)
        # Every deletion once made every unschedulable pod eligible: here the hint says the
        # freed 10m helps none of them (each asks for more than the node has).
        assert q.stats.skipped_by_hint >= backlog * 10, q.stats
        assert q.stats.moved_by_event == moved0, (
            f"{q.stats.moved_by_event - moved0} backlog pods moved back by {deleted[0]} "
            "deletions that could help none of them")


def test_gangs_are_per_namespace(control_plane: ControlPlane, cluster: Cluster,
                                 admin: KubeClient, service_account_client: KubeClient) -> None:
    """Tenant A's gang ``train`` is not blocked by tenant B's gang ``train``
    (which cannot fit), and B's FailedScheduling names B's gang (namespace/name)."""
    a, b = Tenant(control_plane, admin), Tenant(control_plane, admin)
    try:
        cluster.node(f"{cluster.namespace}-n1", region="eu", cpu="4")
        with running_core(service_account_client, f"core-{cluster.namespace}"):
            # B's members fit no node (5 cpus each on a 4-cpu node); A's do. With one gang
            # name for both, a batch holding all four refused A's too (all or nothing)
            for t, cpu in ((b, "5"), (a, "1")):
                for i in range(2):
                    t.pod(f"w{i}", [_container(cpu)], annotations={"cfnet.io/gang": "train"})

            def a_bound() -> bool:
                pods = a.c.list(f"/api/v1/namespaces/{a.ns}/pods")[0]
                return len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods)

            wait_for(a_bound, timeout=CANARY_S, what="tenant A's gang bound")
            fs = wait_for(lambda: b.events("FailedScheduling"), timeout=10,
                          what="tenant B's gang refused")
            assert f"gang {b.ns}/train" in fs[0]["message"]
            bound_within(cluster, "canary")
    finally:
        a.close()
        b.close()


def _pool_deployment(ns: str, name: str, replicas: Any,
                     annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "cfnet-scheduler",
                            "containers": [_container("100m")]}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name},
                         "annotations": {"cfnet.io/pool-mode": "openyurt"}},
            "spec": {"replicas": replicas, "paused": True,
                     "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name},
                                               "annotations": annotations or {}},
                                  "spec": spec}}}


def _yas(ns: str, name: str) -> str:
    return f"/apis/apps.openyurt.io/v1beta1/namespaces/{ns}/yurtappsets/{name}"


def test_pool_controller_owns_isolates_and_bounds(
        control_plane: ControlPlane, cluster: Cluster, admin: KubeClient,
        service_account_client: KubeClient) -> None:
    """In one running core: a tenant's pool-mode Deployment named like the
    platform team's YurtAppSet never takes it over (event, object unchanged, not deleted when
    the annotation goes); another tenant's template the parser refuses and a third's
    ``replicas: 2000000`` are refused with events naming why, and a well-formed tenant's
    YurtAppSet is written all the same."""
    thief, broken, huge, good = (Tenant(control_plane, admin) for _ in range(4))
    try:
        for i in range(2):
            cluster.node(f"{cluster.namespace}-p{i}", region="eu", cpu="4",
                         openyurt_pool="tenancy-pool")
        platform = admin.create(
            f"/apis/apps.openyurt.io/v1beta1/namespaces/{thief.ns}/yurtappsets", {
                "apiVersion": "apps.openyurt.io/v1beta1", "kind": "YurtAppSet",
                "metadata": {"name": "web", "namespace": thief.ns},
                "spec": {"pools": ["tenancy-pool"], "workload": {"workloadTemplate": {
                    "deploymentTemplate": {"metadata": {"labels": {"app": "platform"}},
                                           "spec": {"selector": {"matchLabels": {
                                               "app": "platform"}}, "template": {
                                               "metadata": {"labels": {"app": "platform"}},
                                               "spec": {"containers": [{
                                                   "name": "p",
                                                   "image": "platform/img:1"}]}}}}}}}})
        with running_core(service_account_client, f"core-{cluster.namespace}") as core:
            rss0 = rss_bytes()
            deps = "/apis/apps/v1/namespaces/{}/deployments"
            thief.c.create(deps.format(thief.ns), _pool_deployment(thief.ns, "web", 2))
            broken.c.create(deps.format(broken.ns), _pool_deployment(
                broken.ns, "app", 2, {"cfnet.io/placement-policy": "bogus"}))
            huge.c.create(deps.format(huge.ns), _pool_deployment(huge.ns, "app", 2_000_000))
            good.c.create(deps.format(good.ns), _pool_deployment(good.ns, "app", 2))
            wait_for(lambda: admin.get(_yas(good.ns, "app")), timeout=30,
                     what="the well-formed tenant's YurtAppSet written")
            ev = wait_for(lambda: thief.events("PoolObjectNotOwned"), timeout=30,
                          what="PoolObjectNotOwned for the platform team's YurtAppSet")
            assert "does not adopt" in ev[0]["message"]
            ev = wait_for(lambda: huge.events("PoolPlanRefused"), timeout=30,
                          what="PoolPlanRefused for replicas: 2000000")
            assert "2000000" in ev[0]["message"] and "1000" in ev[0]["message"]
            wait_for(lambda: broken.events("PoolPlanRefused"), timeout=30,
                     what="PoolPlanRefused for the template the parser refuses")
            live = admin.get(_yas(thief.ns, "web"))
            assert live["metadata"]["resourceVersion"] == platform["metadata"]["resourceVersion"]
            assert not live["metadata"].get("ownerReferences")
            # the tenant leaves pool mode: the platform team's object stays
            thief.c.patch(f"{deps.format(thief.ns)}/web", [
                {"op": "remove", "path": "/metadata/annotations/cfnet.io~1pool-mode"}],
                content_type="application/json-patch+json")
            bound_within(cluster, "canary")
            wait_for(lambda: core.pools.deployments.items() and all(
                "cfnet.io/pool-mode" not in (d["metadata"].get("annotations") or {})
                for d in core.pools.deployments.items() if d["metadata"]["namespace"]
                == thief.ns), timeout=10, what="the core seeing the annotation removed")
            core.pools.reconcile()
            assert admin.get(_yas(thief.ns, "web"))["metadata"]["uid"] == \
                platform["metadata"]["uid"]
            assert rss_bytes() - rss0 < 200 * MIB, "replicas: 2000000 was expanded"
    finally:
        for t in (thief, broken, huge, good):
            t.close()

