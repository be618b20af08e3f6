"""Decoding a cluster's list pages: the generic decoder (the old path) against the lean
schemas of ``cloud_core/k8s/objects.py``, in the same run.

The pages are generated shaped like the API server's answers (a kwok/kubelet Node with
managedFields, labels, conditions, images, nodeInfo; a Deployment's running Pod with
managedFields, owner reference, the projected ServiceAccount volume, status conditions and
container statuses), 500 items a page as the reflectors ask. Each repetition decodes every
page once with each path (alternated, so machine load falls on both); the table gives the
median and spread of the CPU-seconds (``time.process_time``) per path::

    .venv/bin/python tools/bench_decode.py --nodes 5000 --pods 10000 --reps 5
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import msgspec

from cloud_core.k8s import objects
from tools.stats import pct

_encode = msgspec.json.Encoder().encode
_generic = msgspec.json.Decoder().decode
T = "2026-12-01T10:00:00Z"


def _managed(manager: str, operation: str, fields: dict[str, Any],
             sub: str | None = None) -> dict[str, Any]:
    m = {"manager": manager, "operation": operation, "apiVersion": "v1", "time": T,
         "fieldsType": "FieldsV1", "fieldsV1": fields}
    if sub:
        m["subresource"] = sub
    return m


def node(i: int) -> dict[str, Any]:
    name = f"edge-{i:05d}"
    conds = [{"type": t, "status": s, "lastHeartbeatTime": T, "lastTransitionTime": T,
              "reason": r, "message": m} for t, s, r, m in (
        ("MemoryPressure", "False", "KubeletHasSufficientMemory",
         "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID "
         "available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"))]
    cond_fields: dict[str, Any] = {
        f'k:{{"type":"{c["type"]}"}}': {".": {}, "f:lastHeartbeatTime": {},
                                        "f:lastTransitionTime": {}, "f:message": {},
                                        "f:reason": {}, "f:status": {}, "f:type": {}}
        for c in conds}
    labels = {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
              "kubernetes.io/os": "linux", "node-role.kubernetes.io/edge": "",
              "topology.kubernetes.io/region": f"r{i % 4}",
              "topology.kubernetes.io/zone": f"z{i % 16}", "type": "kwok",
              "cfnet.io/region": f"r{i % 4}", "cfnet.io/security-level": str(i % 3)}
    images = [{"names": [f"registry.example/team{j}/app{j}@sha256:{j:064x}",
                         f"registry.example/team{j}/app{j}:v1.{j}.0"],
               "sizeBytes": 10_000_000 + j * 12345} for j in range(24)]
    return {
        "metadata": {
            "name": name, "uid": f"{i:08x}-1111-2222-3333-444455556666",
            "resourceVersion": str(1000 + i), "creationTimestamp": T, "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake",
                            "node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "managedFields": [
                _managed("kubectl-create", "Update", {"f:metadata": {
                    "f:annotations": {".": {}, "f:kwok.x-k8s.io/node": {}},
                    "f:labels": {".": {}, **{f"f:{k}": {} for k in labels}}},
                    "f:spec": {"f:taints": {}}}),
                _managed("kube-controller-manager", "Update", {"f:metadata": {
                    "f:annotations": {"f:node.alpha.kubernetes.io/ttl": {}}},
                    "f:spec": {"f:podCIDR": {}, "f:podCIDRs": {".": {}, 'v:"10.0.0.0/24"': {}}}}),
                _managed("kwok", "Update", {"f:status": {
                    "f:addresses": {}, "f:allocatable": {}, "f:capacity": {},
                    "f:conditions": cond_fields, "f:daemonEndpoints": {}, "f:images": {},
                    "f:nodeInfo": {}}}, "status"),
            ]},
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24",
                 "podCIDRs": [f"10.{i // 256 % 256}.{i % 256}.0/24"],
                 "providerID": f"kwok://{name}"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": f"10.1.{i // 256 % 256}.{i % 256}"},
                          {"type": "Hostname", "address": name}],
            "allocatable": {"cpu": "32", "ephemeral-storage": "100Gi", "hugepages-1Gi": "0",
                            "hugepages-2Mi": "0", "memory": "128Gi", "pods": "110"},
            "capacity": {"cpu": "32", "ephemeral-storage": "100Gi", "hugepages-1Gi": "0",
                         "hugepages-2Mi": "0", "memory": "128Gi", "pods": "110"},
            "conditions": conds,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "images": images,
            "nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion":
                         "containerd://1.7.24", "kernelVersion": "6.1.0-27-amd64",
                         "kubeProxyVersion": "", "kubeletVersion": "v1.34.4",
                         "machineID": "", "operatingSystem": "linux",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "systemUUID": ""},
            "phase": "Running"}}


def pod(i: int, nodes: int) -> dict[str, Any]:
    app = f"app{i // 100}"
    name = f"{app}-7d9f8c6b5-{i:05x}"
    ns = f"team{i // 1000}"
    node_name = f"edge-{i % max(nodes, 1):05d}"
    labels = {"app": app, "pod-template-hash": "7d9f8c6b5", "tier": "backend"}
    conds = [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": T}
             for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                       "PodScheduled")]
    return {
        "metadata": {
            "name": name, "generateName": f"{app}-7d9f8c6b5-", "namespace": ns,
            "uid": f"{i:08x}-aaaa-bbbb-cccc-ddddeeeeffff",
            "resourceVersion": str(200000 + i), "creationTimestamp": T, "labels": labels,
            "annotations": {"cfnet.io/placement-policy": "latency"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": f"{app}-7d9f8c6b5", "uid": "f0f0-1234",
                                 "controller": True, "blockOwnerDeletion": True}],
            "managedFields": [
                _managed("kube-controller-manager", "Update", {
                    "f:metadata": {"f:annotations": {".": {}, "f:cfnet.io/placement-policy": {}},
                                   "f:generateName": {},
                                   "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {},
                                                "f:tier": {}},
                                   "f:ownerReferences": {".": {}, 'k:{"uid":"f0f0-1234"}': {}}},
                    "f:spec": {"f:containers": {'k:{"name":"main"}': {
                        ".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
                        "f:ports": {".": {}, 'k:{"containerPort":8080,"protocol":"TCP"}': {
                            ".": {}, "f:containerPort": {}, "f:protocol": {}}},
                        "f:resources": {".": {}, "f:limits": {".": {}, "f:memory": {}},
                                        "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}},
                        "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}},
                        "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {},
                        "f:schedulerName": {}, "f:securityContext": {},
                        "f:terminationGracePeriodSeconds": {}}}),
                _managed("kwok", "Update", {"f:status": {
                    "f:conditions": {f'k:{{"type":"{c["type"]}"}}': {
                        ".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {},
                        "f:status": {}, "f:type": {}} for c in conds},
                    "f:containerStatuses": {}, "f:hostIP": {}, "f:hostIPs": {}, "f:phase": {},
                    "f:podIP": {}, "f:podIPs": {".": {}, 'k:{"ip":"10.0.0.1"}': {
                        ".": {}, "f:ip": {}}}, "f:startTime": {}}}, "status"),
            ]},
        "spec": {
            "containers": [{
                "name": "main", "image": f"registry.example/{ns}/{app}:v1.2.3",
                "imagePullPolicy": "IfNotPresent",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "MODE", "value": "prod"}, {"name": "POD_NAME", "valueFrom": {
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
                "resources": {"limits": {"memory": "256Mi"},
                              "requests": {"cpu": "100m", "memory": "128Mi"}},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "volumeMounts": [{"name": "kube-api-access-x1y2z", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
            }],
            "dnsPolicy": "ClusterFirst", "enableServiceLinks": True, "nodeName": node_name,
            "preemptionPolicy": "PreemptLowerPriority", "priority": 0,
            "restartPolicy": "Always",
            "schedulerName": "cfnet-scheduler" if i % 2 else "default-scheduler",
            "securityContext": {}, "serviceAccount": "default",
            "serviceAccountName": "default", "terminationGracePeriodSeconds": 30,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300},
                            {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}],
            "volumes": [{"name": "kube-api-access-x1y2z", "projected": {
                "defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                                   "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                        "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
        },
        "status": {
            "conditions": conds,
            "containerStatuses": [{
                "containerID": f"containerd://{i:064x}", "image":
                f"registry.example/{ns}/{app}:v1.2.3", "imageID": f"sha256:{i:064x}",
                "lastState": {}, "name": "main", "ready": True, "restartCount": 0,
                "started": True, "state": {"running": {"startedAt": T}}}],
            "hostIP": "10.1.0.1", "hostIPs": [{"ip": "10.1.0.1"}], "phase": "Running",
            "podIP": f"10.0.{i // 256 % 256}.{i % 256}", "podIPs": [{"ip": "10.0.0.1"}],
            "qosClass": "Burstable", "startTime": T}}


def pages(objs: list[dict[str, Any]], kind: str, per_page: int = 500) -> list[bytes]:
    """``objs`` as the API server's list answers, ``per_page`` items each."""
    out = []
    for k in range(0, len(objs), per_page):
        more = k + per_page < len(objs)
        meta: dict[str, Any] = {"resourceVersion": "999999"}
        if more:
            meta["continue"] = f"token-{k}"
        out.append(_encode({"kind": f"{kind}List", "apiVersion": "v1", "metadata": meta,
                            "items": objs[k:k + per_page]}))
    return out


