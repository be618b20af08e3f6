"""Table-driven tests for every filter: the scalar rule, and the engine's vector form."""

from __future__ import annotations

import math

import numpy as np
import pytest
from placement_helpers import GIB, node, snap, wl

from cloud_core.placement import (
    EngineConfig,
    Health,
    LabelSelector,
    LinkInfo,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    PreparedCluster,
    Resources,
    RunningPod,
    Taint,
    Toleration,
)
from cloud_core.placement.filters import (
    STATIC_FILTERS,
    check_health,
    check_node_affinity,
    check_node_selector,
    check_residency,
    check_resources,
    check_security,
    check_taints,
    requirement_matches,
)
from cloud_core.placement.model import ZONE
from cloud_core.placement.sla import breach, judge


@pytest.mark.parametrize("health,want", [
    (Health.ONLINE, None), (Health.SUSPECT, "node suspect"), (Health.UNREACHABLE,
                                                             "node unreachable"),
    (Health.DOWN, "node down"), (Health.CORDONED, "node cordoned"),
])
def test_health(health: Health, want: str | None) -> None:
    assert check_health(None, health) == want


@pytest.mark.parametrize("residency,region,want", [
    (frozenset(), "eu", None), (frozenset({"eu"}), "eu", None),
    (frozenset({"eu", "us"}), "us", None), (frozenset({"eu"}), "us", "residency"),
])
def test_residency(residency: frozenset[str], region: str, want: str | None) -> None:
    assert check_residency(residency, region) == want


@pytest.mark.parametrize("need,have,want", [
    (0, 0, None), (2, 3, None), (3, 3, None), (3, 2, "security level < 3"),
])
def test_security(need: int, have: int, want: str | None) -> None:
    assert check_security(need, have) == want


@pytest.mark.parametrize("op,values,value,want", [
    ("In", ("a", "b"), "a", True), ("In", ("a",), "c", False), ("In", ("a",), None, False),
    ("NotIn", ("a",), "b", True), ("NotIn", ("a",), "a", False), ("NotIn", ("a",), None, True),
    ("Exists", (), "x", True), ("Exists", (), None, False),
    ("DoesNotExist", (), None, True), ("DoesNotExist", (), "x", False),
    ("Gt", ("3",), "4", True), ("Gt", ("3",), "3", False), ("Gt", ("3",), "x", False),
    ("Lt", ("3",), "2", True), ("Lt", ("3",), None, False),
])
def test_requirement(op: str, values: tuple[str, ...], value: str | None, want: bool) -> None:
    assert requirement_matches(NodeSelectorRequirement("k", op, values), value) is want


@pytest.mark.parametrize("sel,values,want", [
    ((), (), None), ((("a", "1"),), ("1",), None), ((("a", "1"),), ("2",), "node selector"),
    ((("a", "1"),), (None,), "node selector"),
    ((("a", "1"), ("b", "2")), ("1", "2"), None), ((("a", "1"), ("b", "2")), ("1", "3"),
                                                 "node selector"),
])
def test_node_selector(sel: tuple[tuple[str, str], ...], values: tuple[str | None, ...],
                       want: str | None) -> None:
    assert check_node_selector(sel, values) == want


T_A = NodeSelectorTerm((NodeSelectorRequirement("a", "In", ("1",)),))
T_B = NodeSelectorTerm((NodeSelectorRequirement("b", "Exists"),))
T_AB = NodeSelectorTerm((NodeSelectorRequirement("a", "In", ("1",)),
                         NodeSelectorRequirement("b", "Exists")))


@pytest.mark.parametrize("terms,values,want", [
    ((), (), None),
    ((T_A,), ("1",), None), ((T_A,), ("2",), "node affinity"),
    ((T_A, T_B), ("2", "x"), None),  # terms are ORed
    ((T_AB,), ("1", None), "node affinity"),  # expressions are ANDed
    ((T_AB,), ("1", "x"), None),
    ((NodeSelectorTerm(()),), (), "node affinity"),  # an empty term matches nothing
])
def test_node_affinity(terms: tuple[NodeSelectorTerm, ...], values: tuple[str | None, ...],
                       want: str | None) -> None:
    assert check_node_affinity(terms, values) == want


GPU_TAINT = Taint("gpu", "yes", "NoSchedule")


