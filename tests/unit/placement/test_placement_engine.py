"""Engine behaviour: batches, explanations, gangs, affinity rounds, the prepared view."""

from __future__ import annotations

import re

import pytest
from placement_helpers import GIB, node, snap, wl

from cloud_core.errors import PlacementError
from cloud_core.placement import (
    EngineConfig,
    Health,
    LabelSelector,
    LinkInfo,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Resources,
    RunningPod,
    Taint,
    Toleration,
    explain,
    place,
    prepare,
    validate,
)
from cloud_core.placement.model import ZONE
from cloud_core.placement.prepared import class_key
from cloud_core.placement.scores import TERMS

SPREAD = (PodAffinityTerm(LabelSelector({"app": "web"})),)


def test_every_workload_gets_node_or_reason_in_input_order() -> None:
    nodes = [node("a", price_per_hour=1.0), node("b", price_per_hour=2.0)]
    ws = [wl(f"w{i}", requests=Resources(2000, GIB, 0)) for i in range(5)]
    r = place(snap(nodes), ws)
    assert [d.workload_uid for d in r.decisions] == [w.uid for w in ws]
    assert len(r.assignments) == 4
    assert sum(1 for d in r.decisions if d.node == "a") == 2  # cheaper node filled first
    (d,) = r.unplaced
    assert d.summary == "0/2 nodes fit: 2 insufficient cpu"
    assert d.reasons == ("capacity taken by other workloads of the batch",)
    assert validate(snap(nodes), ws, r.assignments) == []


def test_summary_counts_first_failing_filter() -> None:
    nodes = ([node(f"x{i}", "us") for i in range(3)]
             + [node(f"d{i}", "eu", health=Health.DOWN) for i in range(2)]
             + [node(f"g{i}", "eu", taints=(Taint("gpu", "", "NoSchedule"),))
                for i in range(1)]
             + [node(f"s{i}", "eu", capacity=Resources(500, GIB, 0)) for i in range(4)]
             + [node("far", "eu")])
    w = wl("w", residency=frozenset({"eu"}), max_latency_ms=50, latency_to="u")
    links = {("far", "u"): LinkInfo(40, 60)} | {(f"s{i}", "u"): LinkInfo(1, 2)
                                                  for i in range(4)}
    r = place(snap(nodes, links), [w])
    assert r.decisions[0].node is None
    assert r.decisions[0].summary == ("0/11 nodes fit: 4 insufficient cpu, 3 residency, "
                                      "2 node down, 1 latency > 50 ms, 1 untolerated taint")
    assert r.decisions[0].reasons == ("no node satisfies every constraint",)


def test_runner_up_and_why() -> None:
    nodes = [node("a", price_per_hour=1.0), node("b", price_per_hour=1.5),
             node("c", price_per_hour=3.0)]
    r = place(snap(nodes), [wl("w")])
    d = r.decisions[0]
    assert (d.node, d.runner_up) == ("a", "b")
    assert re.fullmatch(r"runner-up b costs \+0\.\d+ \$/h", d.reasons[0])
    assert d.summary.startswith("placed on a (") and d.summary.endswith("3/3 nodes fit")
    assert d.cost == pytest.approx(r.total_cost)


def test_batch_is_global_not_greedy() -> None:
    """Greedy one-by-one would put the flexible pod on the only GPU-free cheap node first."""
    cheap = node("cheap", price_per_hour=1.0, capacity=Resources(2000, 4 * GIB, 0))
    other = node("other", "r2", price_per_hour=1.1, capacity=Resources(2000, 4 * GIB, 0))
    flexible = wl("flex", requests=Resources(2000, GIB, 0))
    pinned = wl("pinned", requests=Resources(2000, GIB, 0), residency=frozenset({"r1"}))
    r = place(snap([cheap, other]), [flexible, pinned])
    assert r.assignments == {"flex": "other", "pinned": "cheap"}


