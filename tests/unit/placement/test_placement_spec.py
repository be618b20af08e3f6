"""Workload spec parsing: Pods, controllers, plain YAML; errors name the field and reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cloud_core.errors import CoreError, PlacementError, SpecError
from cloud_core.placement import (
    NodeSelectorRequirement,
    Resources,
    Toleration,
    parse_pod,
    parse_workload_yaml,
)
from cloud_core.placement.spec import parse_quantity

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
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "disk", "operator": "In", "values": ["ssd"]}]}]}},
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
])
def test_plain_errors(text: str, field: str, reason: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_workload_yaml(text)
    assert e.value.field == field
    assert reason in e.value.reason