@pytest.mark.parametrize("tols,taints,want", [
    ((), (), None),
    ((), (GPU_TAINT,), "untolerated taint"),
    ((), (Taint("x", "", "PreferNoSchedule"),), None),  # soft taints never filter
    ((Toleration("gpu", "Equal", "yes"),), (GPU_TAINT,), None),
    ((Toleration("gpu", "Equal", "no"),), (GPU_TAINT,), "untolerated taint"),
    ((Toleration("gpu", "Exists"),), (GPU_TAINT,), None),
    ((Toleration("", "Exists"),), (GPU_TAINT, Taint("z", "", "NoExecute")), None),
    ((Toleration("gpu", "Exists", effect="NoExecute"),), (GPU_TAINT,), "untolerated taint"),
])
def test_taints(tols: tuple[Toleration, ...], taints: tuple[Taint, ...],
                want: str | None) -> None:
    assert check_taints(tols, taints) == want


@pytest.mark.parametrize("req,free,want", [
    (Resources(1, 1, 0), Resources(1, 1, 0), None),
    (Resources(2, 1, 0), Resources(1, 1, 0), "insufficient cpu"),
    (Resources(1, 2, 0), Resources(1, 1, 0), "insufficient memory"),
    (Resources(2, 2, 1), Resources(1, 1, 0), "insufficient GPU"),  # GPU reported first
])
def test_resources(req: Resources, free: Resources, want: str | None) -> None:
    assert check_resources(req, free) == want


@pytest.mark.parametrize("sla,p95,want", [
    (None, math.inf, None), (50.0, 10.0, None), (50.0, 50.0, None),
    (50.0, 50.1, "p95 50.1 ms > 50 ms to gw"), (50.0, math.inf, "no latency data to gw"),
    (0.0, 0.0, None), (0.0, 0.5, "p95 0.5 ms > 0 ms to gw"),
])
def test_latency_rule(sla: float | None, p95: float, want: str | None) -> None:
    """One rule (``sla.judge``) for the filter, the score, the validator and the re-planner;
    the reason from the real figures."""
    assert breach(sla, p95, "gw") == want
    assert bool(judge(sla, np.array([p95])).met[0]) is (want is None)


# -- latency through the index: targets, staleness, direction ------------------------------
CFG = EngineConfig(stale_after_s=60, stale_factor=1.5, expire_after_s=600)
LAT_NODES = [node("a", "r1", "z1"), node("b", "r1", "z2"), node("c", "r2", "z3"),
             node("d", "r2", "z3"), node("e", "r3", "z4")]


@pytest.mark.parametrize("links,target,sla,want_ok", [
    # same node as the target: latency 0
    ({}, "a", 1.0, {"a"}),
    # a measured link in either direction counts (RTT is symmetric)
    ({("b", "a"): LinkInfo(5, 9)}, "a", 10.0, {"a", "b"}),
    ({("a", "b"): LinkInfo(5, 9)}, "a", 10.0, {"a", "b"}),
    ({("b", "a"): LinkInfo(5, 11)}, "a", 10.0, {"a"}),
    # stale: 9 ms x 1.5 = 13.5 > 10
    ({("b", "a"): LinkInfo(5, 9, age_s=120)}, "a", 10.0, {"a"}),
    ({("b", "a"): LinkInfo(5, 9, age_s=120)}, "a", 14.0, {"a", "b"}),
    # expired: no data
    ({("b", "a"): LinkInfo(5, 1, age_s=1000)}, "a", 100.0, {"a"}),
    # zone target: members are 0, others take the best link to any member
    ({("a", "c"): LinkInfo(5, 30), ("a", "d"): LinkInfo(5, 8)}, "z3", 10.0, {"a", "c", "d"}),
    # region target
    ({("e", "c"): LinkInfo(5, 8)}, "r2", 10.0, {"c", "d", "e"}),
])
def test_latency_filter(links: dict[tuple[str, str], LinkInfo], target: str, sla: float,
                        want_ok: set[str]) -> None:
    pc = PreparedCluster(snap(LAT_NODES, links), CFG)
    frs = {f.name: f for f in pc.filter_results(wl("w", max_latency_ms=sla,
                                                    latency_to=target))}
    ok = {pc.ix.nodes[i].name for i in np.flatnonzero(frs["latency"].ok)}
    assert ok == want_ok
    for i in np.flatnonzero(~frs["latency"].ok):
        assert frs["latency"].reason(int(i)) in ("no latency data", f"latency > {sla:g} ms")


def test_missing_measurement_is_a_reason_not_a_crash() -> None:
    pc = PreparedCluster(snap(LAT_NODES), CFG)
    w = wl("w", max_latency_ms=10.0, latency_to="nowhere")
    frs = {f.name: f for f in pc.filter_results(w)}
    assert not frs["latency"].ok.any()
    assert frs["latency"].reason(0) == "no latency data"