def old_path(data: bytes) -> list[Any]:
    page = _generic(data)
    return [*(page.get("items") or [])]


def new_path(schema: objects.Schema) -> Callable[[bytes], list[Any]]:
    def decode(data: bytes) -> list[Any]:
        page = schema.page(data)
        return [*(page.get("items") or [])]
    return decode


def cpu_s(decode: Callable[[bytes], list[Any]], page_set: list[bytes]) -> float:
    """CPU-seconds to decode every page of ``page_set`` (results kept until the end, as the
    reflector's store keeps them)."""
    gc.collect()
    t0 = time.process_time()
    kept = [decode(p) for p in page_set]
    t = time.process_time() - t0
    del kept
    return t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="1,000 nodes, 2,000 pods, 3 repetitions (make bench)")
    a = ap.parse_args(argv)
    if a.quick:
        a.nodes, a.pods, a.reps = 1000, 2000, 3
    node_pages = pages([node(i) for i in range(a.nodes)], "Node")
    pod_pages = pages([pod(i, a.nodes) for i in range(a.pods)], "Pod")
    mib = (sum(map(len, node_pages)) + sum(map(len, pod_pages))) / (1 << 20)
    # the two paths must give the same items but for what cfnet never reads
    assert len(new_path(objects.POD)(pod_pages[0])) == len(old_path(pod_pages[0]))
    # as the actuator decodes them: cfnet's pods' specs whole, the others' lean
    pod_schema = objects.PodSchema(frozenset({"cfnet-scheduler"}))
    runs: dict[str, list[float]] = {"generic (old)": [], "lean schema (new)": []}
    for _ in range(a.reps):
        runs["generic (old)"].append(cpu_s(old_path, node_pages) + cpu_s(old_path, pod_pages))
        runs["lean schema (new)"].append(cpu_s(new_path(objects.NODE), node_pages)
                                         + cpu_s(new_path(pod_schema), pod_pages))
    print(f"{a.nodes} nodes + {a.pods} pods (half cfnet's, half another scheduler's): "
          f"{len(node_pages) + len(pod_pages)} pages, {mib:.1f} MiB of JSON; {a.reps} "
          "repetitions, alternated")
    print(f"{'path':<20} {'CPU-s median':>12} {'min':>8} {'max':>8}")
    for k, xs in runs.items():
        print(f"{k:<20} {pct(xs, 0.5):>12.3f} {min(xs):>8.3f} {max(xs):>8.3f}")
    old, new = pct(runs["generic (old)"], 0.5), pct(runs["lean schema (new)"], 0.5)
    print(f"lean/generic: {new / old:.2f} (fallbacks: {objects.STATS['fallback']})")


if __name__ == "__main__":
    main()
