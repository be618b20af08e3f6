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
from tests.k8s.conftest import DEPLOY, ROOT, Cluster, load_manifests, wait_for
from tests.k8s.tenants import Tenant, bound_within, running_core

DOCS = ROOT / "docs"

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
    assert got == {"written": 1, "series": 1, "dropped": 0, "failed": 0,
                   "background_dropped": 0}, got
    ev = next(e for e in cluster.events("Scheduled") if e.get("message") == "rbac series")
    assert (ev.get("series") or {}).get("count") == 2, ev
    # Re-placement: evict (PDBs honoured); the pod's controller makes the replacement.
    sa.create(f"/api/v1/namespaces/{ns}/pods/allowed/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "allowed", "namespace": ns}})
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
    # Pods: no create (a stolen token ran a pod as kube-system's
    # generic-garbage-collector in a dry run), no update/patch (the binding is the only write
    # to a pending pod), no delete, no exec.
    for where, account in ((ns, "default"), ("kube-system", "generic-garbage-collector")):
        msg = _refused(lambda w=where, a=account: sa.create(
            f"/api/v1/namespaces/{w}/pods?dryRun=All", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stolen"},
                "spec": {"serviceAccountName": a, "containers": [
                    {"name": "c", "image": "registry.example/x:1"}]}}))
        assert 'cannot create resource "pods"' in msg, msg
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


# Rules every authenticated identity has (system:basic-user, system:discovery,
# system:public-info-viewer: self reviews, discovery, version), read from the live bindings.
EVERYONE = ("system:authenticated", "system:serviceaccounts")
Triple = tuple[str, str, str]


def _triples(rules: list[dict[str, Any]]) -> set[Triple]:
    """(API group, resource, verb) of resource rules (resourceNames and non-resource URLs
    set aside: the Lease rules are name-limited on both sides, checked by the refusals)."""
    return {(g, r, v) for rule in rules for g in rule.get("apiGroups") or []
            for r in rule.get("resources") or [] for v in rule.get("verbs") or []}


def _everyones(admin: KubeClient) -> set[Triple]:
    out: set[Triple] = set()
    for b in admin.list("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")[0]:
        if any(s.get("kind") == "Group" and s.get("name") in EVERYONE
               for s in b.get("subjects") or []):
            role = admin.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/"
                             f"{b['roleRef']['name']}")
            out |= _triples(role.get("rules") or [])
    return out


def _doc_table() -> set[Triple]:
    """The rows of docs/security.md's table of what the core holds beyond kube-scheduler."""
    text = (DOCS / "security.md").read_text()
    section = text.split("## The core's Kubernetes role", 1)[1].split("\n## ", 1)[0]
    out: set[Triple] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        group, resource = cells[0].strip("`").strip('"'), cells[1].strip("`")
        out |= {(group, resource, v.strip()) for v in cells[2].split(",")}
    return out


def test_role_is_kube_schedulers_plus_the_documented_table(
        service_account_client: KubeClient, cluster: Cluster, admin: KubeClient) -> None:
    """Every (group, resource, verb) the core's ServiceAccount holds,
    as the real API server evaluates the chart's rendered RBAC (SelfSubjectRulesReview under
    the account's own token), is upstream's ``system:kube-scheduler`` (the live bootstrap
    ClusterRole), everyone's, or a row of docs/security.md's table; and the table lists
    nothing the role lacks."""
    sa = service_account_client
    scheduler = admin.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/system:kube-scheduler")
    upstream = _triples(scheduler["rules"])
    assert ("", "pods/binding", "create") in upstream  # it is the scheduler's role
    everyone = _everyones(admin)
    table = _doc_table()
    assert ("", "pods/eviction", "create") in table, table
    held: set[Triple] = set()
    for ns in (cluster.namespace, "kube-system", "cfnet-system"):
        review = sa.create("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": ns}})
        status = review["status"]
        assert not status.get("incomplete"), status.get("evaluationError")
        rules = status.get("resourceRules") or []
        assert not any("*" in (r.get(k) or []) for r in rules
                       for k in ("apiGroups", "resources", "verbs")), rules
        held |= _triples(rules)
        # Secrets: only the agent CA's, by name (get, update), in the core's own namespace
        for r in rules:
            if "secrets" in (r.get("resources") or []):
                assert ns == "cfnet-system" and r.get("resourceNames") == ["cfnet-agent-ca"] \
                    and set(r.get("verbs") or []) <= {"get", "update"}, r
    extra = held - upstream - everyone
    assert extra <= table, f"held beyond system:kube-scheduler and undocumented: {extra - table}"
    assert table <= held, f"docs/security.md lists what the role lacks: {table - held}"
    assert ("", "pods", "create") not in held and ("", "secrets", "create") not in held
    # what it holds beyond the scheduler is the eviction, pool mode and the agents'
    # enrollment (CSRs of its own signer, its CA's Secret), nothing else
    assert {(g, r) for g, r, _ in extra} <= {
        ("certificates.k8s.io", "certificatesigningrequests"),
        ("certificates.k8s.io", "certificatesigningrequests/approval"),
        ("certificates.k8s.io", "certificatesigningrequests/status"),
        ("certificates.k8s.io", "signers"), ("", "secrets"),
        ("", "pods/eviction"), ("apps", "deployments"), ("apps.openyurt.io", "yurtappsets"),
        ("apps.kubeedge.io", "edgeapplications"), ("apps.openyurt.io", "nodepools"),
        ("apps.kubeedge.io", "nodegroups")}, extra


def test_the_core_serves_a_tenant_and_its_token_runs_no_pod(
        cluster: Cluster, tenant: Tenant, service_account_client: KubeClient) -> None:
    """On a shared cluster: the core, running under the chart's role,
    binds a tenant's pod (the tenant a ServiceAccount with ``admin`` in its namespace only) and
    a canary in another namespace within 10 s, its memory within the chart's limit; the same
    token creates no pod in the tenant's namespace nor one that would run as kube-system's
    ``generic-garbage-collector`` (dry runs: nothing is made either way), and writes nothing
    to the tenant's pod but its binding."""
    sa = service_account_client
    cluster.node(f"{cluster.namespace}-n1", region="eu")
    app = {"name": "app", "image": "registry.example/app:1",
           "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
    with running_core(sa, f"core-{cluster.namespace}"):
        tenant.pod("app", [app])
        path = f"/api/v1/namespaces/{tenant.ns}/pods/app"
        wait_for(lambda: tenant.c.get(path)["spec"].get("nodeName"), timeout=10,
                 what="the tenant's pod bound by the core")
        bound_within(cluster, "canary")
        for where, account in ((tenant.ns, "tenant"),
                               ("kube-system", "generic-garbage-collector")):
            msg = _refused(lambda w=where, a=account: sa.create(
                f"/api/v1/namespaces/{w}/pods?dryRun=All", {
                    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stolen"},
                    "spec": {"serviceAccountName": a, "containers": [app]}}))
            assert 'cannot create resource "pods"' in msg, msg
        _refused(lambda: sa.patch(path, {"metadata": {"labels": {"x": "y"}}}))
        _refused(lambda: sa.delete(path))
