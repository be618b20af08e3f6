"""A step prepared on the last step's indexes (``placement.carry``) decides as a fresh
preparation does: a run of steps, each placing a few pods on the snapshot the last left
(allocation and pods changed), gives the same answers with and without the carry."""

from __future__ import annotations

import dataclasses
import random

from cloud_core.placement import (
    Carry,
    ClusterSnapshot,
    EngineConfig,
    LabelSelector,
    LinkInfo,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Resources,
    RunningPod,
    Taint,
    Toleration,
    Workload,
    place,
)
from tests.unit.placement.placement_helpers import GIB, node, snap

ZONE = "topology.kubernetes.io/zone"


def _cluster() -> ClusterSnapshot:
    nodes = [node(f"n{i:02d}", region=f"r{i % 3}", zone=f"r{i % 3}-{i % 2}",
                  labels={"tier": "edge" if i % 4 == 0 else "core", ZONE: f"r{i % 3}-{i % 2}"},
                  taints=(Taint("edge", "", "NoSchedule"),) if i % 4 == 0 else (),
                  price_per_hour=1.0 + (i % 5) / 10, max_pods=6)
             for i in range(24)]
    return snap(nodes)


def _pod(rng: random.Random, i: int) -> Workload:
    kind = i % 5
    kw: dict[str, object] = {"requests": Resources(250 * (1 + i % 3), GIB // 2, 0),
                             "labels": {"app": f"a{i % 3}"}}
    if kind == 1:
        kw["node_affinity"] = (NodeSelectorTerm((NodeSelectorRequirement(
            "tier", "In", ("core",)),)),)
    elif kind == 2:
        kw["tolerations"] = (Toleration("edge", "Exists", "", "NoSchedule"),)
    elif kind == 3:
        kw["pod_anti_affinity"] = (PodAffinityTerm(
            LabelSelector({"app": f"a{i % 3}"}), ZONE),)
    elif kind == 4:
        kw["node_selector"] = {"tier": rng.choice(["edge", "core"])}
    return Workload(f"p{i}", f"p{i}", **kw)  # type: ignore[arg-type]


def _bound(s: ClusterSnapshot, ws: list[Workload], got: dict[str, str]) -> ClusterSnapshot:
    """``s`` with ``got`` running: new NodeInfo objects only for the nodes that took one."""
    extra: dict[str, Resources] = {}
    pods = list(s.pods)
    for w in ws:
        n = got.get(w.uid)
        if n:
            extra[n] = extra.get(n, Resources()) + w.requests
            pods.append(RunningPod.of(w, n))
    nodes = tuple(dataclasses.replace(nd, allocated=nd.allocated + extra[nd.name])
                  if nd.name in extra else nd for nd in s.nodes)
    return dataclasses.replace(s, nodes=nodes, pods=tuple(pods))


def test_steps_on_the_carried_indexes_decide_as_fresh_ones() -> None:
    rng = random.Random(7)
    cfg = EngineConfig()
    carry = Carry()
    s = _cluster()
    i = 0
    for step in range(30):
        ws = [_pod(rng, i + k) for k in range(1 + step % 3)]
        i += len(ws)
        fresh = place(s, ws, cfg)
        kept = place(s, ws, cfg, carry=carry, facts="facts-1")
        assert kept.assignments == fresh.assignments, step
        assert [d.summary for d in kept.decisions] == [d.summary for d in fresh.decisions]
        s = _bound(s, ws, dict(fresh.assignments))
    assert carry.taken == 29  # every step after the first took the last one's indexes


def test_links_that_move_between_steps_are_read_from_each_snapshot() -> None:
    """The token is about the nodes: the links' ages move with every report, and a latency
    bound is judged on each step's own links."""
    cfg = EngineConfig()
    carry = Carry()
    s = _cluster()
    names = [n.name for n in s.nodes]
    for step in range(12):
        # the link from every node to n00 slows by turns: the bound admits a different set
        links = {(n, "n00"): LinkInfo(5.0, 5.0 + 10.0 * ((i + step) % 4), age_s=step)
                 for i, n in enumerate(names[1:])}
        s = dataclasses.replace(s, links=links)
        ws = [Workload(f"l{step}-{k}", f"l{step}-{k}", requests=Resources(100, GIB // 8, 0),
                       max_latency_ms=20.0, latency_to="n00") for k in range(2)]
        fresh = place(s, ws, cfg)
        kept = place(s, ws, cfg, carry=carry, facts="same nodes")
        assert kept.assignments == fresh.assignments, step
        assert [d.summary for d in kept.decisions] == [d.summary for d in fresh.decisions]
        s = _bound(s, ws, dict(fresh.assignments))
    assert carry.taken == 11


def test_a_new_token_or_config_prepares_afresh() -> None:
    carry = Carry()
    s = _cluster()
    w = Workload("a", "a", requests=Resources(100, GIB, 0))
    place(s, [w], EngineConfig(), carry=carry, facts=1)
    place(s, [w], EngineConfig(), carry=carry, facts=2)
    place(s, [w], dataclasses.replace(EngineConfig(), policy="spread"), carry=carry, facts=2)
    place(s, [w], EngineConfig(), carry=carry, facts=None)
    place(s, [w], EngineConfig(), carry=carry, facts=None)
    assert carry.taken == 0
    # a node renamed under the same token (a caller's broken promise) is not taken either
    other = dataclasses.replace(s, nodes=(dataclasses.replace(s.nodes[0], name="zz"),
                                          *s.nodes[1:]))
    place(s, [w], EngineConfig(), carry=carry, facts=3)
    got = place(other, [w], EngineConfig(), carry=carry, facts=3)
    assert carry.taken == 0
    assert got.assignments == place(other, [w], EngineConfig()).assignments
