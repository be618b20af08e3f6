"""Property tests over random clusters and batches.

* the independent validator finds no violation in any placement the engine makes;
* every unplaced workload's reason is true: no node could take it on top of the placement
  (checked by the validator), or its gang is entirely unplaced;
* on small instances the engine's objective equals a pod-level CP-SAT model's proven optimum
  (with the default solver chain, and with min-cost flow alone when constraints decompose).

Batches carry soft preferences and nodes ``PreferNoSchedule`` taints: they change the
objective (which the reference prices pod by pod), never what is valid.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_helpers import GIB

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
    PreparedCluster,
    Resources,
    RunningPod,
    Taint,
    Toleration,
    Workload,
    place,
    validate,
)
from cloud_core.placement.model import HOSTNAME, REGION, ZONE
from cloud_core.placement.prepared import class_key
from cloud_core.placement.validate import nodes_that_fit
from tools.placement_ref import solve_exact_pods

REGIONS = ("r0", "r1", "r2")
APPS = ("a", "b", "c")
KEYS = (HOSTNAME, ZONE, REGION)
PROFILE = settings(max_examples=1000, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def clusters(draw: Any, max_nodes: int = 10, running: bool = True,
             healthy_only: bool = False) -> ClusterSnapshot:
    n = draw(st.integers(1, max_nodes))
    nodes = []
    for i in range(n):
        region = draw(st.sampled_from(REGIONS))
        cap = Resources(draw(st.sampled_from([1000, 2000, 4000])),
                        draw(st.sampled_from([2, 4, 8])) * GIB, draw(st.sampled_from([0, 0, 1, 2])))
        alloc = Resources(draw(st.sampled_from([0, 0, 500, 1000])) % max(cap.cpu_milli, 1), 0, 0)
        nodes.append(NodeInfo(
            f"n{i}", region, f"{region}-{draw(st.sampled_from('xy'))}",
            security_level=draw(st.integers(0, 3)),
            labels={"tier": draw(st.sampled_from(["edge", "cloud"]))},
            taints=((Taint("gpu", "", "NoSchedule"),) if draw(st.booleans()) and cap.gpus
                    else ()) + ((Taint("spot", "", "PreferNoSchedule"),)
                                if draw(st.integers(0, 3)) == 0 else ()),
            capacity=cap, allocated=alloc,
            health=Health.ONLINE if healthy_only else draw(st.sampled_from(
                [Health.ONLINE] * 6 + [Health.DOWN, Health.SUSPECT, Health.CORDONED])),
            price_per_hour=draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])),
            energy_price_per_kwh=0.2, carbon_g_per_kwh=draw(st.sampled_from([50, 300, 700])),
            idle_watts=100, max_watts=300))
    links = {}
    names = [x.name for x in nodes] + ["user"]
    for a in names[:-1]:
        for b in names:
            if a != b and draw(st.integers(0, 3)) == 0:
                p95 = draw(st.sampled_from([2.0, 8.0, 15.0, 30.0]))
                links[(a, b)] = LinkInfo(p95 / 2, p95, 0.0, 1e8,
                                         draw(st.sampled_from([1.0, 1.0, 100.0, 1000.0])))
    pods: tuple[RunningPod, ...] = ()
    if running and draw(st.booleans()):
        pods = tuple(RunningPod(f"run{j}", f"run{j}", "default",
                                draw(st.sampled_from(nodes)).name,
                                {"app": draw(st.sampled_from(APPS))}, Resources(),
                                draw(st.sampled_from([(), (_term("a", HOSTNAME),)])))
                     for j in range(draw(st.integers(1, 3))))
    return ClusterSnapshot(tuple(nodes), links, 1000.0, pods)


def _term(app: str, key: str) -> PodAffinityTerm:
    return PodAffinityTerm(LabelSelector({"app": app}), key)


@st.composite
def batches(draw: Any, snap: ClusterSnapshot, max_pods: int = 12, affinity: bool = True,
            gangs: bool = True, shapes: bool = True) -> list[Workload]:
    node_names = [x.name for x in snap.nodes]
    out: list[Workload] = []
    n_groups = draw(st.integers(1, 4))
    for g in range(n_groups):
        app = draw(st.sampled_from(APPS))
        reps = draw(st.integers(1, max(1, max_pods // n_groups)))
        req = Resources(draw(st.sampled_from([250, 500, 1000] if shapes else [500])),
                        draw(st.sampled_from([GIB // 2, GIB] if shapes else [GIB])),
                        draw(st.sampled_from([0, 0, 0, 1])) if shapes else 0)
        anti: tuple[PodAffinityTerm, ...] = ()
        if draw(st.booleans()):
            anti = (_term(draw(st.sampled_from(APPS)) if shapes else app,
                          draw(st.sampled_from(KEYS))),)
        aff: tuple[PodAffinityTerm, ...] = ()
        if affinity and draw(st.integers(0, 4)) == 0:
            aff = (_term(draw(st.sampled_from(APPS)), draw(st.sampled_from(KEYS))),)
        sla = draw(st.sampled_from([None, None, 10.0, 20.0]))
        target = draw(st.sampled_from([*node_names, "user", "r1", "r0-x"]))
        selector = {"tier": "edge"} if draw(st.integers(0, 3)) == 0 else {}
        affinity_terms: tuple[NodeSelectorTerm, ...] = ()
        if draw(st.integers(0, 4)) == 0:
            affinity_terms = (NodeSelectorTerm((NodeSelectorRequirement(
                "tier", "NotIn", ("cloud",)),)),)
        preferred: tuple[tuple[int, NodeSelectorTerm], ...] = ()
        if draw(st.integers(0, 2)) == 0:  # soft costs: only the objective may change
            preferred = ((draw(st.integers(1, 100)), NodeSelectorTerm((NodeSelectorRequirement(
                "tier", "In", (draw(st.sampled_from(["edge", "cloud"])),)),))),)
            if draw(st.booleans()):
                preferred += ((draw(st.integers(1, 100)), NodeSelectorTerm((
                    NodeSelectorRequirement(HOSTNAME, "In", (draw(st.sampled_from(
                        node_names)),)),))),)
        base = dict(
            namespace="default", requests=req, node_selector=selector,
            node_affinity=affinity_terms, preferred_node_affinity=preferred,
            tolerations=draw(st.sampled_from([(), (Toleration("gpu", "Exists"),),
                                              (Toleration("spot", "Exists"),)])),
            pod_affinity=aff, pod_anti_affinity=anti,
            max_latency_ms=sla, latency_to=target if sla else None,
            residency=frozenset(draw(st.sets(st.sampled_from(REGIONS), max_size=2))),
            min_security_level=draw(st.integers(0, 2)),
            data_gb=draw(st.sampled_from([0.0, 50.0])), data_location="r0",
            cost_weight=draw(st.sampled_from([0.5, 1.0])), labels={"app": app},
            gang=f"gang{g}" if gangs and draw(st.integers(0, 4)) == 0 else None)
        out.extend(Workload(f"g{g}-{k}", f"g{g}-{k}", **base)
                   for k in range(reps))
    return out


@st.composite
def instances(draw: Any, **kw: Any) -> tuple[ClusterSnapshot, list[Workload]]:
    snap = draw(clusters(running=kw.pop("running", True), max_nodes=kw.pop("max_nodes", 10),
                         healthy_only=kw.pop("healthy_only", False)))
    return snap, draw(batches(snap, **kw))


@PROFILE
@given(instances())
def test_no_violations_and_true_reasons(inst: tuple[ClusterSnapshot, list[Workload]]) -> None:
    snap, ws = inst
    res = place(snap, ws)
    assert validate(snap, ws, res.assignments) == []
    assert [d.workload_uid for d in res.decisions] == [w.uid for w in ws]
    by_uid = {w.uid: w for w in ws}
    for d in res.unplaced:
        w = by_uid[d.workload_uid]
        assert d.reasons and d.summary
        fit_total = d.summary.split(" nodes fit")[0]
        assert fit_total.endswith(f"/{len(snap.nodes)}")
        if w.gang is not None and any(r.startswith("gang") for r in d.reasons):
            # the reason is true: the gang went all-or-nothing and is not placed
            assert not any(x.uid in res.assignments for x in ws if x.gang == w.gang)
            continue
        assert nodes_that_fit(snap, ws, res.assignments, w) == [], (d, res.assignments)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(instances(max_nodes=60, max_pods=120))
def test_larger_batches_stay_sound(inst: tuple[ClusterSnapshot, list[Workload]]) -> None:
    """Bigger batches exercise arc pruning, residual flow rounds and the fill."""
    snap, ws = inst
    cfg = EngineConfig(flow_min_arcs=4, flow_arc_slack=1.0, cpsat_max_arcs=0)
    res = place(snap, ws, cfg)
    assert validate(snap, ws, res.assignments, cfg) == []
    by_uid = {w.uid: w for w in ws}
    for d in res.unplaced[:5]:
        w = by_uid[d.workload_uid]
        if w.gang is None:
            assert nodes_that_fit(snap, ws, res.assignments, w, cfg) == []


def _reference(snap: ClusterSnapshot, ws: list[Workload], cfg: EngineConfig
               ) -> tuple[int, int, bool]:
    """Pod-level CP-SAT optimum: (placed, integer cost, proven). Feasibility of each
    (pod, node) pair comes from the validator, not from the engine's filters."""
    pc = PreparedCluster(snap, cfg)
    feas = []
    for w in ws:
        c = pc.cost(w)
        solo = Workload(**{**{f: getattr(w, f) for f in w.__dataclass_fields__}, "gang": None})
        feas.append({i: round(float(c[i]) * cfg.cost_scale) for i, nd in enumerate(snap.nodes)
                     if not validate(snap, [solo], {w.uid: nd.name}, cfg)})
    conflicts = []
    for a, wa in enumerate(ws):
        for t in wa.pod_anti_affinity:
            for b, wb in enumerate(ws):
                if a != b and all(wb.labels.get(k) == v
                                  for k, v in t.selector.match_labels.items()):
                    conflicts.append((a, b, t.topology_key))
    domains = {k: pc.ix.domain_ids(k)[0].tolist() for k in KEYS}
    gangs: dict[str, list[int]] = {}
    for i, w in enumerate(ws):
        if w.gang:
            gangs.setdefault(w.gang, []).append(i)
    mx = max((max(f.values(), default=0) for f in feas), default=0)
    penalty = (mx + 1) * (len(ws) + 1)
    free = (pc.ix.cap - pc.ix.alloc).tolist()
    ex = solve_exact_pods(feas, [(w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus)
                                 for w in ws], free, conflicts, domains, list(gangs.values()),
                          penalty, 20.0)
    placed = sum(1 for n in ex.nodes if n >= 0)
    cost = sum(feas[p][n] for p, n in enumerate(ex.nodes) if n >= 0)
    return placed, cost, ex.optimal


