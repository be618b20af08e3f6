"""Anchors first (``anchors.py``): the domains an anchor's pods take before its round, so that
the classes following it by required pod affinity find a domain they may use; and the work
of the exact step's rounds within a step budget (``exact.round_work``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cloud_core.placement import (
    ClusterSnapshot,
    EngineConfig,
    LabelSelector,
    NodeInfo,
    PodAffinityTerm,
    Resources,
    RunningPod,
    Workload,
    place,
    prepare,
    validate,
)
from cloud_core.placement.anchors import anchor_domains, domains_of, followers
from cloud_core.placement.classes import ClassSpec, most, placeable
from cloud_core.placement.exact import CHUNK, round_work
from cloud_core.placement.focus import ROUND_SHARE
from cloud_core.placement.model import HOSTNAME, ZONE, HostPort
from cloud_core.placement.sequential import NodeUsage
from tools.quality_families import FAMILIES

GIB = 1 << 30
CPU = np.array([1000, GIB, 0], dtype=np.int64)  # one pod: 1 core, 1 GiB
# six nodes, three zones of two nodes: zone of each node
DOM = np.array([0, 0, 1, 1, 2, 2])
ROOMY = np.tile(np.array([8000, 8 * GIB, 0], dtype=np.int64), (6, 1))
ALL = np.ones(6, dtype=bool)


def _mask(*nodes: int) -> np.ndarray:
    m = np.zeros(6, dtype=bool)
    m[list(nodes)] = True
    return m


# (anchor's nodes, anchor pods, followers: (pods, their nodes), covered zones per follower,
#  free per node (None: roomy), the zones picked)
CASES = [
    # one follower confined to zone 2: the anchor's one pod goes there
    (ALL, 1, [(3, _mask(4, 5))], None, None, [2]),
    # the largest follower first, then the other: two pods, two zones
    (ALL, 2, [(1, _mask(0)), (4, _mask(2, 3))], None, None, [1, 0]),
    # more pods than zones the followers need: only what covers someone
    (ALL, 5, [(2, _mask(2))], None, None, [1]),
    # one zone serves both followers: one pick covers them
    (ALL, 3, [(2, _mask(1, 2)), (2, _mask(2, 4))], None, None, [1]),
    # the anchor may not use zone 2: nothing to pick for a follower only there
    (_mask(0, 1, 2, 3), 2, [(3, _mask(4, 5))], None, None, []),
    # a running pod the follower follows already covers its zone
    (ALL, 2, [(3, _mask(4, 5))], [np.array([False, False, True])], None, []),
    # no room for the follower in zone 0: its zone 1 is picked
    (ALL, 1, [(2, _mask(1, 2))], None, {1: 0}, [1]),
    # no room for the anchor in zone 1 (both nodes full): the follower's other zone
    (ALL, 1, [(2, _mask(3, 4))], None, {2: 0, 3: 0}, [2]),
    # no follower: nothing
    (ALL, 3, [], None, None, []),
]


@pytest.mark.parametrize(("amask", "pods", "follow", "covered", "full", "want"), CASES)
def test_anchor_domains_cover_the_most_follower_pods_first(
        amask: np.ndarray, pods: int, follow: list[tuple[int, np.ndarray]],
        covered: list[np.ndarray] | None, full: dict[int, int] | None,
        want: list[int]) -> None:
    free = ROOMY.copy()
    for n, cpu in (full or {}).items():
        free[n, 0] = cpu
    cov = covered or [np.zeros(3, dtype=bool) for _ in follow]
    got = anchor_domains(amask, CPU, pods, DOM, free, [(k, m, CPU, None) for k, m in follow],
                         cov)
    assert got == want
    assert len(got) <= pods and len(set(got)) == len(got)


def test_a_spread_follower_gets_an_anchor_per_domain_and_room_counts() -> None:
    """A follower with a hard spread over the anchors' key (maxSkew 1) takes one pod per
    domain: three pods, three anchor pods, three zones (one zone without ``per_domain``).
    A domain's value is the follower's pods its free room holds: room for one pod in zone
    0, for four in zone 1, so zone 1 goes first."""
    none = [np.zeros(3, dtype=bool)]
    assert anchor_domains(ALL, CPU, 3, DOM, ROOMY, [(3, ALL, CPU, None)], none, [1]) == [0, 1, 2]
    assert anchor_domains(ALL, CPU, 3, DOM, ROOMY, [(3, ALL, CPU, None)], none) == [0]
    free = ROOMY.copy()
    free[[0, 1], 0] = [1000, 0]  # zone 0: one pod's room
    free[[2, 3], 0] = [2000, 2000]  # zone 1: four
    assert anchor_domains(ALL, CPU, 2, DOM, free, [(4, _mask(0, 2, 3), CPU, None)], none) == [1]
    assert anchor_domains(ALL, CPU, 2, DOM, free, [(5, _mask(0, 2, 3), CPU, None)], none) == [1, 0]


def test_a_followers_pod_slots_extended_resources_and_ports_count_as_room() -> None:
    """``room``: per node, the most of the follower's pods that its pod slots, extended
    resources and host ports hold. A follower that may use every node but whose FPGA is
    only on node 4 (zone 2) gets zone 2, not zone 0 (lowest id of equal free room); with
    one pod per node (a host port), two pods need two zones."""
    none = [np.zeros(3, dtype=bool)]
    fpga = np.array([0, 0, 0, 0, 2, 0])
    assert anchor_domains(ALL, CPU, 1, DOM, ROOMY, [(2, ALL, CPU, None)], none) == [0]
    assert anchor_domains(ALL, CPU, 1, DOM, ROOMY, [(2, ALL, CPU, fpga)], none) == [2]
    port = np.array([0, 1, 1, 1, 1, 1])  # node 0: a running pod holds the port
    assert anchor_domains(ALL, CPU, 2, DOM, ROOMY, [(4, _mask(0, 1, 2, 3), CPU, port)],
                          none) == [1, 0]
    assert anchor_domains(ALL, CPU, 2, DOM, ROOMY, [(4, _mask(0, 1, 2, 3), CPU, None)],
                          none) == [0]


def _gate(name: str, zone: str, price: float, **kw: Any) -> NodeInfo:
    return NodeInfo(name=name, region="r0", zone=zone, capacity=Resources(8000, 8 * GIB, 0),
                    price_per_hour=price, **kw)


@pytest.mark.parametrize("limit", ["extended", "host_port"])
def test_an_anchor_goes_where_its_followers_extended_resource_or_port_is(limit: str) -> None:
    """A database pod and a follower (by zone) that needs an FPGA or a host port that only
    the dear zone's node has free: the database pod goes there, so both are placed (no
    CP-SAT; and without the exact step, which would repair it). Counted by cpu and memory
    alone, the cheap zone's node had room for the follower, and the database went there."""
    dear = {"extended": {"example.com/fpga": 1}} if limit == "extended" else {}
    nodes = (_gate("a", "z0", 0.1), _gate("b", "z1", 1.0, **dear))
    running = (RunningPod(uid="bg", name="bg", namespace="default", node="a",
                          host_ports=(HostPort(8080),)),) if limit == "host_port" else ()
    snap = ClusterSnapshot(nodes, {}, now=1e9, pods=running)
    db = Workload(uid="db", name="db", labels={"app": "db"}, requests=Resources(1000, GIB, 0))
    need: dict[str, Any] = ({"extended": {"example.com/fpga": 1}} if limit == "extended"
                            else {"host_ports": (HostPort(8080),)})
    web = Workload(uid="web", name="web", labels={"app": "web"},
                   requests=Resources(1000, GIB, 0),
                   pod_affinity=(PodAffinityTerm(LabelSelector({"app": "db"}), ZONE),), **need)
    for cfg in (EngineConfig(use_cpsat=False),
                EngineConfig(cpsat_polish=False, exact_max_pairs=0)):
        res = place(snap, [db, web], cfg)
        assert res.assignments == {"db": "b", "web": "b"}
        assert validate(snap, [db, web], res.assignments, cfg) == []