def test_hostname_and_zone_spread() -> None:
    nodes = [node(f"n{i}", zone=f"z{i % 2}") for i in range(4)]
    ws = [wl(f"w{i}", labels={"app": "web"}, pod_anti_affinity=SPREAD) for i in range(5)]
    r = place(snap(nodes), ws)
    assert len(r.assignments) == 4 and len(set(r.assignments.values())) == 4
    assert "pod anti-affinity" in r.unplaced[0].summary
    zone = (PodAffinityTerm(LabelSelector({"app": "web"}), ZONE),)
    ws = [wl(f"w{i}", labels={"app": "web"}, pod_anti_affinity=zone) for i in range(3)]
    r = place(snap(nodes), ws)
    assert len(r.assignments) == 2
    assert validate(snap(nodes), ws, r.assignments) == []


def test_cross_class_anti_affinity() -> None:
    nodes = [node("a"), node("b", price_per_hour=5.0)]
    db = wl("db", labels={"app": "db"})
    web = wl("web", labels={"app": "web"},
             pod_anti_affinity=(PodAffinityTerm(LabelSelector({"app": "db"})),))
    r = place(snap(nodes), [db, web])
    assert len(r.assignments) == 2 and r.assignments["db"] != r.assignments["web"]
    assert validate(snap(nodes), [db, web], r.assignments) == []


def test_gang_all_or_nothing() -> None:
    nodes = [node("a", capacity=Resources(4000, 8 * GIB, 2))]
    gang = [wl(f"g{i}", requests=Resources(1000, GIB, 1), gang="t") for i in range(3)]
    solo = wl("solo", requests=Resources(1000, GIB, 1))
    r = place(snap(nodes), [*gang, solo])
    assert r.assignments == {"solo": "a"}
    assert all("gang t" in r.decision(w.uid).reasons[0] for w in gang)
    r = place(snap(nodes), gang[:2])
    assert len(r.assignments) == 2


def test_gang_all_or_nothing_across_routes() -> None:
    """A gang whose members take different routes (one through the solver, one pod by pod
    for its extended resource) is placed whole or not at all: here the second member finds
    no node with its device, so the first gives its node back."""
    nodes = [node("a", extended={"example.com/fpga": 1}), node("b")]
    plain = wl("g0", gang="t")
    fpga = wl("g1", gang="t", extended={"example.com/fpga": 2})
    solo = wl("solo")
    r = place(snap(nodes), [plain, fpga, solo])
    assert r.assignments == {"solo": r.assignments["solo"]}
    assert "gang t" in " ".join(r.decision("g0").reasons)
    assert validate(snap(nodes), [plain, fpga, solo], r.assignments) == []
    ok = wl("g1", gang="t", extended={"example.com/fpga": 1})
    r = place(snap(nodes), [plain, ok])
    assert set(r.assignments) == {"g0", "g1"} and r.assignments["g1"] == "a"


def test_pod_affinity_within_batch() -> None:
    nodes = [node("a", zone="z1"), node("b", zone="z2", price_per_hour=0.5)]
    cache = wl("cache", labels={"app": "cache"}, residency=frozenset({"r1"}),
               node_selector={"kubernetes.io/hostname": "a"})
    app = wl("app", pod_affinity=(PodAffinityTerm(LabelSelector({"app": "cache"}), ZONE),))
    r = place(snap(nodes), [app, cache])
    assert r.assignments == {"cache": "a", "app": "a"}
    assert r.stats["rounds"] == 2
    # self-affine group: the first goes anywhere (cheapest), the rest follow it
    grp = [wl(f"s{i}", labels={"app": "s"},
              pod_affinity=(PodAffinityTerm(LabelSelector({"app": "s"}), ZONE),))
           for i in range(3)]
    r = place(snap(nodes), grp)
    assert set(r.assignments.values()) == {"b"}
    assert validate(snap(nodes), grp, r.assignments) == []


def test_pod_affinity_unsatisfiable() -> None:
    r = place(snap([node("a")]),
              [wl("x", pod_affinity=(PodAffinityTerm(LabelSelector({"app": "nope"})),))])
    assert r.decisions[0].node is None
    assert r.decisions[0].reasons[0].startswith("pod affinity")
    assert "1 pod affinity" in r.decisions[0].summary


