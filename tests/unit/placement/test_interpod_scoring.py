"""Preferred inter-pod (anti-)affinity scored as kube-scheduler's InterPodAffinity plugin.

The table is kubernetes/kubernetes ``pkg/scheduler/framework/plugins/interpodaffinity/
scoring_test.go`` (``TestPreferredAffinity`` and
``TestPreferredAffinityWithHardPodAffinitySymmetricWeight``), case names kept: the pods go
through cfnet's pod parser (``parse_pod``) and the normalised scores (0..100) must equal the
upstream ``expectedList`` node for node. Cases that need ``namespaceSelector`` are not here:
cfnet refuses that field by name (``test_namespace_selector_in_preferred_term_is_refused``);
``IgnorePreferredTermsOfExistingPods`` is not a cfnet option (its "Do not ignore" case is).
Then the engine: one pod at a time and a batch (replicas count for each other).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from placement_helpers import GIB

from cloud_core.errors import SpecError
from cloud_core.placement import ClusterSnapshot, NodeInfo, Resources
from cloud_core.placement.config import EngineConfig
from cloud_core.placement.engine import PreparedCluster
from cloud_core.placement.model import RunningPod
from cloud_core.placement.scores import interpod_scores
from cloud_core.placement.spec import parse_pod
from tests.unit.agreement import fitting_nodes


def _sel(*exprs: tuple[str, str, list[str]]) -> dict[str, Any]:
    return {"matchExpressions": [{"key": k, "operator": op, **({"values": v} if v else {})}
                                 for k, op, v in exprs]}


def _wt(weight: int, sel: dict[str, Any], key: str) -> dict[str, Any]:
    return {"weight": weight, "podAffinityTerm": {"labelSelector": sel, "topologyKey": key}}


PREF = "preferredDuringSchedulingIgnoredDuringExecution"
REQ = "requiredDuringSchedulingIgnoredDuringExecution"
S1 = {"security": "S1"}
S2 = {"security": "S2"}
IN_S1 = _sel(("security", "In", ["S1"]))
IN_S2 = _sel(("security", "In", ["S2"]))
STAY_S1_REGION = {"podAffinity": {PREF: [_wt(5, IN_S1, "region")]}}
STAY_S2_REGION = {"podAffinity": {PREF: [_wt(6, IN_S2, "region")]}}
AFFINITY3 = {"podAffinity": {PREF: [
    _wt(8, _sel(("security", "NotIn", ["S1"]), ("security", "In", ["S2"])), "region"),
    _wt(2, _sel(("security", "Exists", []), ("wrongkey", "DoesNotExist", [])), "region")]}}
HARD_AFFINITY = {"podAffinity": {REQ: [
    {"labelSelector": _sel(("security", "In", ["S1", "value2"])), "topologyKey": "region"},
    {"labelSelector": _sel(("security", "Exists", []), ("wrongkey", "DoesNotExist", [])),
     "topologyKey": "region"}]}}
AWAY_S1_AZ = {"podAntiAffinity": {PREF: [_wt(5, IN_S1, "az")]}}
AWAY_S2_AZ = {"podAntiAffinity": {PREF: [_wt(5, IN_S2, "az")]}}
STAY_S1_REGION_AWAY_S2_AZ = {"podAffinity": {PREF: [_wt(8, IN_S1, "region")]},
                             "podAntiAffinity": {PREF: [_wt(5, IN_S2, "az")]}}
# TestPreferredAffinityWithHardPodAffinitySymmetricWeight's term, without its
# namespaceSelector (refused by cfnet): namespaces "" and subteam2.team2
HARD_POD_AFFINITY = {"podAffinity": {REQ: [
    {"labelSelector": _sel(("service", "In", ["S1"])), "topologyKey": "region",
     "namespaces": ["default", "subteam2.team2"]}]}}

CHINA = {"region": "China"}
INDIA = {"region": "India"}
AZ1 = {"az": "az1"}
AZ2 = {"az": "az2"}
CHINA_AZ1 = {"region": "China", "az": "az1"}

Pod = tuple[str | None, dict[str, str], dict[str, Any] | None]  # (node, labels, affinity)

# (upstream case name, incoming (labels, affinity), existing pods, nodes, expected scores)
CASES: list[tuple[str, tuple[dict[str, str], dict[str, Any] | None], list[Pod],
                  list[tuple[str, dict[str, str]]], list[int]]] = [
    ("all nodes are same priority as Affinity is nil", (S1, None), [],
     [("node1", CHINA), ("node2", INDIA), ("node3", AZ1)], [0, 0, 0]),
    ("Affinity: pod that matches topology key & pods in nodes will get high score comparing "
     "to otherswhich doesn't match either pods in nodes or in topology key",
     (S1, STAY_S1_REGION), [("node1", S1, None), ("node2", S2, None), ("node3", S1, None)],
     [("node1", CHINA), ("node2", INDIA), ("node3", AZ1)], [100, 0, 0]),
    ("All the nodes that have the same topology key & label value with one of them has an "
     "existing pod that match the affinity rules, have the same score",
     ({}, STAY_S1_REGION), [("node1", S1, None)],
     [("node1", CHINA), ("node2", CHINA_AZ1), ("node3", INDIA)], [100, 100, 0]),
    ("Affinity: nodes in one region has more matching pods comparing to other region, so the "
     "region which has more matches will get high score",
     (S1, STAY_S2_REGION),
     [("node1", S2, None), ("node1", S2, None), ("node2", S2, None), ("node3", S2, None),
      ("node4", S2, None), ("node5", S2, None)],
     [("node1", CHINA), ("node2", INDIA), ("node3", CHINA), ("node4", CHINA),
      ("node5", INDIA)], [100, 0, 100, 100, 0]),
    ("Affinity: different Label operators and values for pod affinity scheduling preference, "
     "including some match failures ",
     (S1, AFFINITY3), [("node1", S1, None), ("node2", S2, None), ("node3", S1, None)],
     [("node1", CHINA), ("node2", INDIA), ("node3", AZ1)], [20, 100, 0]),
    ("Affinity symmetry: considered only the preferredDuringSchedulingIgnoredDuringExecution "
     "in pod affinity symmetry",
     (S2, None), [("node1", S1, STAY_S1_REGION), ("node2", S2, STAY_S2_REGION)],
     [("node1", CHINA), ("node2", INDIA), ("node3", AZ1)], [0, 100, 0]),
    ("Affinity symmetry: considered RequiredDuringSchedulingIgnoredDuringExecution in pod "
     "affinity symmetry",
     (S1, None), [("node1", S1, HARD_AFFINITY), ("node2", S2, HARD_AFFINITY)],
     [("node1", CHINA), ("node2", INDIA), ("node3", AZ1)], [100, 100, 0]),
    ("Anti Affinity: pod that does not match existing pods in node will get high score ",
     (S1, AWAY_S1_AZ), [("node1", S1, None), ("node2", S2, None)],
     [("node1", AZ1), ("node2", CHINA)], [0, 100]),
    ("Anti Affinity: pod that does not match topology key & match the pods in nodes will get "
     "higher score comparing to others ",
     (S1, AWAY_S1_AZ), [("node1", S1, None), ("node2", S1, None)],
     [("node1", AZ1), ("node2", CHINA)], [0, 100]),
    ("Anti Affinity: one node has more matching pods comparing to other node, so the node "
     "which has more unmatches will get high score",
     (S1, AWAY_S1_AZ), [("node1", S1, None), ("node1", S1, None), ("node2", S2, None)],
     [("node1", AZ1), ("node2", INDIA)], [0, 100]),
    ("Anti Affinity symmetry: the existing pods in node which has anti affinity match will "
     "get high score",
     (S2, None), [("node1", S1, AWAY_S2_AZ), ("node2", S2, AWAY_S1_AZ)],
     [("node1", AZ1), ("node2", AZ2)], [0, 100]),
    ("Affinity and Anti Affinity: considered only preferredDuringSchedulingIgnoredDuring"
     "Execution in both pod affinity & anti affinity",
     (S1, STAY_S1_REGION_AWAY_S2_AZ), [("node1", S1, None), ("node2", S1, None)],
     [("node1", CHINA), ("node2", AZ1)], [100, 0]),
    ("Affinity and Anti Affinity: considering both affinity and anti-affinity, the pod to "
     "schedule and existing pods have the same labels",
     (S1, STAY_S1_REGION_AWAY_S2_AZ),
     [("node1", S1, None), ("node1", S1, None), ("node2", S1, None), ("node3", S1, None),
      ("node3", S1, None), ("node4", S1, None), ("node5", S1, None)],
     [("node1", CHINA_AZ1), ("node2", INDIA), ("node3", CHINA), ("node4", CHINA),
      ("node5", INDIA)], [100, 0, 100, 100, 0]),
    ("Affinity and Anti Affinity and symmetry: considered only preferredDuringScheduling"
     "IgnoredDuringExecution in both pod affinity & anti affinity & symmetry",
     (S1, STAY_S1_REGION_AWAY_S2_AZ),
     [("node1", S1, None), ("node2", S2, None), ("node3", {}, STAY_S1_REGION_AWAY_S2_AZ),
      ("node4", {}, AWAY_S1_AZ)],
     [("node1", CHINA), ("node2", AZ1), ("node3", INDIA), ("node4", AZ2)],
     [100, 0, 100, 0]),
    ("Avoid panic when partial nodes in a topology don't have pods with affinity",
     (S1, None), [("node1", S1, None), ("node2", {}, STAY_S1_REGION_AWAY_S2_AZ)],
     [("node1", CHINA), ("node2", CHINA)], [0, 0]),
    ("Do not ignore preferred terms of existing pods",
     (S2, None), [("node1", S1, STAY_S1_REGION_AWAY_S2_AZ), ("node2", S2, STAY_S2_REGION)],
     [("node1", CHINA), ("node2", INDIA)], [0, 100]),
    ("No nodes to score", (S2, None), [], [], []),
    # TestPreferredAffinityWithHardPodAffinitySymmetricWeight
    ("with default weight", ({"service": "S1"}, None),
     [("node1", {}, HARD_POD_AFFINITY), ("node2", {}, HARD_POD_AFFINITY)],
     [("node1", CHINA), ("node2", INDIA), ("node3", AZ1)], [100, 100, 0]),
    ("with matching Namespaces", ({"service": "S1"}, None),
     [("node1", {}, HARD_POD_AFFINITY), ("node2", {}, HARD_POD_AFFINITY)],
     [("node1", CHINA), ("node2", INDIA), ("node3", AZ1)], [100, 100, 0]),
]


def _pod(name: str, labels: dict[str, str], affinity: dict[str, Any] | None,
         ns: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if affinity is not None:
        spec["affinity"] = affinity
    return {"kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": spec}


def _snap(pods: list[Pod], nodes: list[tuple[str, dict[str, str]]]) -> ClusterSnapshot:
    running = tuple(RunningPod.of(parse_pod(_pod(f"p{i}", labels, aff)), node)
                    for i, (node, labels, aff) in enumerate(pods))
    return ClusterSnapshot(tuple(NodeInfo(n, "", "", labels=lab) for n, lab in nodes), {},
                           pods=running)


def _scores(incoming: dict[str, Any], pods: list[Pod], nodes: list[tuple[str, dict[str, str]]],
            cfg: EngineConfig | None = None) -> list[int]:
    pc = PreparedCluster(_snap(pods, nodes), cfg)
    raw = pc.interpod_raw(parse_pod(incoming))
    if raw is None:  # kube's Skip: no score differs
        return [0] * len(nodes)
    return [int(x) for x in interpod_scores(raw)]


@pytest.mark.parametrize("name,incoming,pods,nodes,want", CASES, ids=[c[0][:60] for c in CASES])
def test_upstream_preferred_affinity(name: str, incoming: tuple[dict[str, str], Any],
                                     pods: list[Pod], nodes: list[tuple[str, dict[str, str]]],
                                     want: list[int]) -> None:
    assert _scores(_pod("in", *incoming), pods, nodes) == want, name


@pytest.mark.parametrize("name,incoming,pods,nodes,want", CASES, ids=[c[0][:60] for c in CASES])
def test_upstream_cases_explain_agrees_with_the_validator(
        name: str, incoming: tuple[dict[str, str], Any], pods: list[Pod],
        nodes: list[tuple[str, dict[str, str]]], want: list[int]) -> None:
    """Preferences never filter: the incoming pod fits every node of the case, and the engine,
    the validator and ``explain`` say so of each (tests/unit/agreement.py)."""
    w = parse_pod(_pod("in", *incoming))
    assert fitting_nodes(_snap(pods, nodes), w) == {n for n, _ in nodes}, name


@pytest.mark.parametrize("ns,want", [("subteam1.team2", [0, 0, 0]),
                                     ("subteam2.team2", [100, 100, 0])])
def test_upstream_hard_weight_namespaces(ns: str, want: list[int]) -> None:
    """"with no matching namespace" (Skip: all equal) and "with matching Namespaces"."""
    pods: list[Pod] = [("node1", {}, HARD_POD_AFFINITY), ("node2", {}, HARD_POD_AFFINITY)]
    nodes = [("node1", CHINA), ("node2", INDIA), ("node3", AZ1)]
    assert _scores(_pod("in", {"service": "S1"}, None, ns), pods, nodes) == want


def test_upstream_hard_weight_zero() -> None:
    """"with zero weight": hardPodAffinityWeight 0 leaves required terms out (Skip)."""
    pods: list[Pod] = [("node1", {}, HARD_POD_AFFINITY), ("node2", {}, HARD_POD_AFFINITY)]
    nodes = [("node1", CHINA), ("node2", INDIA), ("node3", AZ1)]
    cfg = EngineConfig(hard_pod_affinity_weight=0)
    assert _scores(_pod("in", {"service": "S1"}, None), pods, nodes, cfg) == [0, 0, 0]


def test_normalisation_truncates_like_go() -> None:
    """float64 as NormalizeScore: (29/100)*100 is 28.999... in float64, so 28 (not 29)."""
    raw = np.array([0, 29, 100], dtype=np.int64)
    assert interpod_scores(raw).tolist() == [0, 28, 100]
    assert interpod_scores(raw, np.array([1, 2])).tolist() == [0, 100]


@pytest.mark.parametrize("term,field", [
    ({"weight": 5, "podAffinityTerm": {"labelSelector": IN_S1, "topologyKey": "region",
                                       "namespaceSelector": {}}},
     "podAffinityTerm.namespaceSelector"),
    ({"weight": 5, "podAffinityTerm": {"labelSelector": IN_S1, "topologyKey": "region"},
      "extra": 1}, "extra"),
    ({"weight": 0, "podAffinityTerm": {"labelSelector": IN_S1, "topologyKey": "region"}},
     "weight"),
    ({"weight": "5", "podAffinityTerm": {"labelSelector": IN_S1, "topologyKey": "region"}},
     "weight"),
    ({"weight": 5}, "podAffinityTerm"),
    ({"weight": 5, "podAffinityTerm": {"labelSelector": IN_S1}},
     "podAffinityTerm.topologyKey"),
])
def test_refused_preferred_terms_name_the_field(term: dict[str, Any], field: str) -> None:
    """A preferred term cfnet cannot score as written is refused by name, never scored as if
    the field were absent (upstream "invalid Affinity fails PreScore" is an error too)."""
    with pytest.raises(SpecError) as e:
        parse_pod(_pod("x", {}, {"podAntiAffinity": {PREF: [term]}}))
    assert f"podAntiAffinity.{PREF}[0].{field}" in str(e.value)


def test_namespace_selector_in_preferred_term_is_refused() -> None:
    with pytest.raises(SpecError, match="namespaceSelector"):
        parse_pod(_pod("x", {}, {"podAffinity": {PREF: [
            {"weight": 5, "podAffinityTerm": {"labelSelector": IN_S1, "topologyKey": "region",
                                              "namespaceSelector": {}}}]}}))


# -- the engine ------------------------------------------------------------------------------
HOST = "kubernetes.io/hostname"


def _nodes(n: int) -> tuple[NodeInfo, ...]:
    # node0 the cheapest: cost-first packing puts every pod there unless something says no
    return tuple(NodeInfo(f"n{i}", "r", "z", capacity=Resources(4000, 8 * GIB, 0),
                          price_per_hour=1.0 + i) for i in range(n))


def _replicas(k: int, anti: bool, prefix: str = "web") -> list[Any]:
    aff = {"podAntiAffinity": {PREF: [_wt(100, {"matchLabels": {"app": "web"}}, HOST)]}} \
        if anti else None
    out = []
    for i in range(k):
        p = _pod(f"{prefix}-{i}", {"app": "web"}, aff)
        p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
        out.append(parse_pod(p))
    return out


def test_batch_replicas_spread_with_preferred_anti_affinity() -> None:
    """Batch path: two replicas of one class count for each other (pod by pod) and spread,
    where without the preference they pack on the cheapest node."""
    snap = ClusterSnapshot(_nodes(3), {})
    packed = PreparedCluster(snap).place(_replicas(2, anti=False))
    assert set(packed.assignments.values()) == {"n0"}, packed.assignments
    spread = PreparedCluster(snap).place(_replicas(2, anti=True))
    assert sorted(spread.assignments.values()) == ["n0", "n1"], spread.assignments
    # more replicas than nodes: soft, so all are placed, the surplus where it costs least
    many = PreparedCluster(snap).place(_replicas(5, anti=True))
    assert len(many.assignments) == 5 and set(many.assignments.values()) == {"n0", "n1", "n2"}


def test_one_at_a_time_matches_batch() -> None:
    """One pod per place() call with bind() in between gives the batch's nodes."""
    snap = ClusterSnapshot(_nodes(3), {})
    pc = PreparedCluster(snap)
    got = []
    for w in _replicas(3, anti=True):
        r = pc.place([w])
        got.append(r.assignments[w.uid])
    batch = PreparedCluster(snap).place(_replicas(3, anti=True))
    assert got == [batch.assignments[w.uid] for w in _replicas(3, anti=True)]
    assert sorted(got) == ["n0", "n1", "n2"]


