"""Pods run: a real kubelet starts them, Services and cluster DNS route to them, kwok's
simulated nodes run theirs.

The node is ``tools/envtest/node.py`` (containerd, kubelet, kube-proxy, CoreDNS in a network
namespace of its own); the image is ``cfnet.local/podbin:1``, built here and imported into
its containerd (``imagePullPolicy: Never``: there is no registry).
"""

from __future__ import annotations

import contextlib
import sys
import urllib.error
import uuid
from typing import Any

import pytest

from tests.cluster.conftest import RealCluster
from tools.envtest.images import PODBIN_IMAGE

pytestmark = pytest.mark.timeout(600)


def _ns(rc: RealCluster) -> str:
    ns = f"rn-{uuid.uuid4().hex[:8]}"
    rc.cp.ensure_namespace(ns)
    rc.cp.wait_default_service_account(ns, timeout=60)
    return ns


def _pod(name: str, args: list[str], *, labels: dict[str, str] | None = None,
         node: str = "cfk-node", restart: str = "Always",
         probe_port: int | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": PODBIN_IMAGE, "imagePullPolicy": "Never",
                         "args": args,
                         "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}
    if probe_port:
        c["ports"] = [{"containerPort": probe_port}]
        c["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": probe_port},
                               "periodSeconds": 1}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "restartPolicy": restart, "terminationGracePeriodSeconds": 1,
                     "containers": [c]}}


def _get_pod(rc: RealCluster, ns: str, name: str) -> dict[str, Any]:
    return dict(rc.cp.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}"))


def _ready(pod: dict[str, Any]) -> bool:
    st = pod.get("status") or {}
    return st.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in st.get("conditions") or [])


def _if(pred: Any, value: Any) -> Any:
    return value if pred(value) else None


def _cleanup(rc: RealCluster, ns: str) -> None:
    with contextlib.suppress(OSError, urllib.error.URLError):
        rc.cp.request("DELETE", f"/api/v1/namespaces/{ns}")


def test_pod_runs_and_serves_on_the_real_node(real_cluster: RealCluster) -> None:
    rc, ns = real_cluster, _ns(real_cluster)
    try:
        rc.cp.request("POST", f"/api/v1/namespaces/{ns}/pods",
                      _pod("web", ["serve", "8080"], probe_port=8080))
        pod = rc.wait(lambda: _if(_ready, _get_pod(rc, ns, "web")), 180,
                      "pod web Running and Ready on the real node")
        assert pod["spec"]["nodeName"] == "cfk-node"
        ip = pod["status"]["podIP"]
        assert ip.startswith("10.251.0."), ip
        # The pod's address answers from the node's namespace (the CNI bridge).
        code = (f"import urllib.request;print(urllib.request.urlopen('http://{ip}:8080/',"
                "timeout=5).read().decode())")
        out = rc.node.exec_in_ns([sys.executable, "-c", code]).stdout
        assert out.startswith("podbin web"), out
    finally:
        _cleanup(rc, ns)


def test_service_and_cluster_dns_route_to_pods(real_cluster: RealCluster) -> None:
    rc, ns = real_cluster, _ns(real_cluster)
    try:
        rc.cp.request("POST", f"/api/v1/namespaces/{ns}/pods",
                      _pod("web", ["serve", "8080"], labels={"app": "web"}, probe_port=8080))
        rc.cp.request("POST", f"/api/v1/namespaces/{ns}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"},
                     "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
        rc.wait(lambda: _ready(_get_pod(rc, ns, "web")), 180, "pod web Ready")
        # A client pod resolves the Service's name through CoreDNS (10.0.0.10, kube-proxy's
        # DNAT to the node) and reaches the backend through the ClusterIP; another reaches
        # the API server through the kubernetes Service.
        rc.cp.request("POST", f"/api/v1/namespaces/{ns}/pods",
                      _pod("client", ["get", f"http://web.{ns}.svc.cluster.local/"],
                           restart="OnFailure"))
        rc.cp.request("POST", f"/api/v1/namespaces/{ns}/pods",
                      _pod("apiserver", ["dial", "kubernetes.default.svc.cluster.local:443"],
                           restart="OnFailure"))
        for name in ("client", "apiserver"):
            rc.wait(lambda n=name: _get_pod(rc, ns, n)["status"].get("phase") == "Succeeded",
                    180, f"pod {name} Succeeded\n{rc.node.pod_log(ns, name, 'main')}")
        assert "200 podbin web" in rc.node.pod_log(ns, "client", "main")
        assert "connected" in rc.node.pod_log(ns, "apiserver", "main")
    finally:
        _cleanup(rc, ns)


def test_kwok_nodes_run_and_finish_pods(real_cluster: RealCluster) -> None:
    rc, ns = real_cluster, _ns(real_cluster)
    names = [f"kwok-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    try:
        for n in names:
            rc.kwok.node(n, labels={"cfnet.test/kwok": ns})
        rc.cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sim"},
            "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "sim"}},
                     "template": {"metadata": {"labels": {"app": "sim"}}, "spec": {
                         "nodeSelector": {"cfnet.test/kwok": ns},
                         "containers": [{"name": "main", "image": "registry.example/sim:1"}]}}}})

        def pods() -> list[dict[str, Any]]:
            return list(rc.cp.request(
                "GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3Dsim")["items"])

        running = rc.wait(lambda: _if(lambda p: len(p) == 6 and all(map(_ready, p)), pods()),
                          120, "6 pods Running and Ready on kwok nodes")
        assert {p["spec"]["nodeName"] for p in running} <= set(names)
        # A deleted pod finishes terminating (kwok plays the kubelet) and is replaced.
        victim = running[0]["metadata"]["name"]
        rc.cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{victim}")
        rc.wait(lambda: (p := pods()) and victim not in {x["metadata"]["name"] for x in p}
                and len(p) == 6 and all(map(_ready, p)), 120,
                f"pod {victim} gone and its replacement Ready")
    finally:
        _cleanup(rc, ns)
        for n in names:
            with contextlib.suppress(OSError, urllib.error.URLError):
                rc.cp.request("DELETE", f"/api/v1/nodes/{n}")
