"""A pool-mode Deployment's per-pool counts re-planned by the decision loop, on the real API
server under the upstream CRDs: a latency SLA broken in one pool moves the replicas to the
other (the loop's strikes: not at the first bad measurement), and a pool whose nodes go down
has its replicas moved at once (no strikes, no cool-down: as pods on a down node).

What the agents would say comes in through the Actuator's two inputs for them, as
``cfnet-core --kubernetes`` feeds them from MQTT (k8s/wiring.py): ``links`` (the p95 each node
measures to the users' gateway) and ``agent_health`` (the agents' verdict, cloud_core.health).
That path with real agents and a broker runs in tests/k8s/test_partition_k8s.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from cloud_core.errors import KubeNotFound
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.pools import PoolController
from cloud_core.placement.model import Health, LinkInfo
from tests.k8s.conftest import Cluster, wait_for
from tests.k8s.test_pool_mode import pool_controller, pool_deployment

pytestmark = pytest.mark.slow

NODES = {"rp-a-0": "rp-pa", "rp-a-1": "rp-pa", "rp-b-0": "rp-pb", "rp-b-1": "rp-pb"}


class Agents:
    """What the agents report, as the core's view of them holds it."""

    def __init__(self) -> None:
        self.p95 = {"rp-a-0": 10.0, "rp-a-1": 10.0, "rp-b-0": 120.0, "rp-b-1": 120.0}
        self.health: dict[str, Health] = {}

    def links(self) -> dict[tuple[str, str], LinkInfo]:
        return {(n, "gw"): LinkInfo(v * 0.8, v) for n, v in self.p95.items()}

    def verdicts(self) -> dict[str, Health]:
        return dict(self.health)


@pytest.fixture
def agents() -> Agents:
    return Agents()


@pytest.fixture
def pools(core_client: KubeClient, agents: Agents) -> Iterator[PoolController]:
    with pool_controller(core_client, "pool-replan", links=agents.links,
                         agent_health=agents.verdicts) as pc:
        yield pc


def test_counts_follow_the_sla_and_node_health(admin: KubeClient, cluster: Cluster,
                                               pools: PoolController, agents: Agents) -> None:
    ns = cluster.namespace
    for name, pool in NODES.items():
        cluster.node(name, region="eu", cpu="4", openyurt_pool=pool)
    wait_for(lambda: set(NODES) <= set(pools.registry.membership("openyurt")),
             what="the four pool nodes read")
    dep = pool_deployment(ns, "rp", 4, "openyurt")
    dep["spec"]["template"]["metadata"]["annotations"] = {
        "cfnet.io/max-latency-ms": "50", "cfnet.io/latency-to": "gw"}
    admin.create(f"/apis/apps/v1/namespaces/{ns}/deployments", dep)
    path = f"/apis/apps.openyurt.io/v1beta1/namespaces/{ns}/yurtappsets/rp"

    def split() -> dict[str, int]:
        try:
            got = admin.get(path)
        except KubeNotFound:
            return {}
        return {t["pools"][0]: t["tweaks"]["replicas"]
                for t in got["spec"]["workload"].get("workloadTweaks") or []}

    # rp-pb is 120 ms from the users: the SLA (50 ms) puts every replica in rp-pa
    wait_for(lambda: split() == {"rp-pa": 4}, timeout=30,
             what="YurtAppSet rp-pa 4", explain=lambda: f"written: {split()}")

    # rp-pa's links degrade, rp-pb's recover: the loop moves the replicas once they strike out
    t0 = time.monotonic()
    agents.p95.update({"rp-a-0": 90.0, "rp-a-1": 90.0, "rp-b-0": 10.0, "rp-b-1": 10.0})
    wait_for(lambda: split() == {"rp-pb": 4}, timeout=30,
             what="YurtAppSet moved to rp-pb 4", explain=lambda: f"written: {split()}")
    sla = time.monotonic() - t0
    assert sla >= 1.0, f"moved after {sla:.2f} s: before the strikes (3 at 1 s) were counted"

    # rp-pb's nodes crash (their agents are down) and rp-pa is good again: moved back at once,
    # the cool-down of the last move notwithstanding
    agents.p95.update({"rp-a-0": 10.0, "rp-a-1": 10.0})
    t0 = time.monotonic()
    agents.health.update({"rp-b-0": Health.DOWN, "rp-b-1": Health.DOWN})
    wait_for(lambda: split() == {"rp-pa": 4}, timeout=30,
             what="YurtAppSet moved back to rp-pa 4",
             explain=lambda: f"written: {split()}")
    down = time.monotonic() - t0

    def plans() -> list[dict[str, Any]]:
        return [e for e in cluster.events("PoolPlan") if e["involvedObject"]["name"] == "rp"]

    # the event follows the write the test saw first
    wait_for(lambda: len(plans()) >= 3, timeout=15, what="three PoolPlan events for rp",
             explain=lambda: str([e["message"] for e in plans()]))
    print(f"\npool counts re-planned: SLA breach -> written {sla:.2f} s, "
          f"pool down -> written {down:.2f} s")
