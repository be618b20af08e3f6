"""What cfnet never evicts, against a real API server.

cloud_core/k8s/evict.py follows sigs.k8s.io/descheduler's DefaultEvictor defaults (mirror and
static pods, DaemonSet pods, system-critical priority, local storage; kube-system as cfnet's
excluded namespace) and refuses, for a move or a drain, a pod that no controller owns. Here
every kind is a real object, on one node whose protected region then changes under them all:

* a mirror pod, created by the node's own kubelet identity (``system:node:<name>``), as the
  kubelet mirrors a static pod;
* a pod of a real DaemonSet (ownerReference to it; this control plane runs no DaemonSet
  controller, so nothing else touches it);
* a ``system-cluster-critical`` pod, a pod with an ``emptyDir``, a pod in ``kube-system``;
* a pod no controller owns;
* a pod under a PodDisruptionBudget that allows no disruption (the disruption controller runs);
* a plain controller-owned pod: the one cfnet may move.

The owner of the others is a real ReplicationController (no controller for it runs here, so
it neither adopts, recreates nor deletes), so the rule that keeps each is its own, not "no
controller". The core runs as ``cfnet-core --kubernetes`` under deploy/k8s's ServiceAccount.
Its re-planner evicts only the plain pod, is refused by the budget (``EvictionBlocked``), says
``NotMoved`` for the unowned one and leaves the rest untouched; then the console's ``drain``
(as admin: the chart's role holds no ``nodes patch`` for the cordon) lists each kept pod with
its rule and evicts only a second plain pod.

The pods outside kube-system, their owners and the budget are a tenant's, written under its
own identity (a ServiceAccount with ``admin`` in its namespace only); a canary pod in another
namespace is bound within 10 s and the core's memory stays within the chart's limit
(``tests/k8s/tenants.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import uuid
from typing import Any

import pytest

from cloud_core.console.protocol import Request
from cloud_core.errors import KubeConflict, KubeError
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.flags import add_eviction_args, eviction_policy
from cloud_core.k8s.registry import RESIDENCY_REGION
from tests.k8s.conftest import Cluster, kubernetes_console, wait_for
from tests.k8s.tenants import Tenant, bound_within, running_core
from tests.k8s.test_node_facts import kubelet_client
from tools.envtest import ControlPlane

pytestmark = pytest.mark.slow

REGION = f"ev-{uuid.uuid4().hex[:6]}"  # no other test's node is in it
RESIDENT = {"cfnet.io/residency": REGION}
IMAGE = "registry.example/app:1"


def _spec(node: str | None, **extra: Any) -> dict[str, Any]:
    """A cfnet pod; ``node``: bound there from the start (a pod whose ``nodeName`` its author
    set is pinned there and never a move's candidate), else pending for cfnet to bind."""
    return {"schedulerName": "cfnet-scheduler", **({"nodeName": node} if node else {}),
            "containers": [{"name": "app", "image": IMAGE,
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
            **extra}


def _owner(obj: dict[str, Any], kind: str, api: str) -> list[dict[str, Any]]:
    md = obj["metadata"]
    return [{"apiVersion": api, "kind": kind, "name": md["name"], "uid": md["uid"],
             "controller": True}]


def test_replanner_and_drain_keep_what_the_descheduler_keeps(
        control_plane: ControlPlane, cluster: Cluster, admin: KubeClient, tenant: Tenant,
        service_account_client: KubeClient) -> None:
    ns = tenant.ns  # the tenant writes its own objects; the canary is in cluster.namespace
    node = f"ev-{uuid.uuid4().hex[:6]}"
    cluster.node(node, region=REGION)
    spare = f"{ns}-spare"  # made once cfnet has bound everything to ``node``
    rc_body = {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "own"},
               "spec": {"replicas": 0, "selector": {"app": "none"}, "template": {
                   "metadata": {"labels": {"app": "none"}},
                   "spec": {"containers": [{"name": "c", "image": IMAGE}]}}}}
    rc = tenant.c.create(f"/api/v1/namespaces/{ns}/replicationcontrollers", rc_body)
    owned = _owner(rc, "ReplicationController", "v1")
    ds = tenant.c.create(f"/apis/apps/v1/namespaces/{ns}/daemonsets", {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
            "metadata": {"labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "c", "image": IMAGE}]}}}})
    sys_rc = admin.create("/api/v1/namespaces/kube-system/replicationcontrollers",
                          {**rc_body, "metadata": {"name": f"cfnet-test-{node}"}})

    def pod(name: str, *, namespace: str = ns, labels: dict[str, str] | None = None,
            owners: list[dict[str, Any]] | None = None, resident: bool = True,
            on: str | None = None, **extra: Any) -> None:
        who = tenant.c if namespace == ns else admin
        who.create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": RESIDENT if resident else {},
                         "labels": labels or {},
                         "ownerReferences": owned if owners is None else owners},
            "spec": _spec(on, **extra)})

    kept = {"critical": "system-critical", "scratch": "local storage",
            "daemon": "a DaemonSet pod", "unowned": "no controller recreates it",
            f"mirror-{node}": "a mirror pod"}
    pod("plain")
    pod("plain-2")
    pod("budgeted", labels={"app": "budgeted"})
    pod("critical", priorityClassName="system-cluster-critical")
    pod("scratch", volumes=[{"name": "tmp", "emptyDir": {}}])
    pod("daemon", owners=_owner(ds, "DaemonSet", "apps/v1"), on=node)  # as its controller would
    pod("unowned", owners=[])
    sys_pod = f"cfnet-test-{node}"
    pod(sys_pod, namespace="kube-system", owners=_owner(sys_rc, "ReplicationController", "v1"))
    tenant.c.create(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "all"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "budgeted"}}}})
    # The mirror pod: the node's kubelet writes it, bound to itself and owned by its Node,
    # as NodeRestriction requires of a node's pods.
    kubelet = kubelet_client(control_plane, node)
    try:
        me = admin.get(f"/api/v1/nodes/{node}")
        kubelet.create(f"/api/v1/namespaces/{ns}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"mirror-{node}", "annotations": {
                **RESIDENT, "kubernetes.io/config.mirror": "abc123",
                "kubernetes.io/config.source": "file", "kubernetes.io/config.hash": "abc123"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                     "uid": me["metadata"]["uid"], "controller": True}]},
            "spec": _spec(node)})
    finally:
        kubelet.close()
    try:
        with running_core(service_account_client, f"core-{ns}") as core:
            # cfnet binds the 7 pending pods to the only node; then a second node appears
            wait_for(lambda: sum(1 for p in core.actuator.pods.items()
                                 if (p.get("spec") or {}).get("nodeName") == node) == 9,
                     timeout=30, what=f"the 9 pods on {node}, 7 bound by cfnet")
            # the kubelet's part for the budgeted pod: running and ready (the Eviction API lets
            # a Pending pod go whatever its budget says: canIgnorePDB), so the budget counts
            # it healthy and allows no disruption
            path = f"/api/v1/namespaces/{ns}/pods/budgeted"

            def running_and_ready() -> bool:
                # kwok runs the pod too, and may write its status in the same moment (a 409
                # on our PUT): whichever write lands, the pod is Running and Ready
                bp = admin.get(path)
                st = bp.get("status") or {}
                conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
                if st.get("phase") == "Running" and conds.get("Ready") == "True":
                    return True
                bp["status"] = {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "PodScheduled", "status": "True"}]}
                try:
                    admin.replace(f"{path}/status", bp)
                except KubeConflict:
                    return False
                return True

            wait_for(running_and_ready, what="the budgeted pod Running and Ready")
            pdb = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/all"
            wait_for(lambda: (admin.get(pdb).get("status") or {}).get("currentHealthy") == 1,
                     what="the disruption controller counting the budgeted pod healthy")
            cluster.node(spare, region=REGION)
            wait_for(lambda: core.actuator.registry.get(spare), what=f"{spare} in the registry")
            admin.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {
                RESIDENCY_REGION: "us-east"}}})

            def live(namespace: str = ns) -> dict[str, dict[str, Any]]:
                return {p["metadata"]["name"]: p
                        for p in admin.list(f"/api/v1/namespaces/{namespace}/pods")[0]}

            def reasons() -> set[str]:
                return {e["reason"] for e in tenant.events()}

            before = set(live())

            def evicted() -> set[str]:
                # terminating, or already gone: kwok (the node's kubelet here) finishes an
                # evicted pod at once
                now = live()
                return {n for n, p in now.items() if p["metadata"].get("deletionTimestamp")} \
                    | (before - set(now))

            def acted() -> tuple[bool, set[str], set[str]] | None:
                gone = evicted()
                said = reasons()
                done = {"plain", "plain-2"} <= gone and {"EvictionBlocked", "NotMoved"} <= said
                return None if not done else (done, gone, said)

            last: list[Any] = []
            try:
                wait_for(lambda: acted() or last.append(
                    (evicted(), reasons(), core.actuator.stats.moves)), timeout=60,
                    what="the plain pods evicted, the budget's refusal and the unowned pod's "
                         "NotMoved event")
            except AssertionError as e:
                raise AssertionError(f"{e}; evicted, events, moves: {last[-1:]}") from None
            bound_within(cluster, "canary", timeout=10)
            pods = live()
            for name in ("budgeted", *kept):
                assert not pods[name]["metadata"].get("deletionTimestamp"), name
            assert not live("kube-system")[sys_pod]["metadata"].get("deletionTimestamp")
            moved = {e["involvedObject"]["name"] for e in tenant.events("Rescheduling")}
            assert moved == {"plain", "plain-2"}, moved
            blocked = {e["involvedObject"]["name"] for e in tenant.events("EvictionBlocked")}
            assert blocked == {"budgeted"}, blocked
            not_moved = {e["involvedObject"]["name"] for e in tenant.events("NotMoved")}
            assert not_moved == {"unowned"}, not_moved

            # The console's drain, the same rules (as admin, who may cordon)
            svc = kubernetes_console(core.actuator, admin)
            pod("plain-3", resident=False, on=node)  # fits the node: the re-planner leaves it
            wait_for(lambda: "plain-3" in {(p.get("metadata") or {}).get("name")
                                           for p in core.actuator.pods.items()},
                     what="plain-3 in the core's informer")
            r = svc.handle("op", Request("drain", {"node": node}))
            assert r.ok, r.error
            assert r.data["evicted"] == [f"{ns}/plain-3"], r.data
            assert r.data["blocked_by_budget"] == [f"{ns}/budgeted"], r.data
            got = {k.split(":", 1)[0].split("/", 1)[1]: k for k in r.data["not_evictable"]}
            assert set(got) == {*kept, sys_pod}, got
            for name, rule in kept.items():
                assert rule in got[name], got[name]
            assert "in namespace kube-system" in got[sys_pod]
    finally:
        with contextlib.suppress(KubeError):
            admin.delete(f"/api/v1/namespaces/kube-system/pods/{sys_pod}", grace_period_s=0)
        with contextlib.suppress(KubeError):
            admin.delete(f"/api/v1/namespaces/kube-system/replicationcontrollers/{sys_pod}")