def test_running_pods_count() -> None:
    pods = (RunningPod("p", "p", "default", "a", {"app": "web"}, Resources(), SPREAD),)
    nodes = [node("a"), node("b", price_per_hour=9.0)]
    w = wl("w", labels={"app": "web"}, pod_anti_affinity=SPREAD)
    assert place(snap(nodes, pods=pods), [w]).assignments == {"w": "b"}


def test_duplicate_uid_is_an_error() -> None:
    with pytest.raises(PlacementError, match="duplicate"):
        place(snap([node("a")]), [wl("x"), wl("x")])


def test_prepared_one_pod_at_a_time_keeps_account() -> None:
    pc = prepare(snap([node("a", capacity=Resources(2000, 8 * GIB, 0))]))
    assert pc.place([wl("x")]).assignments == {"x": "a"}
    assert pc.place([wl("y")]).assignments == {"y": "a"}
    assert pc.place([wl("z")]).assignments == {}
    pc2 = prepare(snap([node("a", capacity=Resources(2000, 8 * GIB, 0))]))
    pc2.bind(wl("ext", requests=Resources(1500, 0, 0)), "a")
    assert pc2.place([wl("x")]).assignments == {}
    with pytest.raises(PlacementError):
        pc2.bind(wl("q"), "nope")


def test_explain() -> None:
    nodes = [node("a", "eu", price_per_hour=1.0), node("b", "us")]
    w = wl("w", residency=frozenset({"eu"}), tolerations=(Toleration("", "Exists"),))
    e = explain(snap(nodes), w, node="b")
    assert e.summary == "1/2 nodes fit: 1 residency"
    assert e.node_reasons == ("residency",)
    assert e.best[0][0] == "a"
    assert set(e.breakdown) == {"price", "energy", "carbon", "data", "latency", "balance",
                                "affinity", "taint", "pod_affinity"} == set(TERMS)
    assert "b: residency" in str(e)
    with pytest.raises(PlacementError):
        explain(snap(nodes), w, node="zz")


def test_cpsat_and_flow_agree_on_uncoupled_batch() -> None:
    nodes = [node(f"n{i}", price_per_hour=1 + i / 10, capacity=Resources(3000, 8 * GIB, 0))
             for i in range(6)]
    ws = [wl(f"w{i}", residency=frozenset({"r1"})) for i in range(10)]
    a = place(snap(nodes), ws, EngineConfig(use_cpsat=False))
    b = place(snap(nodes), ws)
    assert a.total_cost == pytest.approx(b.total_cost)


def test_empty_inputs() -> None:
    r = place(snap([]), [wl("a"), wl("b", max_latency_ms=5.0, latency_to="x")])
    assert [d.summary for d in r.decisions] == ["0/0 nodes fit", "0/0 nodes fit"]
    r = place(snap([node("a")]), [])
    assert r.decisions == () and r.assignments == {} and r.total_cost == 0.0


def test_zero_request_pods_are_placed() -> None:
    r = place(snap([node("a")]), [wl(f"z{i}", requests=Resources()) for i in range(50)])
    assert len(r.assignments) == 50


def test_explain_a_running_workload_does_not_count_itself() -> None:
    me = wl("w", labels={"app": "web"}, pod_anti_affinity=SPREAD,
            requests=Resources(3000, GIB, 0))
    pods = (RunningPod("w", "w", "default", "a", {"app": "web"}, Resources(3000, GIB, 0),
                       SPREAD),)
    nodes = [node("a", allocated=Resources(3000, GIB, 0))]
    e = explain(snap(nodes, pods=pods), me, node="a")
    assert e.node_reasons == () and e.fit == 1


def test_duplicate_node_is_an_error() -> None:
    with pytest.raises(PlacementError, match="twice"):
        place(snap([node("a"), node("a")]), [wl("x")])


# -- soft costs: preferred node affinity and PreferNoSchedule taints -----------------------
def _prefers(key: str, value: str, weight: int = 100) -> tuple[tuple[int, NodeSelectorTerm],
                                                                 ...]:
    return ((weight, NodeSelectorTerm((NodeSelectorRequirement(key, "In", (value,)),))),)


SOLVERS = [EngineConfig(), EngineConfig(use_cpsat=False)]


