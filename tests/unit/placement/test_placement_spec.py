"""Workload spec parsing: Pods, controllers, plain YAML; errors name the field and reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cloud_core.errors import CoreError, PlacementError, SpecError
from cloud_core.placement import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Resources,
    Toleration,
    Workload,
    parse_pod,
    parse_workload_yaml,
)
from cloud_core.placement.model import HOSTNAME
from cloud_core.placement.spec_values import parse_quantity

POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {
        "name": "infer", "namespace": "ml", "uid": "u-1", "labels": {"app": "infer"},
        "annotations": {
            "cfnet.io/max-latency-ms": "50", "cfnet.io/latency-to": "eu-west-1a",
            "cfnet.io/residency": "eu-west, eu-central", "cfnet.io/min-security-level": "2",
            "cfnet.io/data": "frames", "cfnet.io/data-gb": "120",
            "cfnet.io/data-location": "eu-west", "cfnet.io/cost-weight": "0.5",
        },
    },
    "spec": {
        "schedulerName": "cfnet-scheduler",
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi",
                                                     "nvidia.com/gpu": 1}}},
            {"name": "b", "resources": {"limits": {"cpu": "1.5", "memory": "512Mi"}}},
        ],
        "nodeSelector": {"cfnet.io/tier": "edge"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                         "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "disk", "operator": "In", "values": ["ssd"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 80, "preference": {"matchExpressions": [
                        {"key": "gen", "operator": "Gt", "values": ["4"]}]}},
                    {"weight": 20, "preference": {"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["edge-1"]}]}},
                ]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "infer"}},
                 "topologyKey": "kubernetes.io/hostname"}]},
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchExpressions": [
                    {"key": "app", "operator": "In", "values": ["cache"]}]},
                 "topologyKey": "topology.kubernetes.io/zone"}]},
        },
    },
}


def test_full_pod() -> None:
    w = parse_pod(POD)
    assert (w.uid, w.name, w.namespace) == ("u-1", "infer", "ml")
    assert w.requests == Resources(2000, (1 << 30) + (512 << 20), 1)
    assert dict(w.node_selector) == {"cfnet.io/tier": "edge"}
    assert w.tolerations == (Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),)
    assert w.node_affinity[0].match_expressions == (
        NodeSelectorRequirement("disk", "In", ("ssd",)),)
    assert w.preferred_node_affinity == (
        (80, NodeSelectorTerm((NodeSelectorRequirement("gen", "Gt", ("4",)),))),
        (20, NodeSelectorTerm((NodeSelectorRequirement(HOSTNAME, "In", ("edge-1",)),))))
    assert w.pod_anti_affinity[0].topology_key == "kubernetes.io/hostname"
    assert w.pod_affinity[0].topology_key == "topology.kubernetes.io/zone"
    assert w.max_latency_ms == 50 and w.latency_to == "eu-west-1a"
    assert w.residency == frozenset({"eu-west", "eu-central"})
    assert w.min_security_level == 2
    assert (w.data_name, w.data_gb, w.data_location) == ("frames", 120.0, "eu-west")
    assert w.cost_weight == 0.5


def test_deployment_template() -> None:
    dep = {"kind": "Deployment", "metadata": {"name": "web", "namespace": "x"},
           "spec": {"replicas": 3, "template": {
               "metadata": {"labels": {"app": "web"},
                            "annotations": {"cfnet.io/min-security-level": "1"}},
               "spec": {"schedulerName": "cfnet-scheduler",
                        "containers": [{"name": "c", "resources": {"requests": {"cpu": 1}}}]}}}}
    ws = parse_workload_yaml(__import__("yaml").safe_dump(dep))
    assert [w.uid for w in ws] == ["x/web-0", "x/web-1", "x/web-2"]
    assert all(w.min_security_level == 1 and w.requests.cpu_milli == 1000 for w in ws)
    assert dict(ws[0].labels) == {"app": "web"}


def test_plain_yaml() -> None:
    text = """
name: trainer
replicas: 2
requests: {cpu: 2, memory: 4Gi, nvidia.com/gpu: 1}
residency: [eu-west]
maxLatencyMs: 20
latencyTo: edge-7
gang: train-1
podAntiAffinity:
  - labelSelector: {matchLabels: {app: trainer}}
    topologyKey: kubernetes.io/hostname
labels: {app: trainer}
---
name: logger
"""
    ws = parse_workload_yaml(text)
    assert [w.uid for w in ws] == ["default/trainer-0", "default/trainer-1", "default/logger"]
    t = ws[0]
    assert t.requests == Resources(2000, 4 << 30, 1) and t.gang == "train-1"
    assert t.residency == frozenset({"eu-west"}) and t.latency_to == "edge-7"
    assert ws[2].requests == Resources()


def test_preferred_node_affinity_in_templates_and_plain_yaml() -> None:
    """The controller's pod template and the plain form carry preferences like a Pod; an
    empty preference parses (Kubernetes: a no-op) and absent means none."""
    dep = {"kind": "Deployment", "metadata": {"name": "web"},
           "spec": {"replicas": 2, "template": {"spec": {
               "containers": [{"name": "c"}],
               "affinity": {"nodeAffinity": {PREF: [
                   {"weight": 100, "preference": {"matchExpressions": [
                       {"key": "zone-class", "operator": "NotIn", "values": ["far"]}]}},
                   {"weight": 1, "preference": {}}]}}}}}}
    ws = parse_workload_yaml(__import__("yaml").safe_dump(dep))
    want = ((100, NodeSelectorTerm((NodeSelectorRequirement("zone-class", "NotIn",
                                                            ("far",)),))),
            (1, NodeSelectorTerm()))
    assert [w.preferred_node_affinity for w in ws] == [want, want]
    text = """
