"""Security facts never from a label the node writes itself, against a
real API server.

The control plane runs ``--authorization-mode=Node,RBAC`` with the NodeRestriction admission
plugin, as clusters do. The node here is a real kubelet identity: a client certificate
``/O=system:nodes/CN=system:node:<name>`` from the cluster's CA, exactly what
``tools/envtest/node.py`` gives its kubelet. It registers its own Node and labels itself as a
compromised kubelet would. The core runs as ``cfnet-core --kubernetes`` runs it, under the
ServiceAccount and RBAC of ``deploy/k8s``.

Shown: the node may write ``cfnet.io/security-level``, ``cfnet.io/agent-id`` and
``topology.kubernetes.io/region`` on itself and none of them raises its level, moves it into a
residency region or gives it another agent's identity; the NodeRestriction plugin refuses the
node the ``node-restriction.kubernetes.io/`` keys cfnet does read, on create and on update;
the node is named in a Warning event; an administrator's protected label is what places the
pods (a tenant's: a ServiceAccount with ``admin`` in its namespace only) there; a canary pod
in another namespace is bound within 10 s throughout, and the core's memory stays within
the chart's limit (``tests/k8s/tenants.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cloud_core.errors import KubeForbidden
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.registry import AGENT_ID, RESIDENCY_REGION, SECURITY
from tests.k8s.conftest import Cluster, wait_for
from tests.k8s.tenants import Tenant, bound_within, running_core
from tools.envtest import ControlPlane, Credentials
from tools.envtest.harness import sign_client_cert

pytestmark = pytest.mark.slow

STATUS = {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
          "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
          "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                          "message": "a kubelet identity, no kubelet process"}]}


def kubelet_client(cp: ControlPlane, node: str) -> KubeClient:
    """A client authenticated as the kubelet of ``node`` (group ``system:nodes``)."""
    pki = cp.dir / "pki"
    sign_client_cert(pki, f"kubelet-{node}", f"/O=system:nodes/CN=system:node:{node}")
    assert cp.admin is not None
    kc = Credentials(host=cp.admin.host, ca_file=cp.admin.ca_file,
                     cert_file=str(pki / f"kubelet-{node}.crt"),
                     key_file=str(pki / f"kubelet-{node}.key")).write_kubeconfig(
        cp.dir / f"kubelet-{node}.kubeconfig", user=f"system:node:{node}")
    return KubeClient.from_kubeconfig(str(kc))


@pytest.fixture
def rogue(control_plane: ControlPlane, cluster: Cluster) -> Iterator[tuple[str, KubeClient]]:
    name = f"rogue-{uuid.uuid4().hex[:6]}"
    c = kubelet_client(control_plane, name)
    cluster.nodes.append(name)  # the admin deletes it after the test
    yield name, c
    c.close()


def forbidden(call: Any) -> str:
    with pytest.raises(KubeForbidden) as e:
        call()
    return str(e.value)


def node_events(admin: KubeClient, node: str, reason: str) -> list[dict[str, Any]]:
    evs = admin.list("/api/v1/namespaces/default/events")[0]
    return [e for e in evs if e.get("reason") == reason
            and (e.get("involvedObject") or {}).get("name") == node]


def test_a_node_cannot_raise_its_own_security_level_or_region(
        control_plane: ControlPlane, cluster: Cluster, rogue: tuple[str, KubeClient],
        tenant: Tenant, service_account_client: KubeClient) -> None:
    name, kubelet = rogue
    canary_node = f"{cluster.namespace}-c"
    cluster.node(canary_node, region="eu", security=1)
    # NodeRestriction: the protected keys are refused to the node when it registers...
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  SECURITY: "5"}}}
    msg = forbidden(lambda: kubelet.create("/api/v1/nodes", body))
    assert SECURITY in msg, msg
    # ...and what it may write about itself, it does: the keys cfnet once read
    body["metadata"]["labels"] = {"kubernetes.io/hostname": name,
                                  "cfnet.io/security-level": "5",
                                  "cfnet.io/agent-id": "edge-trusted",
                                  "topology.kubernetes.io/region": "vault"}
    kubelet.create("/api/v1/nodes", body)
    obj = kubelet.get(f"/api/v1/nodes/{name}")
    obj["status"] = STATUS
    kubelet.replace(f"/api/v1/nodes/{name}/status", obj)
    # no node-lifecycle controller here: the admin removes the not-ready taint, as it would
    cluster.c.patch(f"/api/v1/nodes/{name}", [{"op": "replace", "path": "/spec/taints",
                                               "value": []}],
                    content_type="application/json-patch+json")
    # ...and on update
    for key in (SECURITY, RESIDENCY_REGION, AGENT_ID):
        msg = forbidden(lambda k=key: kubelet.patch(f"/api/v1/nodes/{name}",
                                                    {"metadata": {"labels": {k: "5"}}}))
        assert key in msg, msg
    labels = kubelet.get(f"/api/v1/nodes/{name}")["metadata"]["labels"]
    assert labels["cfnet.io/security-level"] == "5"
    assert not any(k in labels for k in (SECURITY, RESIDENCY_REGION, AGENT_ID))

    with running_core(service_account_client, f"core-{cluster.namespace}") as core:
        # a tenant's pods (its own identity) ask for what the rogue node claims
        app = {"name": "app", "image": "registry.example/app:1",
               "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}}
        tenant.pod("secret", [app], annotations={"cfnet.io/min-security-level": "5"})
        tenant.pod("resident", [app], annotations={"cfnet.io/residency": "vault"})
        msgs: dict[str, str] = {}

        def refused() -> bool:
            for e in tenant.events("FailedScheduling"):
                msgs[e["involvedObject"]["name"]] = e["message"]
            return {"secret", "resident"} <= set(msgs)

        wait_for(refused, timeout=15, what="FailedScheduling for both constrained pods")
        # the rogue node too (level 0, no region to cfnet); other tests' nodes may add to the
        # counts, none has level 5 or region "vault"
        assert " security" in msgs["secret"] and msgs["secret"].startswith("0/"), msgs
        assert " residency" in msgs["resident"] and msgs["resident"].startswith("0/"), msgs
        rec = core.actuator.registry.get(name)
        assert rec is not None and (rec.security_level, rec.region, rec.agent_id) == (0, "", name)
        assert core.actuator.registry.node_for_agent("edge-trusted") is None
        ev = wait_for(lambda: node_events(cluster.c, name, "NodeLabelIgnored"), timeout=10,
                      what=f"a NodeLabelIgnored event on node {name}")
        assert ev[0]["type"] == "Warning"
        assert all(k in ev[0]["message"] for k in ("cfnet.io/security-level", SECURITY,
                                                   "cfnet.io/agent-id", AGENT_ID)), ev[0]
        bound_within(cluster, "canary-0")
        def tenant_pods() -> dict[str, dict[str, Any]]:
            return {p["metadata"]["name"]: p
                    for p in tenant.c.list(f"/api/v1/namespaces/{tenant.ns}/pods")[0]}

        pods = tenant_pods()
        assert not pods["secret"]["spec"].get("nodeName")
        assert not pods["resident"]["spec"].get("nodeName")

        # the administrator's word, in the protected keys, is what places them there
        cluster.c.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {
            SECURITY: "5", RESIDENCY_REGION: "vault"}}})

        def placed() -> dict[str, str] | None:
            got = {n: p["spec"].get("nodeName") for n, p in tenant_pods().items()}
            both = {k: got[k] for k in ("secret", "resident")}
            return both if all(both.values()) else None

        assert wait_for(placed, timeout=15, what="both pods bound once the admin labelled"
                        ) == {"secret": name, "resident": name}
        bound_within(cluster, "canary-1")
