"""`cfnetctl` in Kubernetes mode: the console answers from, and acts on, the cluster.

The commands run through the console service as `cfnet-core --kubernetes` registers them
(``start_kubernetes(..., console=...)``); the MQTT hop in front of it is the same in both modes
and is covered by tests/integration/test_console.py. Checked here against the real API server:
cordon sets ``spec.unschedulable`` and no later binding lands there; uncordon clears it; drain
leaves pods that nothing recreates (bare pods); submit/delete are refused naming kubectl;
explain/what-if answer on the cluster snapshot; under deploy/k8s's least-privilege role, cordon is refused clearly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cloud_core.console.protocol import Request, Response
from cloud_core.events import EventLog
from cloud_core.k8s.actuator import ActuatorConfig
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.k8s.wiring import build_actuator
from tests.k8s.conftest import Cluster, kubernetes_console, wait_for

pytestmark = pytest.mark.slow


class Console:
    def __init__(self, client: KubeClient) -> None:
        self.events = EventLog(lambda ev: None)
        self.act = build_actuator(client, NodeRegistry(), ActuatorConfig(identity="console-test"),
                            events=self.events)
        # What the agents report with, by Node name (wiring.py reads it from the telemetry
        # state; tests/cluster/test_helm_install.py shows a real agent's ``ebpf`` there).
        self.svc = kubernetes_console(self.act, client, self.events,
                                      agent_probes=lambda: {"cn-a": "ebpf"})
        self.act.start()
        assert self.act.wait_synced(30)

    def __call__(self, cmd: str, **args: Any) -> Response:
        return self.svc.handle("op", Request(cmd, args))


@pytest.fixture
def console(admin: KubeClient, cluster: Cluster) -> Iterator[Console]:
    c = Console(admin)
    yield c
    c.act.stop()


def test_cordon_is_the_nodes_and_no_later_binding_lands_there(
        admin: KubeClient, cluster: Cluster, console: Console) -> None:
    for n in ("cn-a", "cn-b"):
        cluster.node(n, region="eu", cpu="8", edge_taint=False)
    wait_for(lambda: console.act.registry.get("cn-b"), what="nodes seen")
    r = console("cordon", node="cn-a")
    assert r.ok, r.error
    assert r.data["changed"] is True
    assert admin.get("/api/v1/nodes/cn-a")["spec"]["unschedulable"] is True
    nodes = {n["node"]: n for n in console("nodes").data}
    assert nodes["cn-a"]["cordoned"] and not nodes["cn-b"]["cordoned"]
    assert (nodes["cn-a"]["probe"], nodes["cn-b"]["probe"]) == ("ebpf", "-")
    for i in range(6):
        cluster.pod(f"c-{i}", cpu="100m")
    bound = wait_for(lambda: (lambda b: b if len(b) == 6 else None)(
        {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.pods()
         if p["spec"].get("nodeName")}), timeout=30, what="6 pods bound")
    assert set(bound.values()) == {"cn-b"}  # none on the cordoned node

    # workloads, paged as in local mode: without "total" the bare list (as before paging)
    # (the actuator's informer may lag the API server a moment behind the bindings)
    def listing() -> list[dict[str, Any]] | None:
        rows = console("workloads").data
        mine = [w for w in rows if w["namespace"] == cluster.namespace]
        return rows if len(mine) == 6 and all(w["state"] == "bound" for w in mine) else None

    everything = wait_for(listing, timeout=30, what="6 bound pods in the console's listing")
    page = console("workloads", offset=2, limit=3, total=True)
    assert page.ok, page.error
    assert (page.data["total"], page.data["offset"]) == (len(everything), 2)
    assert page.data["items"] == everything[2:5]
    assert "non-negative" in console("workloads", limit=-1).error

    # what-if and explain answer for the cluster snapshot
    wi = console("what-if", specs=[{"name": "probe", "requests": {"cpu": "100m"}}])
    assert wi.ok, wi.error
    assert [d["node"] for d in wi.data["decisions"]] == ["cn-b"]
    ex = console("explain", workload=f"{cluster.namespace}/c-0")
    assert ex.ok, ex.error
    assert ex.data["node"] == "cn-b" and ex.data["state"] == "bound"
    # the batch that placed it: its cost, bound and gap (this replica bound it)
    assert 0.0 <= ex.data["batch"]["gap"] < 1.0 and ex.data["batch"]["pods"] >= 1, ex.data
    assert "of the best possible" in ex.data["batch"]["text"]
    placements = console("placements").data
    assert len(placements["cn-b"]) == 6 and "cn-a" not in placements

    # submit / delete: refused, naming kubectl; nothing changed
    sub = console("submit", specs=[{"name": "x", "requests": {"cpu": "1"}}])
    assert not sub.ok and "kubectl apply" in sub.error
    dl = console("delete", workload=f"{cluster.namespace}/c-1")
    assert not dl.ok and "kubectl delete pod" in dl.error
    assert len(cluster.pods()) == 6

    # uncordon: the next pod may go to cn-a again
    assert console("uncordon", node="cn-a").ok
    assert not admin.get("/api/v1/nodes/cn-a")["spec"].get("unschedulable")

    # drain: cordon + evict cfnet's pods there, but never a pod that nothing would recreate
    # (as `kubectl drain` without --force): these bare pods are listed, not evicted. Drain
    # evicting controller-owned pods, and every other exclusion: tests/k8s/test_evictions.py
    dr = console("drain", node="cn-b")
    assert dr.ok, dr.error
    assert dr.data["evicted"] == []
    assert sorted(k.split(":")[0] for k in dr.data["not_evictable"]) == sorted(
        f"{cluster.namespace}/c-{i}" for i in range(6))
    assert all("no controller recreates it" in k for k in dr.data["not_evictable"])
    assert admin.get("/api/v1/nodes/cn-b")["spec"]["unschedulable"] is True
    assert not any(p["metadata"].get("deletionTimestamp") for p in cluster.pods())
    assert not console("cordon", node="nope").ok
    # the same commands and roles as the local console (one registry)
    from cloud_core.console.commands import COMMANDS

    assert console.svc.commands is COMMANDS


def test_cordon_refused_without_the_verb(service_account_client: KubeClient,
                                         cluster: Cluster) -> None:
    cluster.node("cr-a", region="eu", cpu="2", edge_taint=False)
    c = Console(service_account_client)
    try:
        wait_for(lambda: c.act.registry.get("cr-a"), what="node seen")
        r = c("cordon", node="cr-a")
        assert not r.ok
        assert "may not patch nodes" in r.error and "kubectl cordon cr-a" in r.error
        assert not cluster.c.get("/api/v1/nodes/cr-a")["spec"].get("unschedulable")
    finally:
        c.act.stop()
