"""deploy/k8s's ClusterRole as written: what the core needs is allowed (the actuator tests run
under it too), and verbs it lacks are refused by the real API server's RBAC authorizer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cloud_core.errors import KubeForbidden
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.leader import LeaderElector
from tests.k8s.conftest import Cluster, wait_for

pytestmark = pytest.mark.slow


def test_role_allows_what_the_core_does(service_account_client: KubeClient,
                                        cluster: Cluster) -> None:
    sa = service_account_client
    cluster.node("rb-1", region="eu-west")
    pod = cluster.pod("allowed")
    assert sa.list("/api/v1/nodes")[0]
    assert sa.get(f"/api/v1/namespaces/{cluster.namespace}/pods/allowed")
    sa.bind_pod(cluster.namespace, "allowed", pod["metadata"]["uid"], "rb-1")
    sa.emit_event(pod, reason="Scheduled", message="test")
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
                                          cluster: Cluster) -> None:
    sa = service_account_client
    ns = cluster.namespace
    cluster.node("rb-2", region="eu-west")
    pod = cluster.pod("victim")
    msg = _refused(lambda: sa.patch("/api/v1/nodes/rb-2",
                                    {"metadata": {"labels": {"topology.kubernetes.io/region":
                                                             "elsewhere"}}}))
    assert 'cannot patch resource "nodes"' in msg
    _refused(lambda: sa.delete(f"/api/v1/namespaces/{ns}/pods/victim"))
    _refused(lambda: sa.patch(f"/api/v1/namespaces/{ns}/pods/victim",
                              {"metadata": {"labels": {"x": "y"}}}))
    _refused(lambda: sa.list(f"/api/v1/namespaces/{ns}/secrets"))
    _refused(lambda: sa.list("/api/v1/configmaps"))
    # The legacy bindings collection is not pods/binding.
    _refused(lambda: sa.create(f"/api/v1/namespaces/{ns}/bindings", {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "victim", "uid": pod["metadata"]["uid"]},
        "target": {"kind": "Node", "name": "rb-2"}}))
    # Leases: only its own, only in its namespace.
    _refused(lambda: sa.get("/apis/coordination.k8s.io/v1/namespaces/cfnet-system/leases/other"))
    _refused(lambda: sa.get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/"
                            "cfnet-core"))
    _refused(lambda: sa.list("/apis/rbac.authorization.k8s.io/v1/clusterroles"))