def test_node_usage_room_counts_slots_extended_resources_and_ports() -> None:
    """``NodeUsage.room``: per node, the most pods of a shape its free pod slots, extended
    resources and host ports hold; None when none of them limits the shape anywhere."""
    nodes = (_gate("a", "z0", 0.1, max_pods=3), _gate("b", "z1", 0.1),
             _gate("c", "z1", 0.1, extended={"example.com/fpga": 5}))
    running = (RunningPod(uid="p", name="p", namespace="default", node="a",
                          host_ports=(HostPort(8080),)),
               RunningPod(uid="q", name="q", namespace="default", node="c",
                          extended={"example.com/fpga": 1}))
    pc = prepare(ClusterSnapshot(nodes, {}, now=1e9, pods=running))
    usage = NodeUsage(pc, pc.pods.all())
    plain = Workload(uid="w", name="w")
    fpga = Workload(uid="f", name="f", extended={"example.com/fpga": 2})
    port = Workload(uid="h", name="h", host_ports=(HostPort(8080),))
    assert usage.room(plain).tolist()[0] == 2  # two slots left on a; b, c: unlimited
    assert usage.room(fpga).tolist() == [0, 0, 2]
    assert usage.room(port).tolist() == [0, 1, 1]
    free = prepare(ClusterSnapshot(nodes[1:2], {}, now=1e9))
    assert NodeUsage(free, ()).room(plain) is None


