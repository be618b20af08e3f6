"""The reference model (tools.ref_model) agrees with validate on small random batches.

Seeded random instances of 3 nodes and 4 pods with every rule validate checks (resources,
pods per node, extended resources, host ports, selectors, node affinity, taints, latency,
residency, security, pod affinity and anti-affinity with running pods too, hard topology
spread, gangs). Every assignment of the pods to the nodes the model allows them (or to none)
is put to both: the model's constraints accept exactly what validate accepts, a pod the model
keeps off a node is refused there by validate even alone, and the reference's answer is the
best of the assignments validate accepts (most pods, then least integer cost).
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from cloud_core.placement import (
    ClusterSnapshot,
    EngineConfig,
    Health,
    LabelSelector,
    LinkInfo,
    NodeInfo,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Resources,
    RunningPod,
    Taint,
    Toleration,
    Workload,
    place,
    validate,
)
from cloud_core.placement.model import HostPort, SpreadConstraint
from tools.ref_model import RefModel

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
DEV = "example.com/dev"


def _sel(rnd: random.Random) -> LabelSelector:
    return LabelSelector({"app": rnd.choice("ab")})


def _node(rnd: random.Random, i: int) -> NodeInfo:
    taints: tuple[Taint, ...] = ()
    if rnd.random() < 0.3:
        taints = (Taint("dedicated", rnd.choice(("x", "y")), "NoSchedule"),)
    if rnd.random() < 0.2:
        taints += (Taint("soft", "", "PreferNoSchedule"),)
    return NodeInfo(
        name=f"n{i}", region=rnd.choice(("r0", "r1")), zone=f"z{rnd.randrange(2)}",
        security_level=rnd.choice((0, 1, 2)),
        labels={"disk": rnd.choice(("ssd", "hdd"))} if rnd.random() < 0.7 else {},
        taints=taints, capacity=Resources(rnd.choice((1000, 2000, 3000)), 4 << 30,
                                          rnd.choice((0, 0, 1, 2))),
        allocated=Resources(rnd.choice((0, 0, 500)), 0, 0),
        health=Health.ONLINE if rnd.random() < 0.9 else Health.CORDONED,
        price_per_hour=rnd.uniform(0.2, 1.0), energy_price_per_kwh=0.1,
        carbon_g_per_kwh=rnd.choice((100.0, 300.0)), idle_watts=100, max_watts=300,
        max_pods=rnd.choice((None, None, 2, 3)),
        extended={DEV: rnd.choice((1, 2))} if rnd.random() < 0.5 else {})


def _running(rnd: random.Random, nodes: list[NodeInfo]) -> tuple[RunningPod, ...]:
    out = []
    for i in range(rnd.choice((0, 1, 2))):
        out.append(RunningPod(
            uid=f"run{i}", name=f"run{i}", namespace="default",
            node=rnd.choice(nodes).name, labels={"app": rnd.choice("ab")},
            anti_affinity=(PodAffinityTerm(_sel(rnd), rnd.choice((HOST, ZONE))),)
            if rnd.random() < 0.3 else (),
            host_ports=(HostPort(80),) if rnd.random() < 0.3 else (),
            extended={DEV: 1} if rnd.random() < 0.3 else {},
            terminating=rnd.random() < 0.2))
    return tuple(out)


def _pod(rnd: random.Random, i: int, gang: str | None) -> Workload:
    r = rnd.random

    def maybe(p: float, v: object, default: object) -> object:
        return v if r() < p else default

    affinity = maybe(0.15, (NodeSelectorTerm((NodeSelectorRequirement(
        rnd.choice(("disk", "cfnet.io/security-level")),
        rnd.choice(("In", "NotIn", "Exists", "Gt")),
        ("ssd",) if r() < 0.5 else ("0",)),)),), ())
    spread = maybe(0.3, (SpreadConstraint(
        max_skew=1, topology_key=rnd.choice((HOST, ZONE)), hard=True, selector=_sel(rnd),
        min_domains=rnd.choice((None, None, 3)), honor_affinity=r() < 0.7,
        honor_taints=r() < 0.3),), ())
    return Workload(
        uid=f"p{i}", name=f"p{i}", labels={"app": rnd.choice("ab")},
        requests=Resources(rnd.choice((0, 300, 700, 1200)), rnd.choice((0, 1 << 30)),
                           rnd.choice((0, 0, 0, 1))),
        node_selector=maybe(0.15, {"disk": "ssd"}, {}),  # type: ignore[arg-type]
        node_affinity=affinity,  # type: ignore[arg-type]
        tolerations=maybe(0.3, (Toleration("dedicated", rnd.choice(("Equal", "Exists")),
                                           "x"),), ()),  # type: ignore[arg-type]
        pod_affinity=maybe(0.2, (PodAffinityTerm(_sel(rnd), rnd.choice((HOST, ZONE))),),
                           ()),  # type: ignore[arg-type]
        pod_anti_affinity=maybe(0.3, (PodAffinityTerm(_sel(rnd), rnd.choice((HOST, ZONE))),),
                                ()),  # type: ignore[arg-type]
        max_latency_ms=maybe(0.25, rnd.choice((5.0, 20.0)), None),  # type: ignore[arg-type]
        latency_to=rnd.choice(("gw", "z0", "n0", "r1")),
        residency=maybe(0.2, frozenset({rnd.choice(("r0", "r1"))}),
                        frozenset()),  # type: ignore[arg-type]
        min_security_level=rnd.choice((0, 0, 1, 2)),
        data_gb=rnd.choice((0.0, 50.0)), data_location=rnd.choice(("r0", "z1", None)),
        preferred_node_affinity=maybe(0.3, ((30, NodeSelectorTerm((NodeSelectorRequirement(
            "disk", "In", ("ssd",)),))),), ()),  # type: ignore[arg-type]
        gang=gang, spread=spread,  # type: ignore[arg-type]
        host_ports=maybe(0.2, (HostPort(80, host_ip=rnd.choice(("0.0.0.0", "10.0.0.1"))),),
                         ()),  # type: ignore[arg-type]
        extended=maybe(0.2, {DEV: 1}, {}))  # type: ignore[arg-type]


def instance(seed: int) -> tuple[ClusterSnapshot, list[Workload]]:
    rnd = random.Random(seed)
    nodes = [_node(rnd, i) for i in range(3)]
    links = {}
    for a, b in itertools.permutations([*(n.name for n in nodes), "gw"], 2):
        if rnd.random() < 0.5:
            links[a, b] = LinkInfo(1.0, rnd.choice((3.0, 10.0, 30.0)),
                                   age_s=rnd.choice((1.0, 100.0, 1000.0)))
    gang = [None, None, "g", "g"] if rnd.random() < 0.3 else [None] * 4
    pods = [_pod(rnd, i, gang[i]) for i in range(4)]
    return ClusterSnapshot(tuple(nodes), links, 0.0, _running(rnd, nodes)), pods


def _alone(w: Workload) -> Workload:
    return dataclasses.replace(w, gang=None)


SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
def test_model_accepts_exactly_what_validate_accepts(seed: int) -> None:
    snap, pods = instance(seed)
    cfg = EngineConfig()
    m = RefModel(snap, pods, cfg)
    names = [n.name for n in snap.nodes]
    for p, w in enumerate(pods):  # a pair without a variable is refused even alone
        for n, name in enumerate(names):
            if n not in m.on[p]:
                assert validate(snap, [_alone(w)], {w.uid: name}, cfg), (w, name)
    best: tuple[int, int] | None = None
    accepted = 0
    options = [[None, *(names[n] for n in m.on[p])] for p in range(len(pods))]
    for combo in itertools.product(*options):
        got = {w.uid: n for w, n in zip(pods, combo, strict=True) if n is not None}
        ok = not validate(snap, pods, got, cfg)
        assert m.accepts(got) == ok, (seed, got, validate(snap, pods, got, cfg))
        if ok:
            accepted += 1
            key = (-len(got), m.price(got))
            best = key if best is None or key < best else best
    assert best is not None and accepted >= 1  # placing nothing is always sound
    ref = m.solve(seconds=10.0, workers=2)
    assert ref.count_status == "OPTIMAL" and ref.status == "OPTIMAL"
    assert not validate(snap, pods, ref.assignments, cfg)
    assert (-ref.placed, m.price(ref.assignments)) == best
    assert round(ref.cost * cfg.cost_scale) == best[1]
    res = place(snap, pods, cfg)  # the engine's sound answers are ones the model accepts
    if not validate(snap, pods, res.assignments, cfg):
        assert m.accepts(res.assignments)
        assert (-len(res.assignments), m.price(res.assignments)) >= best


def test_the_seeds_reach_both_answers_and_every_rule() -> None:
    """The random instances are not trivial: assignments are accepted and refused, and
    each rule appears in some instance."""
    seen: set[str] = set()
    for seed in SEEDS:
        snap, pods = instance(seed)
        for w in pods:
            seen |= {f for f in ("pod_affinity", "pod_anti_affinity", "spread", "host_ports",
                                 "extended", "node_affinity", "max_latency_ms", "gang",
                                 "residency") if getattr(w, f)}
        seen |= {"running"} if snap.pods else set()
    assert len(seen) == 10, seen


def test_prices_are_the_engines() -> None:
    """The reference's integer price of the engine's answer is the engine's total cost
    (each pod rounded to the solver's units)."""
    from tools.bench_tight import make_tight

    inst = make_tight(12, 60, 3)
    cfg = EngineConfig(cpsat_polish=False)
    res = place(inst.snapshot, inst.pods, cfg)
    m = RefModel(inst.snapshot, inst.pods, cfg)
    assert m.accepts(res.assignments)
    assert abs(m.price(res.assignments) / cfg.cost_scale - res.total_cost) <= (
        0.5 * len(res.assignments) / cfg.cost_scale)
