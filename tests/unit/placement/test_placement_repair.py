"""The count repair of the pod-by-pod classes (``repair.py``): a left-out pod takes a node
that suits it when pods of the solver's classes there can move elsewhere.

The quality benchmark's mixed family (``tools.quality_families.mixed``) leaves FPGA,
host-port and spread pods out once the solver's classes have taken the cpu of the few
nodes that suit them; seed 4 at 200 pods x 50 nodes places 188 without the exact step and
without the repair, 193 with the repair alone.
"""

from __future__ import annotations

import dataclasses

from cloud_core.placement import (
    ClusterSnapshot,
    EngineConfig,
    LabelSelector,
    PodAffinityTerm,
    Resources,
    Workload,
    place,
    validate,
)
from cloud_core.placement.model import SpreadConstraint
from cloud_core.placement.repair import movable_classes
from tests.unit.placement.placement_helpers import GIB, node, snap, wl
from tools.quality_families import mixed

# the Kubernetes path, no step budget (the same answer on any load) and no work for the
# exact step: what is placed beyond the pod-by-pod pass is the repair's
NO_EXACT = EngineConfig(cpsat_polish=False, step_cpu_max_s=0, exact_deterministic_time=0.0,
                        exact_cost_deterministic_time=0.0)
OFF = dataclasses.replace(NO_EXACT, eject_max_moves=0)
FPGA = "example.com/fpga"


def _two_nodes() -> tuple[ClusterSnapshot, list[Workload]]:
    nodes = [node("fpga", capacity=Resources(2000, 8 * GIB, 0), price_per_hour=1.0,
                  extended={FPGA: 1}),
             node("plain", capacity=Resources(2000, 8 * GIB, 0), price_per_hour=2.0)]
    pods = [wl("web", requests=Resources(1500, GIB, 0)),
            wl("acc", requests=Resources(1000, GIB, 0), extended={FPGA: 1})]
    return snap(nodes), pods


def test_a_pod_of_the_solver_moves_off_the_only_fpga_node() -> None:
    s, pods = _two_nodes()
    off = place(s, pods, OFF)
    assert dict(off.assignments) == {"web": "fpga"}
    on = place(s, pods, NO_EXACT)
    assert dict(on.assignments) == {"web": "plain", "acc": "fpga"}
    assert "eject" in on.solver and on.stats["repaired"] == 1.0
    assert validate(s, pods, dict(on.assignments), NO_EXACT) == []
    assert on.decision("acc").node == "fpga" and not on.unplaced


def test_nothing_to_move_where_the_other_node_has_no_room() -> None:
    s, pods = _two_nodes()
    big = [dataclasses.replace(pods[0], requests=Resources(1500, GIB, 0)),
           wl("filler", requests=Resources(1500, GIB, 0)), pods[1]]
    res = place(s, big, NO_EXACT)
    # both plain pods fit only one per node: moving either leaves it out, not a repair
    assert len(res.assignments) == 2 and "eject" not in res.solver
    assert validate(s, big, dict(res.assignments), NO_EXACT) == []


def test_only_pods_nothing_refers_to_move() -> None:
    sel = LabelSelector({"app": "web"})
    plain = wl("a", labels={"app": "web"})
    spread = wl("b", labels={"app": "x"}, spread=(SpreadConstraint(1, "zone", True, sel),))
    anti = wl("c", labels={"app": "y"}, pod_anti_affinity=(PodAffinityTerm(sel),))
    gang = wl("d", gang="g")
    free = wl("e", labels={"app": "z"})
    reps = [plain, spread, anti, gang, free]
    # a is selected by b's spread and c's anti-affinity; c has anti-affinity; d is a gang;
    # b is pod by pod
    assert movable_classes(reps, {1}) == {4}
    assert movable_classes([plain, free], set()) == {0, 1}


def test_mixed_family_places_more_and_validates() -> None:
    s, pods = mixed(200, 4)
    off = place(s, pods, OFF)
    on = place(s, pods, NO_EXACT)
    assert len(off.assignments) == 189
    assert len(on.assignments) == 194 and on.stats["repaired"] == 5.0
    assert validate(s, pods, dict(on.assignments), NO_EXACT) == []
    # the pods placed before stay placed: the repair only moves them
    assert set(off.assignments) <= set(on.assignments)