name: trainer
preferredNodeAffinity:
  - weight: 30
    preference: {matchExpressions: [{key: disk, operator: Exists}]}
  - weight: 70
    preference:
      matchExpressions: [{key: gen, operator: Lt, values: ["9"]}]
      matchFields: [{key: metadata.name, operator: NotIn, values: [n1]}]
---
name: logger
"""
    t, lg = parse_workload_yaml(text)
    assert t.preferred_node_affinity == (
        (30, NodeSelectorTerm((NodeSelectorRequirement("disk", "Exists"),))),
        (70, NodeSelectorTerm((NodeSelectorRequirement("gen", "Lt", ("9",)),
                               NodeSelectorRequirement(HOSTNAME, "NotIn", ("n1",))))))
    assert lg.preferred_node_affinity == ()
    pod = copy.deepcopy(POD)
    del pod["spec"]["affinity"]["nodeAffinity"][PREF]
    assert parse_pod(pod).preferred_node_affinity == ()


@pytest.mark.parametrize("weight", [0, -1, 101, 1.5, 50.0, "50", True, None, [1]])
def test_workload_refuses_bad_preference_weights(weight: Any) -> None:
    """Built in code, not parsed: still a clear PlacementError, never a crash in a solve."""
    term = NodeSelectorTerm((NodeSelectorRequirement("a", "Exists"),))
    with pytest.raises(PlacementError, match=r"preferred_node_affinity\[0\]"):
        Workload("w", "w", preferred_node_affinity=((weight, term),))


@pytest.mark.parametrize("prefs", [[(1, "not a term")], [(1,)], (1, 2), "x"])
def test_workload_refuses_malformed_preferences(prefs: Any) -> None:
    with pytest.raises(PlacementError, match="preferred_node_affinity"):
        Workload("w", "w", preferred_node_affinity=prefs)


@pytest.mark.parametrize("value,kind,want", [
    ("500m", "cpu", 500), ("2", "cpu", 2000), ("0.25", "cpu", 250), (1, "cpu", 1000),
    ("1Gi", "mem", 1 << 30), ("128Mi", "mem", 128 << 20), ("1G", "mem", 10**9),
    ("1e3", "mem", 1000), ("1024", "mem", 1024), ("2", "count", 2),
])
def test_quantities(value: Any, kind: str, want: int) -> None:
    assert parse_quantity(value, "f", kind) == want


def _bad(path: list[Any], value: Any) -> dict[str, Any]:
    pod = copy.deepcopy(POD)
    obj = pod
    for p in path[:-1]:
        obj = obj[p]
    if value is _DELETE:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return pod


_DELETE = object()
ANN = ["metadata", "annotations"]
AFF = ["spec", "affinity"]
PREF = "preferredDuringSchedulingIgnoredDuringExecution"
PREF_PATH = [*AFF, "nodeAffinity", PREF]
PREF_FIELD = f"spec.affinity.nodeAffinity.{PREF}"


@pytest.mark.parametrize("path,value,field,reason", [
    (["metadata", "name"], _DELETE, "metadata.name", "is required"),
    (["spec", "schedulerName"], "default-scheduler", "spec.schedulerName", "not 'cfnet"),
    (["spec", "containers"], [], "spec.containers", "at least one"),
    (["spec", "containers", 0, "resources", "requests", "cpu"], "lots",
     "spec.containers[0].resources.requests.cpu", "not a quantity"),
    (["spec", "containers", 0, "resources", "requests", "nvidia.com/gpu"], "0.5",
     "spec.containers[0].resources.requests.nvidia.com/gpu", "whole number"),
    (["spec", "nodeSelector"], ["x"], "spec.nodeSelector", "must be a mapping"),
    (["spec", "tolerations", 0, "operator"], "Maybe", "spec.tolerations[0].operator",
     "not Equal or Exists"),
    (["spec", "tolerations", 0, "effect"], "Sometimes", "spec.tolerations[0].effect",
     "not a taint effect"),
    ([*AFF, "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
      "nodeSelectorTerms", 0, "matchExpressions", 0, "operator"], "Like",
     "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
     ".nodeSelectorTerms[0].matchExpressions[0].operator", "not one of"),
    ([*AFF, "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution", 0,
      "topologyKey"], _DELETE,
     "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
     ".topologyKey", "is required"),
    ([*ANN, "cfnet.io/max-latency-ms"], "fast", "metadata.annotations.cfnet.io/max-latency-ms",
     "not a number"),
    ([*ANN, "cfnet.io/max-latency-ms"], "-5", "metadata.annotations.cfnet.io/max-latency-ms",
     "must be > 0"),
    ([*ANN, "cfnet.io/latency-to"], _DELETE, "metadata.annotations.cfnet.io/latency-to",
     "required with max-latency-ms"),
    ([*ANN, "cfnet.io/residency"], " , ", "metadata.annotations.cfnet.io/residency",
     "names no region"),
    ([*ANN, "cfnet.io/min-security-level"], "high",
     "metadata.annotations.cfnet.io/min-security-level", "not an integer"),
    ([*ANN, "cfnet.io/data-gb"], "-1", "metadata.annotations.cfnet.io/data-gb", ">= 0"),
    ([*ANN, "cfnet.io/cost-weight"], "nan", "metadata.annotations.cfnet.io/cost-weight",
     "finite"),
    (["kind"], "Service", "kind", "not a Pod"),
    ([*PREF_PATH, 0, "weight"], 0, f"{PREF_FIELD}[0].weight", "integer from 1 to 100"),
    ([*PREF_PATH, 0, "weight"], 101, f"{PREF_FIELD}[0].weight", "integer from 1 to 100"),
    ([*PREF_PATH, 0, "weight"], -5, f"{PREF_FIELD}[0].weight", "integer from 1 to 100"),
    ([*PREF_PATH, 1, "weight"], "50", f"{PREF_FIELD}[1].weight", "integer from 1 to 100"),
    ([*PREF_PATH, 1, "weight"], 2.5, f"{PREF_FIELD}[1].weight", "integer from 1 to 100"),
    ([*PREF_PATH, 1, "weight"], True, f"{PREF_FIELD}[1].weight", "integer from 1 to 100"),
    ([*PREF_PATH, 0, "weight"], _DELETE, f"{PREF_FIELD}[0].weight", "is required"),
    ([*PREF_PATH, 0, "preference"], _DELETE, f"{PREF_FIELD}[0].preference", "is required"),
    ([*PREF_PATH, 0, "preference"], ["x"], f"{PREF_FIELD}[0].preference", "must be a mapping"),
    ([*PREF_PATH, 0], "x", f"{PREF_FIELD}[0]", "must be a mapping"),
    (PREF_PATH, {"weight": 1}, PREF_FIELD, "must be a list"),
    ([*PREF_PATH, 0, "preference", "matchExpressions", 0, "operator"], "Like",
     f"{PREF_FIELD}[0].preference.matchExpressions[0].operator", "not one of"),
    ([*PREF_PATH, 0, "preference", "matchExpressions", 0, "values"], ["four"],
     f"{PREF_FIELD}[0].preference.matchExpressions[0].values", "exactly one integer"),
    ([*PREF_PATH, 1, "preference", "matchFields", 0, "key"], "metadata.uid",
     f"{PREF_FIELD}[1].preference.matchFields[0].key", "only metadata.name"),
])
def test_errors_name_field_and_reason(path: list[Any], value: Any, field: str,
                                      reason: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_pod(_bad(path, value))
    assert e.value.field == field
    assert reason in e.value.reason
    assert isinstance(e.value, PlacementError) and isinstance(e.value, CoreError)


@pytest.mark.parametrize("text,field,reason", [
    ("name: a\nbogus: 1\n", "bogus", "unknown field"),
    ("replicas: 2\n", "name", "is required"),
    ("name: a\nrequests: {disk: 1}\n", "requests.disk", "unknown resource"),
    ("name: a\nreplicas: -1\n", "replicas", ">= 0"),
    ("name: a\n---\nname: a\n", "uid", "appears twice"),
    ("name: a\n---\n- x\n", "[1].(root)", "mapping"),
    ("name: [\n", "(yaml)", "not valid YAML"),
    ("name: a\nmaxLatencyMs: 10\n", "latencyTo", "required"),
    ("name: a\npreferredNodeAffinity: [{weight: 0, preference: {}}]\n",
     "preferredNodeAffinity[0].weight", "integer from 1 to 100"),
    ("name: a\npreferredNodeAffinity: [{weight: 101, preference: {}}]\n",
     "preferredNodeAffinity[0].weight", "integer from 1 to 100"),
    ("name: a\npreferredNodeAffinity: [{preference: {}}]\n",
     "preferredNodeAffinity[0].weight", "is required"),
    ("name: a\npreferredNodeAffinity: [{weight: 5}]\n",
     "preferredNodeAffinity[0].preference", "is required"),
    ("name: a\n---\nname: b\npreferredNodeAffinity: [{weight: 5, preference: "
     "{matchExpressions: [{key: k, operator: In}]}}]\n",
     "[1].preferredNodeAffinity[0].preference.matchExpressions[0].values",
     "needs at least one value"),
])
def test_plain_errors(text: str, field: str, reason: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_workload_yaml(text)
    assert e.value.field == field
    assert reason in e.value.reason