# -- pod affinity / anti-affinity against running pods --------------------------------------
def _term(app: str, key: str = "kubernetes.io/hostname") -> PodAffinityTerm:
    return PodAffinityTerm(LabelSelector({"app": app}), key)


AFF_NODES = [node("a", "r1", "z1"), node("b", "r1", "z1"), node("c", "r1", "z2")]


@pytest.mark.parametrize("running,w_kw,want_aff,want_anti", [
    # anti-affinity on host: the host with a matching pod is out
    ([("db", "a", ())], {"pod_anti_affinity": (_term("db"),)}, {"a", "b", "c"}, {"b", "c"}),
    # anti-affinity on zone: the whole zone is out
    ([("db", "a", ())], {"pod_anti_affinity": (_term("db", ZONE),)}, {"a", "b", "c"}, {"c"}),
    # symmetric: the running pod's own anti-affinity repels us
    ([("db", "c", (_term("web"),))], {"labels": {"app": "web"}}, {"a", "b", "c"},
     {"a", "b"}),
    # affinity on zone: only the zone with a matching pod
    ([("db", "c", ())], {"pod_affinity": (_term("db", ZONE),)}, {"c"}, {"a", "b", "c"}),
    # affinity with no matching pod anywhere, not self-matching: nowhere
    ([], {"pod_affinity": (_term("db"),)}, set(), {"a", "b", "c"}),
    # first pod of a self-affine group goes anywhere (Kubernetes rule)
    ([], {"pod_affinity": (_term("web"),), "labels": {"app": "web"}}, {"a", "b", "c"},
     {"a", "b", "c"}),
    # another namespace does not count
    ([("db", "a", ())], {"pod_anti_affinity": (_term("db"),), "namespace": "other"},
     {"a", "b", "c"}, {"a", "b", "c"}),
])
def test_pod_affinity(running: list[tuple[str, str, tuple[PodAffinityTerm, ...]]],
                      w_kw: dict[str, object], want_aff: set[str],
                      want_anti: set[str]) -> None:
    pods = tuple(RunningPod(f"p{i}", f"p{i}", "default", nd, {"app": app}, Resources(),
                            anti) for i, (app, nd, anti) in enumerate(running))
    pc = PreparedCluster(snap(AFF_NODES, pods=pods))
    frs = {f.name: f for f in pc.filter_results(wl("w", **w_kw))}
    names = [n.name for n in AFF_NODES]
    assert {names[i] for i in np.flatnonzero(frs["pod_affinity"].ok)} == want_aff
    assert {names[i] for i in np.flatnonzero(frs["pod_anti_affinity"].ok)} == want_anti


def test_vector_form_agrees_with_scalar_form() -> None:
    """The engine's table-lookup evaluation equals calling each static filter per node."""
    nodes = [node(f"n{i}", f"r{i % 3}", security_level=i % 4,
                  labels={"tier": "edge" if i % 2 else "cloud", "disk": str(i % 5)},
                  taints=(GPU_TAINT,) if i % 3 == 0 else (),
                  health=list(Health)[i % 5]) for i in range(30)]
    pc = PreparedCluster(snap(nodes))
    ws = [wl("a"), wl("b", residency=frozenset({"r1"}), min_security_level=2),
          wl("c", node_selector={"tier": "edge"}, tolerations=(Toleration("gpu", "Exists"),)),
          wl("d", node_affinity=(NodeSelectorTerm((NodeSelectorRequirement("disk", "Gt",
                                                                           ("2",)),)),))]
    for w in ws:
        frs = {f.name: f for f in pc.filter_results(w)}
        for f in STATIC_FILTERS:
            for i, nd in enumerate(nodes):
                assert frs[f.name].reason(i) == f(w, nd), (w.uid, f.name, nd.name)


def test_resources_vector_form() -> None:
    nodes = [node("a", capacity=Resources(2000, 2 * GIB, 1)),
             node("b", capacity=Resources(500, 8 * GIB, 0)),
             node("c", capacity=Resources(4000, GIB // 2, 0))]
    pc = PreparedCluster(snap(nodes))
    fr = pc.resources_result(wl("w", requests=Resources(1000, GIB, 1)))
    assert [fr.reason(i) for i in range(3)] == [None, "insufficient GPU", "insufficient GPU"]
    fr = pc.resources_result(wl("w", requests=Resources(1000, GIB, 0)))
    assert [fr.reason(i) for i in range(3)] == [None, "insufficient cpu",
                                                 "insufficient memory"]
