"""Cases taken from kube-scheduler's own plugin tests, each run through cfnet's engine,
validator and ``explain`` (which must agree on every node): the semantic cases;
each case names its upstream file and case.
"""

from __future__ import annotations

from typing import Any

import pytest

from cloud_core.placement import (
    ClusterSnapshot,
    NodeInfo,
    Resources,
    RunningPod,
    Workload,
    parse_pod,
)
from cloud_core.placement.model import HostPort
from tests.unit.agreement import fitting_nodes


def _pod(init: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "a", "uid": "p"},
            "spec": {"schedulerName": "cfnet-scheduler", "initContainers": init,
                     "containers": [{"name": "c", "image": "x"}]}}


# pkg/scheduler/framework/plugins/nodeports/node_ports_test.go, TestNodePorts
@pytest.mark.parametrize(("case", "sidecar", "fits"), [
    ("non-sidecar initContainer using hostPort", False, True),
    ("TCP hostPort conflict from sidecar initContainer", True, False),
])
def test_nodeports_init_containers(case: str, sidecar: bool, fits: bool) -> None:
    init = {"name": "i", "image": "x",
            "ports": [{"containerPort": 8001, "hostPort": 8001, "protocol": "TCP"}]}
    if sidecar:
        init["restartPolicy"] = "Always"
    w = parse_pod(_pod([init]))
    held = RunningPod(uid="m1", name="m1", namespace="a", node="n1", labels={},
                      host_ports=(HostPort(8001, "TCP", "0.0.0.0"),))
    snap = ClusterSnapshot(nodes=(NodeInfo("n1", "r", "z", capacity=Resources(4000, 1 << 30)),),
                           links={}, now=0.0, pods=(held,))
    assert (fitting_nodes(snap, w) == {"n1"}) is fits, case


# pkg/scheduler/framework/plugins/noderesources/fit_test.go, TestEnoughRequests
def test_fit_skip_checking_resource_request_with_quantity_zero() -> None:
    ext = "example.com/aaa"
    node = NodeInfo("n1", "r", "z", capacity=Resources(10, 20, 0),
                    allocated=Resources(20, 30, 0), max_pods=32, extended={ext: 5})
    running = RunningPod(uid="r", name="r", namespace="a", node="n1", labels={},
                         requests=Resources(20, 30, 0), extended={ext: 1})
    snap = ClusterSnapshot(nodes=(node,), links={}, now=0.0, pods=(running,))
    w = Workload(uid="w", name="w", namespace="a", extended={ext: 1})
    assert fitting_nodes(snap, w) == {"n1"}


def _affine_pod() -> Workload:
    sel = {"foo": ("foo", "bar"), "service": ("service", "securityscan")}
    return parse_pod({
        "metadata": {"name": "pod-to-place", "namespace": "default", "uid": "x",
                     "labels": {"foo": "bar", "service": "securityscan"}},
        "spec": {"schedulerName": "cfnet-scheduler", "containers": [{"name": "c",
                                                                     "image": "x"}],
                 "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                     {"labelSelector": {"matchExpressions": [
                         {"key": k, "operator": "In", "values": [v]}]},
                      "topologyKey": "zone"} for k, v in sel.values()]}}}})


# pkg/scheduler/framework/plugins/interpodaffinity/filtering_test.go,
# TestRequiredAffinityMultipleNodes
@pytest.mark.parametrize(("case", "zone_key", "want"), [
    ("The affinity rule is to schedule all of the pods of this collection to the same zone. "
     "The first pod of the collection should not be blocked from being scheduled onto any "
     "node, even there's no existing pod that matches the rule anywhere.", "zone",
     {"nodeA", "nodeB"}),
    ("The first pod of the collection can only be scheduled on nodes labelled with the "
     "requested topology keys", "zoneLabel", set()),
])
def test_interpodaffinity_multiple_terms_first_pod(case: str, zone_key: str,
                                                   want: set[str]) -> None:
    nodes = tuple(NodeInfo(n, "r", "", labels={zone_key: z, "hostname": h},
                           capacity=Resources(4000, 1 << 30))
                  for n, z, h in (("nodeA", "az1", "h1"), ("nodeB", "az2", "h2")))
    p1 = RunningPod(uid="p1", name="p1", namespace="default", node="nodeA",
                    labels={"foo": "bar"})  # matches the first term only
    snap = ClusterSnapshot(nodes=nodes, links={}, now=0.0, pods=(p1,))
    assert fitting_nodes(snap, _affine_pod()) == want, case


# pkg/scheduler/framework/plugins/podtopologyspread/filtering_test.go, TestSingleConstraint
def test_podtopologyspread_terminating_pods_should_be_excluded() -> None:
    w = parse_pod({
        "metadata": {"name": "p", "namespace": "default", "uid": "p", "labels": {"foo": ""}},
        "spec": {"schedulerName": "cfnet-scheduler", "containers": [{"name": "c", "image": "x"}],
                 "topologySpreadConstraints": [{
                     "maxSkew": 1, "topologyKey": "node", "whenUnsatisfiable": "DoNotSchedule",
                     "labelSelector": {"matchExpressions": [{"key": "foo",
                                                             "operator": "Exists"}]}}]}})
    nodes = tuple(NodeInfo(n, "r", "", labels={"node": n}, capacity=Resources(4000, 1 << 30))
                  for n in ("node-a", "node-b"))
    pods = (RunningPod(uid="p-a", name="p-a", namespace="default", node="node-a",
                       labels={"foo": ""}, terminating=True),
            RunningPod(uid="p-b", name="p-b", namespace="default", node="node-b",
                       labels={"foo": ""}))
    snap = ClusterSnapshot(nodes=nodes, links={}, now=0.0, pods=pods)
    assert fitting_nodes(snap, w) == {"node-a"}