def test_existing_pod_preference_attracts_newcomer_symmetry() -> None:
    """A running pod's preferred affinity for app=cache scores a cache pod towards its node,
    over a cheaper node (cost policy: the weight 0.05 $/h beats a 0.025 $/h price gap)."""
    cache = _pod("cache", {"app": "cache"}, None)
    cache["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    w = parse_pod(cache)
    app = parse_pod(_pod("app", {"app": "x"}, {"podAffinity": {PREF: [
        _wt(10, {"matchLabels": {"app": "cache"}}, HOST)]}}))
    nodes = _nodes(2)
    base = PreparedCluster(ClusterSnapshot(nodes, {})).place([w])
    assert base.assignments[w.uid] == "n0"
    snap = ClusterSnapshot(nodes, {}, pods=(RunningPod.of(app, "n1"),))
    assert PreparedCluster(snap).place([w]).assignments[w.uid] == "n1"
    e = PreparedCluster(snap).explain(w, "n0")
    assert e.breakdown["pod_affinity"] == pytest.approx(0.05)


def test_deterministic() -> None:
    snap = ClusterSnapshot(_nodes(4), {})
    runs = {tuple(sorted(PreparedCluster(snap).place(_replicas(6, anti=True))
                         .assignments.items())) for _ in range(3)}
    assert len(runs) == 1
