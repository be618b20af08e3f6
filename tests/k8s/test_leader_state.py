"""What a new leader reads back: planned moves (on the Lease) and pool plans (on the pool
objects), with two ``cfnet-core --kubernetes`` replicas as the chart runs them, under the
chart's ServiceAccount, the leader killed with SIGKILL (no release, no goodbye).

- Mid-move: core-a evicts a pod to move it off a node whose region changed, and is killed
  before the replacement exists. The replacement is then created (the test plays the pod's
  controller, an object no controller here acts on, so that "after the kill" is certain: a
  ReplicaSet would race the kill), and core-b, once leading, binds it where core-a's move
  planned (its ``Scheduled`` event says so), and clears the planned move from the Lease.
- Between two pool plans: core-a writes a YurtAppSet's per-pool split and is killed; core-b,
  once leading, plans a second Deployment (so it has reconciled the first) and writes nothing
  for the first: the split and the object are as core-a left them.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.ledger import ANNOTATION, decode
from cloud_core.k8s.pools import PLAN_NOTE
from cloud_core.k8s.registry import RESIDENCY_REGION
from tests.k8s.conftest import Cluster, wait_for
from tests.k8s.test_leader import Replica, _wait_leading
from tests.k8s.test_pool_mode import pool_deployment
from tools.broker import Broker
from tools.envtest import ControlPlane

pytestmark = pytest.mark.slow

LEASE = "/apis/coordination.k8s.io/v1/namespaces/cfnet-system/leases/cfnet-core"


def _replicas(control_plane: ControlPlane, broker: Broker, tmp_path: Path,
              cluster: Cluster) -> tuple[Replica, Replica]:
    """core-a leading, core-b started and following (under the chart's ServiceAccount,
    which the ``service_account_client`` fixture applies)."""
    token = control_plane.service_account_token("cfnet-system", "cfnet-core", create=False)
    kubeconfig = control_plane.token_credentials(token).write_kubeconfig(
        tmp_path / "core.kubeconfig", user="cfnet-core")
    creds = broker.add_account(f"core-{cluster.namespace}", "core")
    a = Replica("core-a", kubeconfig, tmp_path, broker, creds)
    try:
        _wait_leading(a, cluster)
        b = Replica("core-b", kubeconfig, tmp_path, broker, creds)
    except BaseException:
        a.stop()
        raise
    return a, b


def _kill(r: Replica) -> None:
    r.proc.send_signal(signal.SIGKILL)  # a crash: the lease is not released
    r.proc.wait(10)


def _events(cluster: Cluster, reason: str, name: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events(reason) if e["involvedObject"]["name"] == name]


def test_new_leader_finishes_the_move_to_the_planned_node(
        control_plane: ControlPlane, cluster: Cluster, broker: Broker,
        service_account_client: KubeClient, tmp_path: Path) -> None:
    ns = cluster.namespace
    for name in ("ls-1", "ls-2"):
        cluster.node(name, region="eu-west", cpu="8", memory="16Gi")
    owner = cluster.c.create(f"/api/v1/namespaces/{ns}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mover"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "mover",
           "uid": owner["metadata"]["uid"], "controller": True}

    def pod(name: str) -> dict[str, Any]:
        return cluster.c.create(f"/api/v1/namespaces/{ns}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "ownerReferences": [ref],
                         "labels": {"app": "mover", "pod-template-hash": "h1"},
                         "annotations": {"cfnet.io/residency": "eu-west"}},
            "spec": {"schedulerName": "cfnet-scheduler", "containers": [
                {"name": "app", "image": "registry.example/app:1",
                 "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}}]}})

    def node_of(name: str) -> str | None:
        p = cluster.c.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return p["spec"].get("nodeName")

    a, b = _replicas(control_plane, broker, tmp_path, cluster)
    try:
        pod("mover-0")
        src = wait_for(lambda: node_of("mover-0"), timeout=30, what="mover-0 bound by core-a")
        dst = "ls-2" if src == "ls-1" else "ls-1"
        wait_for(lambda: b.first("started"), timeout=30, what="core-b started")
        # wait for Running: kwok's pod-ready stage must not race what follows
        wait_for(lambda: cluster.c.get(f"/api/v1/namespaces/{ns}/pods/mover-0")
                 ["status"].get("phase") == "Running", timeout=30, what="mover-0 Running")
        t0 = time.monotonic()
        cluster.set_node_label(src, RESIDENCY_REGION, "us-east")  # mover-0 no longer fits

        def evicted() -> bool:
            names = {p["metadata"]["name"] for p in cluster.pods()}
            return "mover-0" not in names

        wait_for(evicted, timeout=60, what="mover-0 evicted by core-a (and finished by kwok)")
        # core-a writes its Rescheduling event after the eviction: kill it once that is out
        moved = wait_for(lambda: _events(cluster, "Rescheduling", "mover-0"), timeout=30,
                         what="core-a's Rescheduling event for mover-0")
        _kill(a)
        assert dst in (moved[0].get("message") or moved[0].get("note") or ""), moved
        planned = decode(cluster.c.get(LEASE)["metadata"].get("annotations", {})
                         .get(ANNOTATION))
        mine = [e for e in planned if ref["uid"] in e[0]]
        assert [e[1] for e in mine] == [dst], f"the Lease's planned moves: {planned}"

        pod("mover-1")  # the controller's replacement, after core-a is gone
        _wait_leading(b, cluster)
        got = wait_for(lambda: node_of("mover-1"), timeout=30,
                       what="mover-1 bound by core-b")
        took = time.monotonic() - t0
        assert got == dst, f"replacement bound on {got}, the move planned {dst}"
        ev = wait_for(lambda: _events(cluster, "Scheduled", "mover-1"), timeout=30,
                      what="mover-1's Scheduled event")
        text = ev[0].get("note") or ev[0].get("message") or ""
        assert "where the move planned" in text, ev[0]
        assert ev[0].get("reportingInstance") == "core-b", ev[0]

        def cleared() -> bool:
            ann = cluster.c.get(LEASE)["metadata"].get("annotations") or {}
            return not [e for e in decode(ann.get(ANNOTATION)) if ref["uid"] in e[0]]

        wait_for(cleared, timeout=30, what="the planned move cleared from the Lease")
        print(f"\nmove finished by the new leader: relabel -> replacement bound {took:.1f} s "
              f"(lease {4.0} s)")
    finally:
        a.stop()
        b.stop()


def test_new_leader_keeps_the_pool_split(control_plane: ControlPlane, cluster: Cluster,
                                         broker: Broker, service_account_client: KubeClient,
                                         tmp_path: Path) -> None:
    ns = cluster.namespace
    for name, pool in (("pa-1", "pool-a"), ("pa-2", "pool-a"), ("pb-1", "pool-b"),
                       ("pb-2", "pool-b")):
        cluster.node(name, region="eu-west", cpu="4", memory="8Gi", openyurt_pool=pool)
    deps = f"/apis/apps/v1/namespaces/{ns}/deployments"
    sets = f"/apis/apps.openyurt.io/v1beta1/namespaces/{ns}/yurtappsets"
    a, b = _replicas(control_plane, broker, tmp_path, cluster)
    try:
        cluster.c.create(deps, pool_deployment(ns, "split", 6, "openyurt"))
        first = wait_for(lambda: _events(cluster, "PoolPlan", "split"), timeout=60,
                         what="core-a's PoolPlan for split")
        assert first[0].get("reportingInstance") == "core-a", first[0]
        wait_for(lambda: b.first("started"), timeout=30, what="core-b started")
        _kill(a)
        # read once core-a is gone (core-b cannot lead for a lease duration after its last
        # renewal): whatever core-a wrote last is what core-b must keep
        before = cluster.c.get(f"{sets}/split")
        note = json.loads(before["metadata"]["annotations"][PLAN_NOTE])
        assert sum(note["per_pool"].values()) == 6, note
        _wait_leading(b, cluster)
        # a second Deployment: once core-b has planned it, it has reconciled the first too
        # (a round takes them in the order its cache holds them, and the name sorts last)
        cluster.c.create(deps, pool_deployment(ns, "zz-second", 2, "openyurt"))
        ev = wait_for(lambda: _events(cluster, "PoolPlan", "zz-second"), timeout=60,
                      what="core-b's PoolPlan for zz-second")
        assert ev[0].get("reportingInstance") == "core-b", ev[0]
        by_b = [e for e in _events(cluster, "PoolPlan", "split")
                if e.get("reportingInstance") == "core-b"]
        assert not by_b, f"core-b planned split again: {by_b}"
        after = cluster.c.get(f"{sets}/split")
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert after["spec"] == before["spec"]
        print(f"\npool split kept across failover: {note['per_pool']}")
    finally:
        a.stop()
        b.stop()