def _engine_cost(snap: ClusterSnapshot, ws: list[Workload], assign: dict[str, str],
                 cfg: EngineConfig) -> int:
    pc = PreparedCluster(snap, cfg)
    return sum(round(float(pc.cost(w)[pc.ix.pos[assign[w.uid]]]) * cfg.cost_scale)
               for w in ws if w.uid in assign)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(instances(affinity=False, max_nodes=6, max_pods=8))
def test_small_instances_match_cpsat_optimum(inst: tuple[ClusterSnapshot, list[Workload]]
                                             ) -> None:
    snap, ws = inst
    cfg = EngineConfig()
    res = place(snap, ws, cfg)
    placed, cost, proven = _reference(snap, ws, cfg)
    if not proven:
        return
    assert len(res.assignments) == placed
    assert _engine_cost(snap, ws, dict(res.assignments), cfg) == cost


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(instances(affinity=False, gangs=False, shapes=False, max_nodes=8, max_pods=10,
                 running=False))
def test_min_cost_flow_is_exact_when_constraints_decompose(
        inst: tuple[ClusterSnapshot, list[Workload]]) -> None:
    """One shape, anti-affinity only within a class: flow alone reaches the optimum."""
    snap, ws = inst
    # keep only self-selecting anti-affinity (what the flow models exactly)
    ws = [w if not w.pod_anti_affinity
          or w.pod_anti_affinity[0].selector.match_labels.get("app") == w.labels.get("app")
          else Workload(**{**{f: getattr(w, f) for f in w.__dataclass_fields__},
                           "pod_anti_affinity": ()}) for w in ws]
    classes: dict[str, set[object]] = {}
    for w in ws:
        classes.setdefault(w.labels["app"], set()).add(class_key(w))
    if any(len(g) > 1 and any(w.pod_anti_affinity for w in ws if w.labels["app"] == a)
           for a, g in classes.items()):
        return  # two classes share a label: anti-affinity would couple them
    cfg = EngineConfig(use_cpsat=False)
    res = place(snap, ws, cfg)
    assert validate(snap, ws, res.assignments, cfg) == []
    placed, cost, proven = _reference(snap, ws, cfg)
    if not proven:
        return
    assert len(res.assignments) == placed
    assert _engine_cost(snap, ws, dict(res.assignments), cfg) == cost