def test_tenant_namespace_excluded_from_drain(cluster: Cluster, admin: KubeClient,
                                              service_account_client: KubeClient) -> None:
    """The descheduler's ``namespaces.exclude`` (the chart's
    ``core.eviction.excludeNamespaces``, ``--evict-exclude-namespaces``): a tenant namespace
    listed there keeps its pods through a drain, with the rule named; kube-system stays
    listed with it."""
    ns = cluster.namespace
    node = f"ex-{uuid.uuid4().hex[:6]}"
    cluster.node(node, region=REGION)
    rc = admin.create(f"/api/v1/namespaces/{ns}/replicationcontrollers", {
        "apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "own"},
        "spec": {"replicas": 0, "selector": {"app": "none"}, "template": {
            "metadata": {"labels": {"app": "none"}},
            "spec": {"containers": [{"name": "c", "image": IMAGE}]}}}})
    admin.create(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "tenant-pod", "ownerReferences": _owner(
            rc, "ReplicationController", "v1")},
        "spec": _spec(node)})
    policy = eviction_policy(_flags(["--evict-exclude-namespaces", f"kube-system,{ns}"]))
    assert policy.excluded_namespaces == {"kube-system", ns}
    with running_core(service_account_client, f"core-{ns}", eviction=policy) as runner:
        wait_for(lambda: "tenant-pod" in {(p.get("metadata") or {}).get("name")
                                          for p in runner.actuator.pods.items()},
                 what="tenant-pod in the core's informer")
        svc = kubernetes_console(runner.actuator, admin)
        r = svc.handle("op", Request("drain", {"node": node}))
        assert r.ok, r.error
        assert r.data["evicted"] == [], r.data
        assert [k for k in r.data["not_evictable"] if k.startswith(f"{ns}/tenant-pod")] == [
            f"{ns}/tenant-pod: in namespace {ns}"], r.data
        pod = admin.get(f"/api/v1/namespaces/{ns}/pods/tenant-pod")
        assert not pod["metadata"].get("deletionTimestamp")


def _flags(argv: list[str]) -> argparse.Namespace:
    """cfnet-core's eviction flag as its parser reads it."""
    p = argparse.ArgumentParser()
    add_eviction_args(p)
    return p.parse_args(argv)