@pytest.mark.parametrize("cfg", SOLVERS, ids=["cpsat", "flow"])
def test_preferred_node_affinity_picks_the_preferred_node(cfg: EngineConfig) -> None:
    """Two otherwise identical nodes: the preference decides, even against a small price
    edge (0.025 $/h here) and the index order that would break a tie."""
    nodes = [node("a", price_per_hour=0.9), node("b", labels={"disk": "ssd"})]
    assert place(snap(nodes), [wl("plain")], cfg).assignments == {"plain": "a"}
    w = wl("w", preferred_node_affinity=_prefers("disk", "ssd"))
    r = place(snap(nodes), [w], cfg)
    assert r.assignments == {"w": "b"}
    assert r.decisions[0].runner_up == "a"
    e = explain(snap(nodes), w, node="a")
    assert e.breakdown["affinity"] == pytest.approx(cfg.weights.affinity)
    assert "affinity" in str(e)
    assert explain(snap(nodes), w, node="b").breakdown["affinity"] == 0.0
    # a large price gap is worth more than a preference
    dear = [node("a", price_per_hour=0.5), node("b", labels={"disk": "ssd"})]
    assert place(snap(dear), [w], cfg).assignments == {"w": "a"}


@pytest.mark.parametrize("cfg", SOLVERS, ids=["cpsat", "flow"])
def test_hard_constraints_win_over_preferences(cfg: EngineConfig) -> None:
    """A preference never makes a node valid, nor a workload unplaceable."""
    nodes = [node("a", "eu"), node("b", "us", labels={"disk": "ssd"}),
             node("c", "eu", labels={"disk": "ssd"}, capacity=Resources(500, GIB, 0))]
    prefs = _prefers("disk", "ssd")
    cases = [
        wl("residency", preferred_node_affinity=prefs, residency=frozenset({"eu"})),
        wl("required", preferred_node_affinity=prefs, node_affinity=(NodeSelectorTerm((
            NodeSelectorRequirement("disk", "DoesNotExist"),)),)),
        wl("selector", preferred_node_affinity=prefs,
           node_selector={"kubernetes.io/hostname": "a"}),
        wl("taint", preferred_node_affinity=prefs),  # b is tainted below
    ]
    tainted = [nodes[0], node("b", "us", labels={"disk": "ssd"},
                              taints=(Taint("gpu", "", "NoSchedule"),)), nodes[2]]
    for w in cases:
        sn = snap(tainted if w.uid == "taint" else nodes)
        r = place(sn, [w], cfg)
        assert r.assignments == {w.uid: "a"}, w.uid  # c is preferred too, but full
        assert validate(sn, [w], r.assignments) == []
    # the only preferred node is full: the pod still goes, elsewhere
    full = [node("a"), node("b", labels={"disk": "ssd"}, allocated=Resources(4000, 0, 0))]
    assert place(snap(full), [wl("w", preferred_node_affinity=prefs)],
                 cfg).assignments == {"w": "a"}


@pytest.mark.parametrize("cfg", SOLVERS, ids=["cpsat", "flow"])
def test_prefer_no_schedule_taint_is_avoided_unless_tolerated(cfg: EngineConfig) -> None:
    soft = Taint("spot", "", "PreferNoSchedule")
    nodes = [node("spot", price_per_hour=0.9, taints=(soft,)), node("clean")]
    assert place(snap(nodes), [wl("w")], cfg).assignments == {"w": "clean"}
    tol = wl("t", tolerations=(Toleration("spot", "Exists"),))
    assert place(snap(nodes), [tol], cfg).assignments == {"t": "spot"}  # cheaper wins again
    # soft means soft: the only node left is tainted, and the pod goes there
    only = [nodes[0], node("clean", allocated=Resources(4000, 0, 0))]
    r = place(snap(only), [wl("w")], cfg)
    assert r.assignments == {"w": "spot"}
    assert validate(snap(only), [wl("w")], r.assignments) == []


