"""Per-pool replica counts decided and re-planned by the decision loop (k8s/pool_loop.py).

The source of the cluster view is a function returning a snapshot and the writer records the
plans it is handed (the I/O edges: the actuator's snapshot and the API server). The same
controller runs against the real API server in tests/k8s/test_pool_mode.py (planning,
writing, scaling), tests/k8s/test_pool_replan.py (a pool's nodes going down) and
tests/k8s/test_leader_state.py (the split kept across failover).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cloud_core.errors import SpecError
from cloud_core.k8s.pool_loop import PoolApp, PoolSide
from cloud_core.k8s.pool_objects import MAX_POOL_REPLICAS, PoolPlan
from cloud_core.k8s.pools import plan_pools, pool_loop
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.placement import ReplanConfig
from cloud_core.placement.model import (
    ClusterSnapshot,
    Health,
    LinkInfo,
    NodeInfo,
    Resources,
    RunningPod,
)

POOLS = {"a1": "pa", "a2": "pa", "b1": "pb", "b2": "pb"}
CAP = Resources(4000, 8 << 30, 0)


def deployment(replicas: int, sla_ms: int | None = None) -> dict[str, Any]:
    ann = {} if sla_ms is None else {"cfnet.io/max-latency-ms": str(sla_ms),
                                     "cfnet.io/latency-to": "gw"}
    return {"metadata": {"name": "web", "namespace": "t1", "uid": "dep-uid"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": ann},
                "spec": {"containers": [{"name": "c", "image": "i", "resources": {
                    "requests": {"cpu": "1", "memory": "64Mi"}}}]}}}}


class World:
    """The cluster as the pool loop sees it, changed by the test between steps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.health = dict.fromkeys([*POOLS, "other"], Health.ONLINE)
        self.p95 = {"a1": 10.0, "a2": 10.0, "b1": 100.0, "b2": 100.0, "other": 1.0}
        self.written: list[PoolPlan] = []
        self.pods: tuple[RunningPod, ...] = ()

    def snapshot(self) -> ClusterSnapshot:
        used: dict[str, Resources] = {}
        for p in self.pods:
            used[p.node] = used.get(p.node, Resources()) + p.requests
        nodes = tuple(NodeInfo(n, "eu", "eu-1", capacity=CAP, health=h,
                               allocated=used.get(n, Resources()))
                      for n, h in self.health.items())
        links = {(n, "gw"): LinkInfo(v * 0.8, v) for n, v in self.p95.items()}
        return ClusterSnapshot(nodes=nodes, links=links, now=self.now, pods=self.pods)

    def membership(self, flavour: str) -> dict[str, str]:
        return dict(POOLS)

    def write(self, key: tuple[str, str], app: PoolApp, plan: PoolPlan) -> int:
        if self.written and self.written[-1].per_pool == plan.per_pool:
            return 0
        self.written.append(plan)
        return 1


@pytest.fixture
def world() -> World:
    return World()


def _side(world: World) -> PoolSide:
    side = PoolSide("openyurt", world.snapshot, world.membership, write=world.write)
    side.set_app(("t1", "web"), deployment(4, sla_ms=50))
    return side


def test_counts_placed_then_replanned_on_node_health(world: World) -> None:
    side = _side(world)
    loop = pool_loop(side, replan_interval_s=0.0)
    rep = loop.step()
    assert rep.placed == 4 and rep.applied == 1
    # the SLA keeps them in pa (pb is 100 ms from the users), never on the pool-less node
    assert world.written[-1].per_pool == {"pa": 4}
    # pa's nodes go down and pb's links recover: the loop moves the replicas in the same step
    world.health.update(a1=Health.DOWN, a2=Health.DOWN)
    world.p95.update(b1=10.0, b2=10.0)
    world.now += 1
    rep = loop.step()
    assert rep.moves == 4, rep
    assert world.written[-1].per_pool == {"pb": 4}
    assert all(n in ("b1", "b2") for n in world.written[-1].assignments.values())