def test_reference_agrees_on_a_known_case() -> None:
    """Sanity of the reference itself: two pods, two nodes, spread."""
    nodes = (NodeInfo("a", "r0", "z", price_per_hour=1.0, capacity=Resources(4000, 8 * GIB)),
             NodeInfo("b", "r0", "z", price_per_hour=2.0, capacity=Resources(4000, 8 * GIB)))
    snap = ClusterSnapshot(nodes, {}, 0.0)
    ws = [Workload(f"w{i}", f"w{i}", requests=Resources(1000, GIB), labels={"app": "a"},
                   pod_anti_affinity=(_term("a", HOSTNAME),)) for i in range(2)]
    placed, cost, proven = _reference(snap, ws, EngineConfig())
    assert (placed, proven) == (2, True)
    res = place(snap, ws)
    assert np.isclose(_engine_cost(snap, ws, dict(res.assignments), EngineConfig()), cost)


def _naive_place_class(pc: Any, w: Workload, count: int, usage: Any, policy: str) -> list[int]:
    """``sequential.place_class`` as it was written first: every pod recomputes what fits
    and its cost over all nodes (the reference for the incremental version)."""
    from cloud_core.placement import scores
    from cloud_core.placement.prepared import all_ok, as_running, request_vector
    from cloud_core.placement.sequential import SpreadState

    frs = pc.filter_results(w, resources=False)
    by_name = {f.name: f.ok for f in frs}
    static_ok = by_name["node_selector"] & by_name["node_affinity"]
    spreads = [SpreadState(pc, w, c, static_ok, by_name["taints"]) for c in w.spread]
    req = request_vector(w)
    placed: list[int] = []
    for _ in range(count):
        mask = all_ok(pc.filter_results(w, resources=False)) & (pc.free >= req).all(axis=1)
        um, reason = usage.mask(w)
        mask &= um
        for s in spreads:
            if s.c.hard:
                mask &= (s.dom >= 0) & (s.skew() <= s.c.max_skew)
        if reason is not None or not mask.any():
            break
        cost = scores.sequential_cost(w, pc.ix, mask, policy,
                                      [(s.skew(), s.c.max_skew) for s in spreads
                                       if not s.c.hard])
        i = int(np.argmin(cost))
        placed.append(i)
        pc.free[i] -= req
        pc.ix.alloc[i] += req
        pc.pods.add(as_running(w, pc.ix.nodes[i].name))
        usage.add(i, w.extended, w.host_ports)
        for s in spreads:
            s.placed(i)
    return placed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters(max_nodes=12), count=st.integers(1, 14),
       policy=st.sampled_from(["cost", "spread"]),
       spread=st.sampled_from(["none", "hard-zone", "hard-host", "soft-zone", "both"]),
       cpu=st.sampled_from([100, 500, 1500]))
