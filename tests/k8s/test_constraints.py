"""Every hard constraint of a PodSpec, honoured or refused, against the real API server.

Table-driven: each case creates its own labelled nodes (the pods select them, so nodes of
other tests never count) and pods in a fresh namespace, lets one actuator (module-scoped,
cluster admin: RBAC is covered by test_actuator/test_rbac) place them, then checks the
bindings with an independent reading of the live objects and the ``FailedScheduling`` events
of the pods that must stay pending.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from cloud_core.k8s.actuator import Actuator, ActuatorConfig
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.k8s.wiring import build_actuator
from cloud_core.placement.model import Health
from tests.k8s.conftest import Cluster, make_node, wait_for
from tools.envtest import ControlPlane

pytestmark = pytest.mark.slow

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


@pytest.fixture(scope="module")
def act(control_plane: ControlPlane) -> Iterator[Actuator]:
    c = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    a = build_actuator(c, NodeRegistry(), ActuatorConfig(identity="constraints",
                                                         retry_unschedulable_s=2.0))
    a.start()
    assert a.wait_synced(30)
    yield a
    a.stop()
    c.close()


def spread(key: str, skew: int = 1, **kw: Any) -> dict[str, Any]:
    return {"topologySpreadConstraints": [{
        "maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "x"}}, **kw}]}


def term(key: str, app: str) -> dict[str, Any]:
    return {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]}


def port(p: int) -> dict[str, Any]:
    return {"containers": [{"name": "app", "image": "registry.example/app:1",
                            "ports": [{"containerPort": 80, "hostPort": p}],
                            "resources": {"requests": {"cpu": "100m"}}}]}


def ext(n: int) -> dict[str, Any]:
    return {"containers": [{"name": "app", "image": "registry.example/app:1",
                            "resources": {"requests": {"cpu": "100m", "example.com/dongle": n},
                                          "limits": {"example.com/dongle": n}}}]}


@dataclass
class Case:
    name: str
    nodes: list[tuple[str, str]]  # (node suffix, zone)
    pods: list[tuple[str, dict[str, Any], dict[str, str]]]  # (name, spec extras, labels)
    bound: int  # how many must bind
    check: Callable[[dict[str, str], dict[str, dict[str, Any]]], None] = lambda b, n: None
    # in the FailedScheduling message of each pod left pending: the tally names the
    # constraint checked pod by pod, node by node, as kube-scheduler's "0/2 nodes are
    # available: 2 node(s) didn't have free ports for the requested pod ports"
    pending_reason: str = ""
    node_extra: dict[str, Any] = field(default_factory=dict)


def zones_of(bound: dict[str, str], nodes: dict[str, dict[str, Any]]) -> collections.Counter[str]:
    return collections.Counter(nodes[n]["metadata"]["labels"][ZONE] for n in bound.values())


def _spread_ok(b: dict[str, str], n: dict[str, dict[str, Any]]) -> None:
    z = zones_of(b, n)
    assert len(z) == 3 and max(z.values()) - min(z.values()) <= 1, z


def _distinct_nodes(b: dict[str, str], n: dict[str, dict[str, Any]]) -> None:
    assert len(set(b.values())) == len(b), b


def _with_anchor(b: dict[str, str], n: dict[str, dict[str, Any]]) -> None:
    zone = n[b["anchor"]]["metadata"]["labels"][ZONE]
    assert all(n[v]["metadata"]["labels"][ZONE] == zone for v in b.values()), b


def _away_from_anchor(b: dict[str, str], n: dict[str, dict[str, Any]]) -> None:
    zone = n[b["anchor"]]["metadata"]["labels"][ZONE]
    assert all(n[v]["metadata"]["labels"][ZONE] != zone for k, v in b.items()
               if k != "anchor"), b


X = {"app": "x"}
THREE_ZONES = [(f"{z}{i}", z) for z in "abc" for i in range(2)]
CASES = [
    Case("spread-zone", THREE_ZONES, [(f"s{i}", spread(ZONE), X) for i in range(7)], 7,
         _spread_ok),
    Case("spread-min-domains", THREE_ZONES,
         [(f"s{i}", spread(ZONE, minDomains=4), X) for i in range(4)], 3,
         pending_reason="0/6 nodes fit: 6 spread skew > 1 (topology.kubernetes.io/zone)"),
    Case("spread-hostname-skew", [("a0", "a"), ("a1", "a")],
         [(f"s{i}", spread(HOST), X) for i in range(4)], 4,
         lambda b, n: (_ for _ in ()).throw(AssertionError(b))
         if sorted(collections.Counter(b.values()).values()) != [2, 2] else None),
    Case("anti-affinity-hostname", [("a0", "a"), ("a1", "a"), ("b0", "b")],
         [(f"s{i}", {"affinity": {"podAntiAffinity": term(HOST, "x")}}, X) for i in range(4)],
         3, _distinct_nodes, pending_reason="pod anti-affinity"),
    Case("affinity-zone", THREE_ZONES,
         [("anchor", {}, {"app": "anchor"})]
         + [(f"f{i}", {"affinity": {"podAffinity": term(ZONE, "anchor")}}, X)
            for i in range(3)], 4, _with_anchor),
    Case("anti-affinity-zone", [("a0", "a"), ("b0", "b")],
         [("anchor", {}, {"app": "anchor"})]
         + [(f"f{i}", {"affinity": {"podAntiAffinity": term(ZONE, "anchor")}}, X)
            for i in range(2)], 3, _away_from_anchor),
    Case("host-ports", [("a0", "a"), ("a1", "a")], [(f"p{i}", port(8080), X) for i in range(3)],
         2, _distinct_nodes, pending_reason="0/2 nodes fit: 2 host port in use"),
    Case("extended-resources", [("a0", "a")], [(f"e{i}", ext(1), X) for i in range(3)], 2,
         pending_reason="0/1 nodes fit: 1 insufficient example.com/dongle",
         node_extra={"example.com/dongle": "2"}),
    Case("pods-per-node", [("a0", "a")], [(f"c{i}", {}, X) for i in range(3)], 2,
         pending_reason="0/1 nodes fit: 1 too many pods", node_extra={"pods": "2"}),
]


def _node(c: KubeClient, name: str, zone: str, case: str, extra: dict[str, str]) -> None:
    make_node(c, name, {HOST: name, ZONE: zone, "topology.kubernetes.io/region": "r",
                        "cfnet.io/case": case},
              capacity={"cpu": "4", "memory": "8Gi", "pods": "110", **extra})


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_constraint_against_the_api_server(case: Case, admin: KubeClient, act: Actuator) -> None:
    cl = Cluster(admin)
    tag = uuid.uuid4().hex[:6]
    try:
        names = {}
        for suffix, zone in case.nodes:
            n = f"{case.name}-{suffix}-{tag}"
            names[suffix] = n
            _node(admin, n, zone, tag, case.node_extra)
            cl.nodes.append(n)
        # as make_node left them (Ready, the admission's not-ready taint gone): a step runs
        # as soon as a pod arrives, so one on a version still tainted would be refused for it
        wait_for(lambda: all((r := act.registry.get(n)) is not None and not r.taints
                             and r.health is Health.ONLINE for n in names.values()),
                 timeout=15, what="nodes in the registry, Ready and untainted")
        for name, extra, labels in case.pods:
            spec: dict[str, Any] = {
                "schedulerName": "cfnet-scheduler", "nodeSelector": {"cfnet.io/case": tag},
                "containers": [{"name": "app", "image": "registry.example/app:1",
                                "resources": {"requests": {"cpu": "100m"}}}], **extra}
            admin.create(f"/api/v1/namespaces/{cl.namespace}/pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": labels}, "spec": spec})
        pending = len(case.pods) - case.bound

        def settled() -> bool:
            b = {p["metadata"]["name"] for p in cl.pods() if p["spec"].get("nodeName")}
            failed = {e["involvedObject"]["name"] for e in cl.events("FailedScheduling")}
            return len(b) >= case.bound and len(failed - b) >= pending

        wait_for(settled, timeout=30, what=f"{case.bound} bound, {pending} refused")
        pods = cl.pods()
        bound = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods
                 if p["spec"].get("nodeName")}
        assert len(bound) == case.bound, bound
        nodes = {n: admin.get(f"/api/v1/nodes/{n}") for n in names.values()}
        case.check(bound, nodes)
        for e in cl.events("FailedScheduling"):
            if e["involvedObject"]["name"] not in bound:
                assert case.pending_reason in e["message"], e["message"]
    finally:
        cl.cleanup()


@pytest.mark.parametrize("field_name,extra", [
    ("spec.volumes[0].persistentVolumeClaim",
     {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}),
    ("spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
     ".namespaceSelector",
     {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
         {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": ZONE,
          "namespaceSelector": {}}]}}}),
])
def test_unsupported_field_is_refused_by_name(field_name: str, extra: dict[str, Any],
                                              admin: KubeClient, act: Actuator) -> None:
    cl = Cluster(admin)
    try:
        tag = uuid.uuid4().hex[:6]
        n = f"unsup-{tag}"
        _node(admin, n, "a", tag, {})
        cl.nodes.append(n)
        admin.create(f"/api/v1/namespaces/{cl.namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "refused"},
            "spec": {"schedulerName": "cfnet-scheduler",
                     "containers": [{"name": "app", "image": "registry.example/app:1"}],
                     **extra}})
        ev = wait_for(lambda: cl.events("FailedScheduling"), timeout=30,
                      what="FailedScheduling event")
        assert field_name in ev[0]["message"] and "not supported" in ev[0]["message"]
        assert not admin.get(f"/api/v1/namespaces/{cl.namespace}/pods/refused")["spec"].get(
            "nodeName")
    finally:
        cl.cleanup()
