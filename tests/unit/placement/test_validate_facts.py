"""The validator's kept reading of the nodes (``validate.NodeFacts``): step after step on
changing snapshots, the same violations as a fresh reading, with only the changed nodes read
again."""

from __future__ import annotations

import dataclasses
import random

from cloud_core.placement import NodeFacts, Resources, RunningPod, Workload, validate
from cloud_core.placement.model import LabelSelector, SpreadConstraint, Taint, Toleration
from tests.unit.placement.placement_helpers import node, snap, wl

ZONE = "topology.kubernetes.io/zone"


def _spread_pod(uid: str, group: str) -> Workload:
    c = SpreadConstraint(1, ZONE, True, LabelSelector({"g": group}))
    return wl(uid, namespace="ns", labels={"g": group}, spread=(c,))


def test_only_changed_nodes_are_read_again_and_the_answer_is_a_fresh_one() -> None:
    rng = random.Random(7)
    nodes = [node(f"n{i}", zone=f"z{i % 3}") for i in range(30)]
    pods: list[RunningPod] = []
    facts = NodeFacts()
    spread_tainted = SpreadConstraint(1, ZONE, True, LabelSelector({"g": "b"}),
                                      honor_taints=True)
    for step in range(60):
        # a binding changes one node's allocation (a new object, same facts); now and then a
        # node's zone label moves, a node is tainted, the nodes are renamed or one is added
        i = rng.randrange(len(nodes))
        nodes[i] = dataclasses.replace(nodes[i], allocated=nodes[i].allocated
                                       + Resources(100, 0, 0))
        if step % 7 == 3:
            j = rng.randrange(len(nodes))
            nodes[j] = dataclasses.replace(nodes[j], labels={ZONE: f"z{rng.randrange(5)}"})
        if step % 11 == 5:
            j = rng.randrange(len(nodes))
            nodes[j] = dataclasses.replace(nodes[j], taints=(Taint("t", "", "NoSchedule"),))
        if step == 20:
            nodes.append(node("n-late", zone="z9"))
        if step == 40:
            nodes[0] = dataclasses.replace(nodes[0], name="n-renamed")
        target = nodes[rng.randrange(len(nodes))].name
        group = "ab"[step % 2]
        w = _spread_pod(f"p{step}", group)
        if group == "b":
            w = dataclasses.replace(w, spread=(spread_tainted,),
                                    tolerations=(Toleration("x", "Exists"),))
        s = snap(list(nodes), pods=tuple(pods))
        kept = validate(s, [w], {w.uid: target}, facts=facts)
        assert kept == validate(s, [w], {w.uid: target}), step
        if step not in (0, 20, 40):
            assert facts.reread <= 3, step  # the changed nodes, not all of them
        if not kept:
            pods.append(RunningPod(w.uid, w.uid, "ns", target, labels={"g": group}))
    # the steps met both answers: a skew that fails, a move that holds
    assert 0 < len(pods) < 60


def test_a_spread_skew_is_caught_on_kept_facts() -> None:
    nodes = [node(f"n{i}", zone=f"z{i % 2}") for i in range(4)]
    pods = tuple(RunningPod(f"r{i}", f"r{i}", "ns", "n0", labels={"g": "a"}) for i in range(2))
    facts = NodeFacts()
    w = _spread_pod("new", "a")
    assert validate(snap(nodes, pods=pods), [w], {"new": "n1"}, facts=facts) == []
    bad = validate(snap(nodes, pods=pods), [w], {"new": "n2"}, facts=facts)
    assert [v.constraint for v in bad] == ["topology_spread"]
    # a node moved to the emptier zone: read again, and the same move is now sound
    moved = [*nodes[:3], dataclasses.replace(nodes[3], labels={ZONE: "z0"})]
    assert validate(snap(moved, pods=pods), [w], {"new": "n3"}, facts=facts) == validate(
        snap(moved, pods=pods), [w], {"new": "n3"})
    assert facts.reread == 1


def test_duplicate_names_are_read_afresh_every_time() -> None:
    nodes = [node("a", zone="z0"), node("a", zone="z1"), node("b", zone="z0")]
    facts = NodeFacts()
    w = _spread_pod("new", "a")
    for _ in range(2):
        got = validate(snap(nodes), [w], {"new": "a"}, facts=facts)
        assert got == validate(snap(nodes), [w], {"new": "a"})
        assert facts.reread == len(nodes)
        nodes = [*nodes[:2], dataclasses.replace(nodes[2], allocated=Resources(1, 0, 0))]
