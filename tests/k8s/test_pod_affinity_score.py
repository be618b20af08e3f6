"""Preferred pod anti-affinity is scored against the real API server: two replicas spread
over two nodes where, without the preference, they pack.

Two kwok nodes of one test tag; node ``b`` already runs a pod another scheduler bound (1 CPU
of 4), so cfnet's cost (balance) prefers ``a`` for both replicas. With a preferred
anti-affinity on ``kubernetes.io/hostname`` (weight 100, selecting the replicas), the second
replica goes to ``b``: InterPodAffinity's score (scores.interpod_raw) outweighs the balance
term, and the replicas count for each other whether they arrive in one batch or two.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cloud_core.k8s.actuator import Actuator, ActuatorConfig
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.k8s.wiring import build_actuator
from tests.k8s.conftest import Cluster, make_node, wait_for
from tools.envtest import ControlPlane

pytestmark = pytest.mark.slow

HOST = "kubernetes.io/hostname"


@pytest.fixture(scope="module")
def act(control_plane: ControlPlane) -> Iterator[Actuator]:
    c = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    a = build_actuator(c, NodeRegistry(), ActuatorConfig(identity="pod-affinity-score"))
    a.start()
    assert a.wait_synced(30)
    yield a
    a.stop()
    c.close()


def _pod(name: str, tag: str, app: str, anti: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "cfnet-scheduler", "nodeSelector": {"cfnet.io/case": tag},
        "containers": [{"name": "app", "image": "registry.example/app:1",
                        "resources": {"requests": {"cpu": "100m"}}}]}
    if anti:
        spec["affinity"] = {"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100, "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOST}}]}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app}}, "spec": spec}


@pytest.mark.parametrize("anti", [False, True], ids=["no-preference-packs",
                                                     "preferred-anti-affinity-spreads"])
def test_replicas_spread_by_preferred_anti_affinity(anti: bool, admin: KubeClient,
                                                    act: Actuator) -> None:
    cl = Cluster(admin)
    tag = uuid.uuid4().hex[:6]
    try:
        names = {s: f"ipa-{s}-{tag}" for s in "ab"}
        for n in names.values():
            make_node(admin, n, {HOST: n, "topology.kubernetes.io/zone": "z",
                                 "topology.kubernetes.io/region": "r", "cfnet.io/case": tag},
                      capacity={"cpu": "4", "memory": "8Gi", "pods": "110"})
            cl.nodes.append(n)
        wait_for(lambda: all(act.registry.get(n) for n in names.values()), timeout=15,
                 what="both nodes in the registry")
        ns = f"/api/v1/namespaces/{cl.namespace}/pods"
        # another scheduler's pod on b (bound by nodeName): b is the fuller node
        admin.create(ns, {"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "filler", "labels": {"app": "filler"}},
                          "spec": {"nodeName": names["b"], "containers": [{
                              "name": "app", "image": "registry.example/app:1",
                              "resources": {"requests": {"cpu": "1"}}}]}})
        wait_for(lambda: any(p.node == names["b"] for p in act.snapshot().pods),
                 timeout=15, what="the filler pod in cfnet's pod cache")
        for i in range(2):
            admin.create(ns, _pod(f"web-{i}", tag, "web", anti))

        def bound() -> dict[str, str]:
            return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cl.pods()
                    if p["metadata"]["name"].startswith("web-") and p["spec"].get("nodeName")}

        wait_for(lambda: len(bound()) == 2, timeout=30, what="both replicas bound")
        got = bound()
        if anti:
            assert sorted(got.values()) == sorted(names.values()), got
        else:
            assert set(got.values()) == {names["a"]}, got
    finally:
        cl.cleanup()