def test_counts_replanned_on_an_sla_breach_with_strikes_and_cooldown(world: World) -> None:
    side = _side(world)
    loop = pool_loop(side, replan_config=ReplanConfig(horizon=0, severe_ratio=0),
                     replan_interval_s=0.0)
    loop.step()
    assert world.written[-1].per_pool == {"pa": 4}
    # pa breaks the 50 ms SLA, pb is good: a move only after three strikes
    world.p95.update(a1=80.0, a2=80.0, b1=10.0, b2=10.0)
    for strike in (1, 2):
        world.now += 1
        assert loop.step().moves == 0, f"moved after {strike} strike(s)"
    world.now += 1
    assert loop.step().moves == 4
    assert world.written[-1].per_pool == {"pb": 4}
    # pb breaks it now: the cool-down holds the replicas where they were just moved
    world.p95.update(a1=10.0, a2=10.0, b1=80.0, b2=80.0)
    for _ in range(5):
        world.now += 1
        assert loop.step().moves == 0
    assert len(world.written) == 2


def test_a_stranded_replica_is_placed_again_and_a_scale_down_drops_the_last(
        world: World) -> None:
    side = _side(world)
    loop = pool_loop(side, replan_interval_s=0.0)
    loop.step()
    # every pool node down, nowhere to go: stranded, back to pending, unplaced
    world.health.update(a1=Health.DOWN, a2=Health.DOWN, b1=Health.DOWN, b2=Health.DOWN)
    world.now += 1
    loop.step()
    loop.step()
    assert world.written[-1].per_pool == {} and len(world.written[-1].unplaced) == 4
    side.set_app(("t1", "web"), deployment(2, sla_ms=50))
    assert len(side.apps[("t1", "web")].workloads) == 2


def test_hostile_replica_count_is_refused_before_expansion(world: World) -> None:
    side = _side(world)
    with pytest.raises(SpecError, match=str(MAX_POOL_REPLICAS)):
        side.set_app(("t1", "web"), deployment(MAX_POOL_REPLICAS + 1))
    assert len(side.apps[("t1", "web")].workloads) == 4  # what was kept is unchanged


def test_plan_pools_is_one_step_of_the_loop(world: World) -> None:
    reg = NodeRegistry()
    snap = world.snapshot()
    reg.membership = world.membership  # type: ignore[method-assign]
    plan = plan_pools(snap, reg, deployment(10), "openyurt")
    assert plan.placed == 10 and sum(plan.per_pool.values()) == 10
    assert set(plan.assignments.values()) <= set(POOLS)  # never on the pool-less node
    full = replace(snap, nodes=tuple(replace(n, allocated=CAP) for n in snap.nodes))
    plan = plan_pools(full, reg, deployment(3), "openyurt")
    assert plan.placed == 0 and len(plan.unplaced) == 3


def test_the_frameworks_pods_of_the_app_are_not_counted_twice(world: World) -> None:
    """The pods yurt-manager / cloudcore run for the Deployment fill pa's nodes: the replicas
    stand for them, so they are placed there all the same; another tenant's pods with the
    same labels, or another app's in the namespace, still count."""
    big = Resources(4000, 1 << 30, 0)
    world.pods = (RunningPod("p1", "web-x", "t1", "a1", labels={"app": "web"}, requests=big),
                  RunningPod("p2", "web-y", "t1", "a2", labels={"app": "web"}, requests=big))
    side = _side(world)
    pool_loop(side, replan_interval_s=0.0).step()
    assert world.written[-1].per_pool == {"pa": 4}
    world.pods = (RunningPod("p1", "web-x", "t2", "a1", labels={"app": "web"}, requests=big),
                  RunningPod("p2", "db", "t1", "a2", labels={"app": "db"}, requests=big))
    world.written.clear()
    side = _side(world)
    pool_loop(side, replan_interval_s=0.0).step()
    assert world.written[-1].per_pool == {} and len(world.written[-1].unplaced) == 4