@pytest.mark.parametrize("cfg", SOLVERS, ids=["cpsat", "flow"])
def test_pods_differing_only_in_preferences_are_separate_classes(cfg: EngineConfig) -> None:
    """One batch, two pods that differ only in what they prefer (and two that differ only in
    tolerating a soft taint): each lands on its own preferred node. Both nodes could hold
    both pods, so pods merged into one class would share the first pod's cost and node."""
    nodes = [node("y", labels={"site": "y"}, taints=(Taint("spot", "", "PreferNoSchedule"),)),
             node("x", labels={"site": "x"})]
    to_x = wl("to-x", labels={"app": "a"}, preferred_node_affinity=_prefers("site", "x"))
    to_y = wl("to-y", labels={"app": "a"}, preferred_node_affinity=_prefers("site", "y"),
              tolerations=(Toleration("spot", "Exists"),))
    assert class_key(to_x) != class_key(to_y)
    for batch in ([to_x, to_y], [to_y, to_x]):
        r = place(snap(nodes), batch, cfg)
        assert r.assignments == {"to-x": "x", "to-y": "y"}
        assert r.stats["classes"] == 2
    # only the soft-taint toleration differs: the tolerating pod takes the cheaper node
    cheap_spot = [node("y", price_per_hour=0.9, taints=(Taint("spot", "", "PreferNoSchedule"),)),
                  node("x")]
    plain, tolerant = wl("plain"), wl("tolerant", tolerations=(Toleration("spot", "Exists"),))
    r = place(snap(cheap_spot), [plain, tolerant], cfg)
    assert r.assignments == {"plain": "x", "tolerant": "y"}


def test_unplaced_summary_names_the_constraints_checked_pod_by_pod() -> None:
    """The unplaced message tallied only the batch filters, so a pod refused for a
    host port in use or a node's pod count said "2/3 nodes fit". Each node now counts under
    its first refusal, the pod-by-pod checks included, as kube-scheduler's "0/3 nodes are
    available: 1 Insufficient cpu, 1 node(s) didn't have free ports for the requested pod
    ports, 1 Too many pods", and the tally is explain()'s."""
    from cloud_core.placement.model import HostPort

    nodes = [node("a"), node("b", max_pods=1), node("c", capacity=Resources(500, 8 * GIB, 0))]
    held = (RunningPod("h", "h", "default", "a", host_ports=(HostPort(80),)),
            RunningPod("f", "f", "default", "b"))
    w = wl("w", host_ports=(HostPort(80),))
    s = snap(nodes, pods=held)
    r = place(s, [w])
    (d,) = r.unplaced
    assert d.summary.startswith(
        "0/3 nodes fit: 1 host port in use, 1 insufficient cpu, 1 too many pods"), d.summary
    e = explain(s, w)
    assert e.summary == "0/3 nodes fit: 1 host port in use, 1 insufficient cpu, 1 too many pods"
    assert dict(e.examples) == {"a": "host port in use", "b": "too many pods",
                                "c": "insufficient cpu"}


def test_unplaced_in_a_batch_counts_the_batch_s_own_placements() -> None:
    """Three pods wanting host port 80 on two nodes in one batch: the third is told that both
    nodes hold the port now (it said "2/2 nodes fit; host port in use")."""
    from cloud_core.placement.model import HostPort

    r = place(snap([node("a"), node("b")]), [wl(f"w{i}", host_ports=(HostPort(80),))
                                            for i in range(3)])
    (d,) = r.unplaced
    assert d.summary == "0/2 nodes fit: 2 host port in use"
    r = place(snap([node("a", max_pods=2)]), [wl(f"w{i}") for i in range(3)])
    (d,) = r.unplaced
    assert d.summary == "0/1 nodes fit: 1 too many pods"


def test_trimming_a_full_node_keeps_the_pod_others_are_affine_to() -> None:
    """Nodes past their pod count are trimmed after the solver's rounds; a pod that other
    classes' pod affinity selects (a database, its clients placed in its zone in a later
    round) is trimmed last, so no client is left without a match in its zone (the quality
    benchmark's mixed 200 x 50, seed 2: 9 pod-affinity violations before)."""
    from cloud_core.placement import validate
    from tools.quality_families import FAMILIES

    snap, pods = FAMILIES["mixed"](200, 2)
    cfg = EngineConfig(cpsat_polish=False)
    res = place(snap, pods, cfg)
    assert validate(snap, pods, res.assignments, cfg) == []
    assert len(res.assignments) >= 150
