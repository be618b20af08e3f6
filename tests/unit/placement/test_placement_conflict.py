"""Minimal conflicts and their relaxations (``conflict.py``, ``relax.py``).

Table-driven cases whose minimal conflicting set is known by construction (each part
excludes the nodes it was built to exclude), one per kind alone, pairs and triples; every
answer is checked against the independent validator: the set admits no node, each strict
subset does, and each suggestion makes the pod fit where it says.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import pytest
from placement_helpers import GIB, node, snap, wl

from cloud_core.placement import (
    ClusterSnapshot,
    LabelSelector,
    LinkInfo,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Resources,
    RunningPod,
    Taint,
    Workload,
)
from cloud_core.placement.conflict import Constraint, drop
from cloud_core.placement.model import HostPort, SpreadConstraint
from cloud_core.placement.preempt import without
from cloud_core.placement.relax import Diagnosis, diagnose
from cloud_core.placement.validate import nodes_that_fit, validate


def _fits(s: ClusterSnapshot, w: Workload) -> bool:
    return bool(nodes_that_fit(s, [w], {}, dataclasses.replace(w, gang=None)))


def _gang_fits(s: ClusterSnapshot, w: Workload, size: int) -> bool:
    """``size`` copies of ``w`` placed greedily (first node with room), checked whole."""
    placed: list[Workload] = []
    assign: dict[str, str] = {}
    for k in range(size):
        m = dataclasses.replace(w, uid=f"{w.uid}#{k}")
        for n in s.nodes:
            trial = {**assign, m.uid: n.name}
            if not validate(s, [*placed, dataclasses.replace(m, gang=None)], trial):
                placed.append(dataclasses.replace(m, gang=None))
                assign = trial
                break
        else:
            return False
    return True


def _kept(s: ClusterSnapshot, w: Workload, d: Diagnosis, keep: Sequence[Constraint]
          ) -> tuple[ClusterSnapshot, Workload]:
    every = [c for c in _all_parts(s, w)]
    return drop(s, w, [c for c in every if c not in keep])


def _all_parts(s: ClusterSnapshot, w: Workload) -> list[Constraint]:
    from cloud_core.placement.conflict import parts_of
    from cloud_core.placement.engine import PreparedCluster

    return list(parts_of(s, w, PreparedCluster(s), GANG.get(w.uid, 1)).masks)


GANG: dict[str, int] = {}


def check_answer(s: ClusterSnapshot, w: Workload, d: Diagnosis, gang: int = 1) -> None:
    """What every answer must satisfy, checked with the validator alone."""
    c = d.conflict
    if c.fits:
        assert _fits(s, w)
        return
    assert not _fits(s, w) or (gang > 1 and not _gang_fits(s, w, gang))
    sets = [(x,) for x in c.alone] if c.alone else [c.constraints]
    for conflict in sets:
        s2, w2 = _kept(s, w, d, conflict)
        feasible = _gang_fits(s2, w2, gang) if w2.gang else _fits(s2, w2)
        assert not feasible, f"{conflict} admits a node"
        for sub in itertools.combinations(conflict, len(conflict) - 1):
            s3, w3 = _kept(s, w, d, sub)
            ok = _gang_fits(s3, w3, gang) if w3.gang else _fits(s3, w3)
            assert ok, f"{sub} (a strict subset of {conflict}) admits no node"
    for r in d.relaxations:
        s4 = without(s, r.evict)  # the evicted pods gone, their resources freed
        if r.gang_size is not None:
            assert _gang_fits(s4, r.workload, r.gang_size), str(r)
        else:
            probe = dataclasses.replace(r.workload, gang=None)
            assert not validate(s4, [probe], {probe.uid: r.node}), str(r)


def _pod(uid: str, on: str, **kw: object) -> RunningPod:
    return RunningPod(uid, uid, "default", on, **kw)  # type: ignore[arg-type]


def _anti(app: str, key: str = "kubernetes.io/hostname") -> PodAffinityTerm:
    return PodAffinityTerm(LabelSelector({"app": app}), key)


FAR = {("a", "user"): LinkInfo(20, 30, samples=50, age_s=3),
       ("b", "user"): LinkInfo(20, 30, samples=50, age_s=3)}
TWO = [node("a", "eu"), node("b", "eu")]

# (name, snapshot, workload, gang size, kinds of the minimal set, whether each fails alone)
CASES: list[tuple[str, ClusterSnapshot, Workload, int, set[str], bool]] = [
    ("latency", snap(TWO, FAR), wl("p", max_latency_ms=5, latency_to="user"), 1,
     {"latency"}, True),
    ("residency", snap(TWO), wl("p", residency=frozenset({"ch"})), 1, {"residency"}, True),
    ("security", snap(TWO), wl("p", min_security_level=2), 1, {"security"}, True),
    ("node_selector", snap(TWO), wl("p", node_selector={"disk": "ssd"}), 1,
     {"node_selector"}, True),
    ("node_affinity", snap(TWO), wl("p", node_affinity=(NodeSelectorTerm((
        NodeSelectorRequirement("disk", "In", ("ssd",)),)),)), 1, {"node_affinity"}, True),
    ("taint", snap([node("a", taints=(Taint("gpu"),)), node("b", taints=(Taint("gpu"),))]),
     wl("p"), 1, {"taint"}, True),
    ("cpu", snap(TWO), wl("p", requests=Resources(8000, GIB, 0)), 1, {"cpu"}, True),
    ("memory", snap(TWO), wl("p", requests=Resources(100, 16 * GIB, 0)), 1, {"memory"}, True),
    ("gpu", snap(TWO), wl("p", requests=Resources(100, GIB, 1)), 1, {"gpu"}, True),
    ("extended", snap([node("a", extended={"fpga": 1}), node("b")],
                      pods=(_pod("x", "a", extended={"fpga": 1}),)),
     wl("p", extended={"fpga": 1}), 1, {"extended"}, True),
    ("host_port", snap(TWO, pods=(_pod("x", "a", host_ports=(HostPort(80),)),
                                  _pod("y", "b", host_ports=(HostPort(80),)))),
     wl("p", host_ports=(HostPort(80),)), 1, {"host_port"}, True),
    ("pods", snap([node("a", max_pods=1), node("b", max_pods=1)],
                  pods=(_pod("x", "a"), _pod("y", "b"))), wl("p"), 1, {"pods"}, True),
    ("spread", snap(TWO), wl("p", spread=(SpreadConstraint(
        1, "rack", True, LabelSelector({"app": "p"})),)), 1, {"spread"}, True),
    ("pod_anti_affinity", snap(TWO, pods=(_pod("x", "a", labels={"app": "db"}),
                                          _pod("y", "b", labels={"app": "db"}))),
     wl("p", pod_anti_affinity=(_anti("db"),)), 1, {"pod_anti_affinity"}, True),
    ("pod_affinity", snap(TWO), wl("p", pod_affinity=(_anti("cache"),)), 1,
     {"pod_affinity"}, True),
    ("repelled", snap(TWO, pods=(_pod("x", "a", anti_affinity=(_anti("web"),)),
                                 _pod("y", "b", anti_affinity=(_anti("web"),)))),
     wl("p", labels={"app": "web"}), 1, {"repelled"}, True),
    ("gang+cpu", snap([node("a", allocated=Resources(2500, 0, 0)),
                       node("b", allocated=Resources(2500, 0, 0))]),
     wl("p", gang="g"), 3, {"gang", "cpu"}, False),
    ("residency+security", snap([node("a", "eu", security_level=1),
                                 node("b", "ch", security_level=3)]),
     wl("p", residency=frozenset({"eu"}), min_security_level=3), 1,
     {"residency", "security"}, False),
    ("latency+node_selector", snap([node("a"), node("b", labels={"disk": "ssd"})],
                                   {("a", "user"): LinkInfo(2, 3),
                                    ("b", "user"): LinkInfo(20, 40)}),
     wl("p", max_latency_ms=10, latency_to="user", node_selector={"disk": "ssd"}), 1,
     {"latency", "node_selector"}, False),
    ("taint+cpu", snap([node("a", taints=(Taint("gpu"),)),
                        node("b", capacity=Resources(1000, 8 * GIB, 0))]),
     wl("p", requests=Resources(2000, GIB, 0)), 1, {"taint", "cpu"}, False),
    ("anti+memory", snap([node("a"), node("b", capacity=Resources(4000, GIB, 0))],
                         pods=(_pod("x", "a", labels={"app": "db"}),)),
     wl("p", requests=Resources(100, 2 * GIB, 0), pod_anti_affinity=(_anti("db"),)), 1,
     {"pod_anti_affinity", "memory"}, False),
    ("latency+residency+security", snap(
        [node("a", "eu", security_level=1), node("b", "ch", security_level=3),
         node("c", "eu", security_level=3)],
        {("a", "user"): LinkInfo(2, 3), ("b", "user"): LinkInfo(2, 3),
         ("c", "user"): LinkInfo(20, 40)}),
     wl("p", max_latency_ms=10, latency_to="user", residency=frozenset({"eu"}),
        min_security_level=3), 1, {"latency", "residency", "security"}, False),
    ("cpu+host_port+taint", snap(
        [node("a", capacity=Resources(500, 8 * GIB, 0)), node("b"),
         node("c", taints=(Taint("spot", "yes", "NoExecute"),))],
        pods=(_pod("x", "b", host_ports=(HostPort(80),)),)),
     wl("p", host_ports=(HostPort(80),)), 1, {"cpu", "host_port", "taint"}, False),
    ("spread+node_selector", snap(
        [node("a", zone="z1", labels={"disk": "ssd"}), node("b", zone="z2")],
        pods=(_pod("x", "a", labels={"app": "p"}),)),
     wl("p", labels={"app": "p"}, node_selector={"disk": "ssd"}, spread=(SpreadConstraint(
         1, "topology.kubernetes.io/zone", True, LabelSelector({"app": "p"}),
         honor_affinity=False),)), 1, {"spread", "node_selector"}, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_known_minimal_conflict(case: tuple[str, ClusterSnapshot, Workload, int, set[str],
                                            bool]) -> None:
    _, s, w, gang, kinds, alone = case
    GANG[w.uid] = gang
    d = diagnose(s, w, gang_size=gang)
    assert not d.conflict.fits
    assert {c.kind for c in d.conflict.constraints} == kinds, str(d)
    assert bool(d.conflict.alone) == alone
    check_answer(s, w, d, gang)
    if kinds not in ({"pods"}, {"spread"}, {"pod_affinity"}):  # no spec change opens one
        assert d.relaxations, str(d)
    assert d.event_text().startswith("cfnet: ")


def test_latency_suggestion_names_the_link() -> None:
    s = snap([node("zurich-1", "ch"), node("zurich-2", "ch")],
             {("zurich-2", "user-zrh"): LinkInfo(30.0, 33.1, samples=212, age_s=4.0),
              ("zurich-1", "user-zrh"): LinkInfo(30.0, 50.0, samples=12, age_s=300.0)})
    d = diagnose(s, wl("p", max_latency_ms=20, latency_to="user-zrh"))
    assert [str(r) for r in d.relaxations] == [
        "max latency 20 ms -> 34 ms: zurich-2 fits (p95 33.1 ms, 212 samples, 4 s old)"]


def test_stale_link_is_flagged() -> None:
    s = snap([node("a")], {("a", "user"): LinkInfo(10.0, 20.0, samples=5, age_s=300.0)})
    d = diagnose(s, wl("p", max_latency_ms=20, latency_to="user"))
    assert "stale: counted x1.5" in str(d.relaxations[0]), str(d)
    assert "-> 30 ms" in d.relaxations[0].change


def test_residency_and_cpu_suggestions() -> None:
    s = snap([node("zurich-1", "ch"), node("milan-3", "eu", allocated=Resources(800, 0, 0))])
    d = diagnose(s, wl("p", residency=frozenset({"eu"}), requests=Resources(4000, GIB, 0)))
    assert {c.kind for c in d.conflict.constraints} == {"residency", "cpu"}
    assert sorted(str(r) for r in d.relaxations) == [
        "cpu 4 -> 3.2: milan-3 fits (3.2 free)", "residency eu -> eu,ch: zurich-1 fits"]


def test_fitting_pod_has_no_conflict() -> None:
    d = diagnose(snap(TWO), wl("p"))
    assert d.conflict.fits and not d.relaxations and d.event_text() == ""


def test_no_online_node() -> None:
    from cloud_core.placement import Health

    d = diagnose(snap([node("a", health=Health.DOWN)]), wl("p"))
    assert not d.conflict.fits and d.conflict.nodes == 0
    assert "no node is online" in str(d)


# -- property: over generated clusters and pods ---------------------------------------------
from typing import Any  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def cases(draw: Any) -> tuple[ClusterSnapshot, Workload, int]:
    n = draw(st.integers(1, 6))
    nodes = []
    for i in range(n):
        region = draw(st.sampled_from(["eu", "ch", "us"]))
        nodes.append(node(
            f"n{i}", region, f"{region}-{draw(st.sampled_from('xy'))}",
            security_level=draw(st.integers(0, 3)),
            labels={"disk": draw(st.sampled_from(["ssd", "hdd"]))},
            taints=(Taint("gpu"),) if draw(st.integers(0, 3)) == 0 else (),
            capacity=Resources(draw(st.sampled_from([1000, 2000, 4000])), 8 * GIB,
                               draw(st.sampled_from([0, 0, 1]))),
            allocated=Resources(draw(st.sampled_from([0, 500, 1500])), 0, 0),
            max_pods=draw(st.sampled_from([None, None, 1, 3])),
            extended={"fpga": draw(st.integers(0, 1))}))
    links = {(x.name, "user"): LinkInfo(1.0, p95, samples=10, age_s=age)
             for x in nodes if (p95 := draw(st.sampled_from([None, 3.0, 12.0, 30.0])))
             for age in [draw(st.sampled_from([1.0, 100.0]))]}
    pods = tuple(
        RunningPod(f"r{j}", f"r{j}", "default", draw(st.sampled_from(nodes)).name,
                   {"app": draw(st.sampled_from(["db", "web"]))},
                   anti_affinity=(_anti("web"),) if draw(st.integers(0, 3)) == 0 else (),
                   host_ports=(HostPort(80),) if draw(st.booleans()) else (),
                   extended={"fpga": 1} if draw(st.integers(0, 3)) == 0 else {})
        for j in range(draw(st.integers(0, 4))))
    s = snap(nodes, links, pods=pods)
    sla = draw(st.sampled_from([None, 5.0, 15.0]))
    key = draw(st.sampled_from(["kubernetes.io/hostname", "topology.kubernetes.io/zone"]))
    w = wl("p", labels={"app": draw(st.sampled_from(["web", "api"]))},
           requests=Resources(draw(st.sampled_from([500, 1000, 3000])), GIB,
                              draw(st.sampled_from([0, 0, 1]))),
           max_latency_ms=sla, latency_to="user" if sla else None,
           residency=frozenset(draw(st.sets(st.sampled_from(["eu", "ch", "us"]),
                                            max_size=2))),
           min_security_level=draw(st.integers(0, 3)),
           node_selector={"disk": "ssd"} if draw(st.booleans()) else {},
           pod_anti_affinity=(_anti("db", key),) if draw(st.booleans()) else (),
           pod_affinity=(_anti(draw(st.sampled_from(["db", "web"])), key),)
           if draw(st.integers(0, 3)) == 0 else (),
           node_affinity=(NodeSelectorTerm((NodeSelectorRequirement(
               "disk", draw(st.sampled_from(["In", "NotIn"])), ("hdd",)),)),)
           if draw(st.integers(0, 3)) == 0 else (),
           host_ports=(HostPort(80),) if draw(st.booleans()) else (),
           extended={"fpga": 1} if draw(st.integers(0, 2)) == 0 else {},
           spread=(SpreadConstraint(draw(st.integers(1, 2)), "topology.kubernetes.io/zone",
                                    True, LabelSelector({"app": "db"})),)
           if draw(st.integers(0, 2)) == 0 else (),
           gang="g" if draw(st.integers(0, 3)) == 0 else None)
    return s, w, draw(st.integers(2, 4)) if w.gang else 1


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases())
def test_reported_set_is_minimal_and_suggestions_fit(case: tuple[ClusterSnapshot, Workload,
                                                                 int]) -> None:
    s, w, gang = case
    GANG[w.uid] = gang
    d = diagnose(s, w, gang_size=gang)
    check_answer(s, w, d, gang)


def test_explain_extras_show_the_link_of_a_placed_pod() -> None:
    from cloud_core.placement.relax import explain_extras

    s = snap([node("a"), node("b")],
             {("a", "user"): LinkInfo(5.0, 7.5, samples=31, age_s=2.0),
              ("b", "user"): LinkInfo(5.0, 9.0, samples=3, age_s=400.0)})
    w = wl("p", max_latency_ms=20, latency_to="user")
    assert explain_extras(s, w, "a") == {
        "link": "a -> user: p95 7.5 ms, 31 samples, 2 s old",
        "link_figures": {"p95_ms": 7.5, "samples": 31, "age_s": 2.0, "stale": False}}
    assert explain_extras(s, w, "b") == {
        "link": "b -> user: p95 9.0 ms, 3 samples, 400 s old, stale: counted x1.5",
        "link_figures": {"p95_ms": 9.0, "samples": 3, "age_s": 400.0, "stale": True}}
    assert explain_extras(s, wl("q"), "a") == {}
    stuck = explain_extras(s, wl("r", max_latency_ms=5, latency_to="user"), None)
    conflict = stuck["conflict"]
    assert isinstance(conflict, dict) and conflict["kinds"] == ["latency"]
    assert conflict["suggestions"] == [
        "max latency 5 ms -> 8 ms: a fits (p95 7.5 ms, 31 samples, 2 s old)"]
    assert explain_extras(s, wl("s", max_latency_ms=5, latency_to="r1"), "a") == {
        "link": "a -> r1: inside it (0 ms)"}


def test_batch_records_its_lower_bound_and_gap() -> None:
    from cloud_core.placement import place

    loose = place(snap([node("a", price_per_hour=1.0), node("b", price_per_hour=4.0)]),
                  [wl("p"), wl("q")])
    assert loose.stats["gap"] == 0.0 and loose.stats["bound"] == pytest.approx(
        loose.total_cost)  # both fit the cheapest node: the best possible
    # room for one pod on the cheap node: the second pays more than its bound says
    big = Resources(1500, GIB, 0)
    tight = place(snap([node("a", price_per_hour=1.0, capacity=Resources(2000, 8 * GIB, 0)),
                        node("b", price_per_hour=4.0)]),
                  [wl("p", requests=big), wl("q", requests=big)])
    assert sorted(tight.assignments.values()) == ["a", "b"]
    assert 0 < tight.stats["bound"] < tight.total_cost
    assert tight.stats["gap"] == pytest.approx(
        (tight.total_cost - tight.stats["bound"]) / tight.total_cost)


def test_repellers_of_other_namespaces_are_counted_not_named() -> None:
    """The answer goes into the pod's own event: pods of another tenant's namespace that
    repel it are counted, never named; those of its own namespace are named."""
    term = PodAffinityTerm(LabelSelector({"app": "web"}), namespaces=("default",))
    other = RunningPod("x", "secret-db", "tenant-b", "a", anti_affinity=(term,))
    mine = _pod("y", "b", anti_affinity=(_anti("web"),))
    d = diagnose(snap(TWO, pods=(other, mine)), wl("p", labels={"app": "web"}))
    said = " ".join(str(r) for r in d.relaxations)
    assert "tenant-b" not in said and "secret-db" not in said
    assert "pod(s) of other namespaces" in said or "default/y" in said
