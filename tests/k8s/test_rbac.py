"""The core's ServiceAccount as the Helm chart renders it (deploy/k8s/rbac.yaml is the chart's
``helm template`` output, kept in sync by tests/deploy/test_chart.py, and is what the
``service_account_client`` fixture applies): what the core does is allowed (the actuator tests
run under it too), and what it never needs is refused by the real API server's RBAC
authorizer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cloud_core.errors import KubeForbidden, KubeNotFound
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.leader import LeaderElector
from tests.k8s.conftest import DEPLOY, Cluster, load_manifests, wait_for

pytestmark = pytest.mark.slow

# (group, plural, writable by the core): the pool kinds of OpenYurt and KubeEdge.
POOL_KINDS = (("apps.openyurt.io", "yurtappsets", True), ("apps.kubeedge.io",
              "edgeapplications", True), ("apps.openyurt.io", "nodepools", False),
              ("apps.kubeedge.io", "nodegroups", False))


def role_grants(group: str, resource: str, verb: str) -> bool:
    """Whether the rendered ClusterRole grants ``verb`` on ``resource`` (no wildcards in it)."""
    role = next(d for d in load_manifests(DEPLOY / "rbac.yaml") if d["kind"] == "ClusterRole")
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               for r in role["rules"])


def _served_version(admin: KubeClient, group: str, plural: str) -> str | None:
    """The storage version of an installed CRD (None when the control plane lacks it)."""
    try:
        crd = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                        f"{plural}.{group}")
    except KubeNotFound:
        return None
    return next(str(v["name"]) for v in crd["spec"]["versions"] if v.get("storage"))


def test_role_allows_what_the_core_does(service_account_client: KubeClient,
                                        cluster: Cluster, admin: KubeClient) -> None:
    sa = service_account_client
    ns = cluster.namespace
    cluster.node("rb-1", region="eu-west")
    pod = cluster.pod("allowed")
    assert sa.list("/api/v1/nodes")[0]
    assert sa.list("/api/v1/pods")[0]
    assert sa.get(f"/api/v1/namespaces/{ns}/pods/allowed")
    sa.bind_pod(ns, "allowed", pod["metadata"]["uid"], "rb-1")
    sa.emit_event(pod, reason="Scheduled", message="test")
    # The scheduler's own events: events.k8s.io/v1, a repeat patched as a series.
    before = dict(sa.events.stats)
    for _ in range(2):  # one after the other: the second finds the first written
        sa.record_event(pod, reason="Scheduled", message="rbac series")
        assert sa.flush_events(10.0)
    got = {k: v - before[k] for k, v in sa.events.stats.items()}
    assert got == {"written": 1, "series": 1, "dropped": 0, "failed": 0}, got
    ev = next(e for e in cluster.events("Scheduled") if e.get("message") == "rbac series")
    assert (ev.get("series") or {}).get("count") == 2, ev
    # Re-placement: evict (PDBs honoured) and create a bare pod's unbound copy.
    sa.create(f"/api/v1/namespaces/{ns}/pods/allowed/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "allowed", "namespace": ns}})
    spec = dict(cluster.pod("template")["spec"])
    spec.pop("nodeName", None)
    sa.create(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "replacement", "namespace": ns},
        "spec": spec})
    # Pool mode: Deployments read; the pool objects read and written; pools read.
    sa.list("/apis/apps/v1/deployments")
    for group, plural, writable in POOL_KINDS:
        version = _served_version(admin, group, plural)
        assert version is not None, f"{plural}.{group} not installed by the session fixture"
        if writable:  # get one that does not exist: 404 is an answer, 403 would raise
            with pytest.raises(KubeNotFound):
                sa.get(f"/apis/{group}/{version}/namespaces/{ns}/{plural}/nope")
        else:
            sa.list(f"/apis/{group}/{version}/{plural}")
    # Cordon / uncordon (the console's cordon and drain act on the Node), where the role
    # grants it: `core.rbac.clusterRules` decides; the refusal is checked below otherwise.
    if role_grants("", "nodes", "patch"):
        sa.patch("/api/v1/nodes/rb-1", {"spec": {"unschedulable": True}})
        sa.patch("/api/v1/nodes/rb-1", {"spec": {"unschedulable": False}})
    el = LeaderElector(sa, "cfnet-system", "cfnet-core", "rbac-test", lease_duration_s=3,
                       renew_deadline_s=2, retry_period_s=0.5)
    try:
        el.start()
        wait_for(el.is_leader, timeout=15, what="lease acquired under the ServiceAccount")
    finally:
        el.stop(release=True)


def _refused(call: Callable[[], Any]) -> str:
    with pytest.raises(KubeForbidden) as ei:
        call()
    assert ei.value.status == 403
    return str(ei.value)


def test_verbs_the_role_lacks_are_refused(service_account_client: KubeClient,
                                          cluster: Cluster, admin: KubeClient) -> None:
    sa = service_account_client
    ns = cluster.namespace
    cluster.node("rb-2", region="eu-west")
    pod = cluster.pod("victim")
    # Nodes: read and cordon only, never create, update or delete.
    msg = _refused(lambda: sa.delete("/api/v1/nodes/rb-2"))
    assert 'cannot delete resource "nodes"' in msg
    _refused(lambda: sa.replace("/api/v1/nodes/rb-2", admin.get("/api/v1/nodes/rb-2")))
    _refused(lambda: sa.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                 "metadata": {"name": "rb-forged"}}))
    if not role_grants("", "nodes", "patch"):
        msg = _refused(lambda: sa.patch("/api/v1/nodes/rb-2", {"spec": {"unschedulable": True}}))
        assert 'cannot patch resource "nodes"' in msg
    # Pods: no update/patch (the binding is the only write to a pending pod), no delete, no
    # exec.
    _refused(lambda: sa.patch(f"/api/v1/namespaces/{ns}/pods/victim",
                              {"metadata": {"labels": {"x": "y"}}}))
    _refused(lambda: sa.delete(f"/api/v1/namespaces/{ns}/pods/victim"))
    _refused(lambda: sa.create(f"/api/v1/namespaces/{ns}/pods/victim/exec", {}))
    _refused(lambda: sa.list(f"/api/v1/namespaces/{ns}/secrets"))
    _refused(lambda: sa.list("/api/v1/configmaps"))
    # The legacy bindings collection is not pods/binding.
    _refused(lambda: sa.create(f"/api/v1/namespaces/{ns}/bindings", {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "victim", "uid": pod["metadata"]["uid"]},
        "target": {"kind": "Node", "name": "rb-2"}}))
    # Workloads are read (Deployments only), never written; budgets are not the core's.
    _refused(lambda: sa.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/any"))
    _refused(lambda: sa.list("/apis/apps/v1/statefulsets"))
    _refused(lambda: sa.create(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "x"}, "spec": {"maxUnavailable": 1}}))
    # Pools are read, never written; the pool objects are not listed cluster-wide.
    for group, plural, writable in POOL_KINDS:
        version = _served_version(admin, group, plural)
        assert version is not None
        if writable:
            _refused(lambda g=group, v=version, p=plural: sa.list(f"/apis/{g}/{v}/{p}"))
        else:
            _refused(lambda g=group, v=version, p=plural: sa.delete(f"/apis/{g}/{v}/{p}/any"))
    # Leases: only its own, only in its namespace.
    _refused(lambda: sa.get("/apis/coordination.k8s.io/v1/namespaces/cfnet-system/leases/other"))
    _refused(lambda: sa.get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/"
                            "cfnet-core"))
    _refused(lambda: sa.list("/apis/rbac.authorization.k8s.io/v1/clusterroles"))