def test_place_class_keeps_the_naive_answers(snap: ClusterSnapshot, count: int, policy: str,
                                             spread: str, cpu: int) -> None:
    """Kept per node (what fits, the cost) or recomputed per pod: the same nodes, in the
    same order, for every policy and kind of spread constraint."""
    from cloud_core.placement import PreparedCluster
    from cloud_core.placement.model import LabelSelector, SpreadConstraint
    from cloud_core.placement.sequential import NodeUsage, place_class

    sel = LabelSelector({"app": "s"})
    cons = {"none": (), "hard-zone": (SpreadConstraint(1, ZONE, True, sel),),
            "hard-host": (SpreadConstraint(1, HOSTNAME, True, sel),),
            "soft-zone": (SpreadConstraint(1, ZONE, False, sel),),
            "both": (SpreadConstraint(2, ZONE, True, sel),
                     SpreadConstraint(1, HOSTNAME, False, sel))}[spread]
    w = Workload("w", "w", requests=Resources(cpu, GIB // 4, 0), labels={"app": "s"},
                 spread=cons)
    got, want = [], []
    for out, fn in ((got, place_class), (want, _naive_place_class)):
        pc = PreparedCluster(snap, EngineConfig())
        usage = NodeUsage(pc, snap.pods)
        res = fn(pc, w, count, usage, policy)
        out.extend(res[0] if isinstance(res, tuple) else res)
    assert got == want
