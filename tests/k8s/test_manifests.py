"""The Helm chart's manifests on the real API server (and, where the test control plane runs
kube-controller-manager, its controllers).

* every file of deploy/k8s (generated from the chart by ``python -m tools.helm render``) and the
  chart rendered with alternative values pass server-side validation with strict field
  validation (dry run: unknown or misspelt fields fail);
* the chart rendered into a fresh namespace is server-side applied as a whole (RBAC objects,
  Deployment, PDB, DaemonSet, ConfigMap, Secrets, Service) and the controllers act on it: the
  Deployment gets its ReplicaSet and two pods under the chart's ServiceAccount, and the
  disruption controller counts them for the PDB. (No kube-scheduler runs here, so they stay
  Pending; tests/cluster installs the chart on a cluster where pods run.)
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloud_core.errors import KubeConflict, KubeError, KubeNotFound
from cloud_core.k8s.client import KubeClient
from tests.deploy.test_chart import ALT_VALUES
from tests.k8s.conftest import DEPLOY, load_manifests, wait_for
from tools import helm as chart
from tools.envtest import ControlPlane

pytestmark = pytest.mark.slow


def _dry_run(admin: KubeClient, obj: dict[str, Any]) -> dict[str, Any]:
    md = obj.get("metadata") or {}
    coll = admin.resource_path(obj["apiVersion"], obj["kind"], md.get("namespace"))
    q = {"dryRun": "All", "fieldValidation": "Strict"}
    try:
        out = admin.request("POST", coll, body=obj, query=q)
    except KubeConflict:  # exists already (the namespace; the Lease or the agent CA Secret
        # an earlier test's core made or filled): validate as an update of that version
        live = admin.get(f"{coll}/{md['name']}")
        body = {**obj, "metadata": {**md, "resourceVersion": live["metadata"]["resourceVersion"]}}
        out = admin.request("PUT", f"{coll}/{md['name']}", body=body, query=q)
    return dict(out)


@pytest.mark.parametrize("path", sorted(DEPLOY.glob("*.yaml")), ids=lambda p: p.name)
def test_manifest_is_valid(control_plane: ControlPlane, admin: KubeClient, path: Path) -> None:
    control_plane.ensure_namespace("cfnet-system")
    docs = load_manifests(path)
    assert docs
    for obj in docs:
        out = _dry_run(admin, obj)
        assert out["kind"] == obj["kind"] and out["metadata"]["name"] == obj["metadata"]["name"]


def test_alternative_values_are_valid(control_plane: ControlPlane, admin: KubeClient) -> None:
    control_plane.ensure_namespace("cfnet-system")
    docs = chart.documents(chart.template(values=ALT_VALUES))
    kinds = {d["kind"] for d in docs}
    assert {"Secret", "DaemonSet", "Deployment", "ClusterRole"} <= kinds
    for obj in docs:
        assert _dry_run(admin, obj)["metadata"]["name"] == obj["metadata"]["name"]


@pytest.fixture
def release(control_plane: ControlPlane, admin: KubeClient) -> Iterator[dict[str, Any]]:
    """The chart rendered into a namespace of its own, its cluster-scoped names made unique
    (the session's RBAC fixture owns ``cfnet-core``), removed again afterwards."""
    ns = f"chart-{uuid.uuid4().hex[:6]}"
    sa = f"cfnet-core-{ns}"
    control_plane.ensure_namespace(ns)
    docs = chart.documents(chart.template(namespace=ns, values=[
        f"core.serviceAccount.name={sa}", "credentials.create=true", "credentials.caCrt=CA",
        "credentials.corePassword=pw1", "credentials.agentPassword=pw2"]))
    yield {"namespace": ns, "serviceAccount": sa, "docs": docs}
    for d in docs:
        if "namespace" not in d["metadata"]:
            with contextlib.suppress(KubeError):
                admin.delete(admin.resource_path(d["apiVersion"], d["kind"], None,
                                                 d["metadata"]["name"]))
    with contextlib.suppress(KubeError):
        admin.delete(f"/api/v1/namespaces/{ns}")


def test_chart_applies_and_controllers_act(control_plane: ControlPlane, admin: KubeClient,
                                           release: dict[str, Any]) -> None:
    ns, sa = release["namespace"], release["serviceAccount"]
    for obj in release["docs"]:
        md = obj["metadata"]
        path = admin.resource_path(obj["apiVersion"], obj["kind"], md.get("namespace"),
                                   md["name"])
        out = admin.request("PATCH", path, body=obj, content_type="application/apply-patch+yaml",
                            query={"fieldManager": "helm-chart-test", "force": "true",
                                   "fieldValidation": "Strict"})
        assert out["metadata"]["name"] == md["name"]
    applied = {(d["kind"], d["metadata"]["name"]) for d in release["docs"]}
    assert {("Deployment", "cfnet-core"), ("DaemonSet", "cfnet-agent"),
            ("PodDisruptionBudget", "cfnet-core"), ("ClusterRole", sa),
            ("ClusterRoleBinding", sa), ("Role", f"{sa}-leader-election"),
            ("ServiceAccount", sa), ("Deployment", "mosquitto")} <= applied
    ds = admin.get(f"/apis/apps/v1/namespaces/{ns}/daemonsets/cfnet-agent")
    assert ds["spec"]["template"]["spec"]["hostNetwork"] is True
    # RBAC as applied: the binding names the chart's ServiceAccount in this namespace.
    crb = admin.get(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{sa}")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    if not getattr(control_plane, "controllers", False):
        return  # a control plane without kube-controller-manager: accepted is all we can see

    def pods() -> list[dict[str, Any]]:
        items = admin.list(f"/api/v1/namespaces/{ns}/pods",
                           labelSelector="app.kubernetes.io/name=cfnet-core")[0]
        return items if len(items) == 2 else []

    got = wait_for(pods, timeout=60, what="the Deployment's two pods")
    for p in got:
        assert p["spec"]["serviceAccountName"] == sa
        assert p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"

    def pdb_counts() -> Any:
        try:
            st = admin.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/cfnet-core")
        except KubeNotFound:
            return None
        return st.get("status", {}).get("expectedPods") == 2 and st["status"]

    st = wait_for(pdb_counts, timeout=60, what="the disruption controller counting the PDB")
    # Neither pod runs (nothing schedules them here), so no disruption is allowed: the PDB
    # protects the leader.
    assert st["disruptionsAllowed"] == 0 and st["desiredHealthy"] == 1


def _template_pod(docs: list[dict[str, Any]], kind: str, name: str, ns: str) -> dict[str, Any]:
    """The pod a controller would make from the chart's ``kind``/``name`` template."""
    obj = next(d for d in docs if (d["kind"], d["metadata"]["name"]) == (kind, name))
    tpl = obj["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**tpl.get("metadata", {}), "name": f"{name}-x", "namespace": ns},
            "spec": tpl["spec"]}


def test_pod_security_admission_on_the_charts_pods(control_plane: ControlPlane,
                                                   admin: KubeClient) -> None:
    """On the real API server's PodSecurity admission: in a namespace
    enforcing ``restricted``, the chart's Mosquitto pod is admitted as rendered (non-root,
    seccomp, no capabilities, no privilege escalation) while the agent's is refused (so the
    enforcement is on); the agent's refusal names ``privileged`` only on the documented
    fallback (``agent.privileged=true``), not with the default capabilities."""
    ns = f"psa-{uuid.uuid4().hex[:6]}"
    admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted",
                               "pod-security.kubernetes.io/enforce-version": "latest"}}})
    try:
        # ServiceAccount admission runs first and needs the accounts the pods name
        wait_for(lambda: admin.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"),
                 timeout=120, every=0.2, what="the namespace's default ServiceAccount")
        admin.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "cfnet-agent"}})
        q = {"dryRun": "All"}
        default = chart.documents(chart.template(namespace=ns))
        mq = _template_pod(default, "Deployment", "mosquitto", ns)
        out = admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=mq, query=q)
        assert out["spec"]["securityContext"]["runAsNonRoot"] is True
        refusals: dict[str, str] = {}
        for label, values in (("default", []), ("fallback", ["agent.privileged=true"])):
            docs = default if not values else chart.documents(
                chart.template(namespace=ns, values=values))
            agent = _template_pod(docs, "DaemonSet", "cfnet-agent", ns)
            with pytest.raises(KubeError) as e:
                admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=agent, query=q)
            refusals[label] = str(e.value)
            assert 'violates PodSecurity "restricted:latest"' in refusals[label], refusals
        assert "privileged (" not in refusals["default"], refusals["default"]
        assert "privileged (" in refusals["fallback"], refusals["fallback"]
    finally:
        with contextlib.suppress(KubeError):
            admin.delete(f"/api/v1/namespaces/{ns}")