def test_a_class_repelling_itself_fits_at_most_one_pod_per_domain() -> None:
    """``classes.most``: five replicas with hostname anti-affinity to each other, three
    nodes they may use (one of them full): two fit, and ``placeable`` counts what is left
    of those two, not of the five."""
    free = ROOMY.copy()
    free[2, 0] = 0
    spec = ClassSpec(count=5, req=CPU, mask=_mask(0, 1, 2), cost=np.zeros(6),
                     conflicts={HOSTNAME: [0]})
    hosts = {HOSTNAME: np.arange(6)}
    assert most(0, spec, free, hosts) == 2
    assert most(0, spec, free) == 5  # no domains given: the count
    assert placeable([spec], free, [[0]], hosts) == 1
    assert placeable([spec], free, [[0]]) == 4


def test_domains_of_and_followers() -> None:
    assert domains_of(DOM, [0, 5, -1]).tolist() == [True, False, True]
    term = PodAffinityTerm(LabelSelector({"app": "db"}), ZONE)
    deps = {1: [(term, {0})], 2: [(term, {0, 2})], 3: [(term, {3})]}
    assert followers(deps, 0, {1, 2, 3}) == [(1, ZONE), (2, ZONE)]
    assert followers(deps, 0, {2}) == [(2, ZONE)]  # only waiting classes
    assert followers(deps, 3, {3}) == []  # a class is not its own follower


def _node(name: str, region: str, price: float) -> NodeInfo:
    return NodeInfo(name=name, region=region, zone=f"{region}-z", capacity=Resources(
        4000, 8 * GIB, 0), price_per_hour=price)


def test_a_follower_confined_to_a_dear_region_gets_an_anchor_there() -> None:
    """Two database pods and a pod that follows them by zone but may only run in r1, the
    dear region: placed by price alone both database pods go to r0 and the follower is
    left out; with the anchor first one database pod goes to r1 and all three are placed
    (without CP-SAT, and without the exact step, which would repair it)."""
    nodes = (_node("a", "r0", 0.1), _node("b", "r0", 0.1), _node("c", "r1", 1.0))
    snap = ClusterSnapshot(nodes, {}, now=1e9)
    db = [Workload(uid=f"db-{i}", name=f"db-{i}", labels={"app": "db"},
                   requests=Resources(1000, GIB, 0)) for i in range(2)]
    web = Workload(uid="web", name="web", labels={"app": "web"},
                   requests=Resources(1000, GIB, 0), residency=frozenset({"r1"}),
                   pod_affinity=(PodAffinityTerm(LabelSelector({"app": "db"}), ZONE),))
    for cfg in (EngineConfig(use_cpsat=False),
                EngineConfig(cpsat_polish=False, exact_max_pairs=0)):
        res = place(snap, [*db, web], cfg)
        assert res.assignments.get("web") == "c"
        assert sorted(res.assignments[d.uid] for d in db) in (["a", "c"], ["b", "c"])
        assert validate(snap, [*db, web], res.assignments, cfg) == []


def test_the_mixed_family_places_the_followers_of_its_database() -> None:
    """The quality benchmark's mixed 200 x 50 (seed 4) without the exact step: 177 pods when
    the database's pods went to the cheapest zones, 188 with its anchors first, 189 when
    the followers' room counts their FPGAs, host ports and pod slots (the reference places
    195)."""
    snap, pods = FAMILIES["mixed"](200, 4)
    cfg = EngineConfig(cpsat_polish=False, exact_max_pairs=0)
    res = place(snap, pods, cfg)
    assert len(res.assignments) >= 189
    assert validate(snap, pods, res.assignments, cfg) == []


# (CPU left, rate, work done, first round?, the next round's work; 0: none)
ROUNDS = [
    (0.5, 0.15, 0.0, True, ROUND_SHARE * 0.5 * 0.15),  # the first: all the CPU left
    (0.5, 0.3, 0.06, False, ROUND_SHARE * 0.5 * 0.3),  # next: at the rate measured
    (0.04, 0.15, 0.0, True, 0.0),  # less than step_exact_min_s left
    (0.1, 0.15, 0.06, False, 0.0),  # a next round under CHUNK: none
    (0.1, 0.15, 0.0, True, ROUND_SHARE * 0.1 * 0.15),  # ... but the first runs
    (5.0, 0.4, 0.9, False, 0.1),  # at most exact_deterministic_time in all
    (5.0, 0.4, 1.0, False, 0.0),
]


@pytest.mark.parametrize(("left", "rate", "work", "first", "want"), ROUNDS)
def test_the_exact_steps_rounds_use_the_cpu_left(left: float, rate: float, work: float,
                                                  first: bool, want: float) -> None:
    cfg = EngineConfig(cpsat_polish=False, exact_deterministic_time=1.0)
    got = round_work(left, rate, work, first, cfg)
    assert got == pytest.approx(want)
    assert got == 0.0 or first or got >= CHUNK
