"""The small-batch exact step (``exact.py``): one CP-SAT model over the whole batch.

The quality benchmark's mixed family (``tools.quality_families.mixed``: pod affinity to a
database's zone, spread, host ports beside running pods, extended resources, gangs) left
pods out that the independent reference places: the rounds, the pod-by-pod classes and the
gang take-back each decide before the next. Seed 2 at 40 pods x 10 nodes: 28 placed before
the exact step, 34 with it, the count the reference proves optimal (``tools.ref_model``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from cloud_core.placement import EngineConfig, place, validate
from cloud_core.placement.exact import fits_exact
from tools.quality_families import mixed

# the Kubernetes path with its step's wall-clock budget off: the exact step's work alone
# bounds it, the same answer on any load (test_placement_budget tests the budget)
K8S = EngineConfig(cpsat_polish=False, step_cpu_max_s=0)


def test_mixed_batch_reaches_the_proven_count() -> None:
    snap, pods = mixed(40, 2)
    res = place(snap, pods, K8S)
    assert len(res.assignments) == 34
    assert "exact" in res.solver
    assert validate(snap, pods, dict(res.assignments), K8S) == []
    # every pod left out is explained, and not by a rule the exact step lifted
    for d in res.unplaced:
        assert d.reasons and d.summary


def test_same_batch_same_placement() -> None:
    snap, pods = mixed(40, 2)
    a = place(snap, pods, K8S)
    b = place(snap, pods, K8S)
    assert dict(a.assignments) == dict(b.assignments)


def test_off_without_cpsat_or_above_its_size() -> None:
    snap, pods = mixed(40, 2)
    off = place(snap, pods, dataclasses.replace(K8S, use_cpsat=False))
    assert "exact" not in off.solver and len(off.assignments) < 34
    small = place(snap, pods, dataclasses.replace(K8S, exact_max_pairs=40 * 10 - 1))
    assert "exact" not in small.solver
    assert not fits_exact(1, 10, 1000) and fits_exact(40, 10, 400)
    assert not fits_exact(40, 10, 399)


def test_the_models_are_cp_sat_models_without_the_camel_case_aliases() -> None:
    """``cpsat.new_model``: a ``CpModel`` that solves as one, without the camelCase aliases
    ``CpModel()`` sets on each instance (a millisecond a model, 50-100 models a step)."""
    from ortools.sat.python import cp_model

    from cloud_core.placement.cpsat import new_model

    m = new_model()
    assert isinstance(m, cp_model.CpModel)
    assert not hasattr(m, "NewIntVar") and hasattr(cp_model.CpModel(), "NewIntVar")
    x = m.new_int_var(0, 5, "x")
    m.add(x <= 3)
    m.maximize(x)
    s = cp_model.CpSolver()
    assert s.solve(m) == cp_model.OPTIMAL and s.value(x) == 3


def test_a_focused_rounds_domains_are_written_where_they_change_and_restored() -> None:
    """``focus.RoundDomains``: cells not free are fixed to the answer's counts, free ones keep
    their built domain [0, top], and ``restore`` gives every cell its domain back. (The
    proto's repeated fields take no negative index: ``domain[-1]`` reads the first value,
    which once fixed every free cell to 0.)"""
    from cloud_core.placement.classes import ClassSpec
    from cloud_core.placement.cpsat import class_model
    from cloud_core.placement.focus import RoundDomains

    free = np.tile(np.array([4000, 8 << 30, 0], dtype=np.int64), (3, 1))
    req = np.array([1000, 1 << 30, 0], dtype=np.int64)
    specs = [ClassSpec(count=3, req=req, mask=np.ones(3, dtype=bool), cost=np.zeros(3)),
             ClassSpec(count=2, req=req, mask=np.array([True, False, True]),
                       cost=np.zeros(3))]
    hint = [[0, 0, 1], [2]]
    cm = class_model(specs, free, {}, [np.zeros(3, dtype=np.int64)] * 2, 10, hint)
    doms = RoundDomains(cm)
    proto = cm.model.proto

    def domains() -> dict[tuple[int, int], list[int]]:
        return {k: list(proto.variables[v.index].domain) for k, v in cm.x.items()}

    built = domains()
    assert built == {(0, 0): [0, 3], (0, 1): [0, 3], (0, 2): [0, 3], (1, 0): [0, 2],
                     (1, 2): [0, 2]}
    val = doms.values(hint)
    free_cells = doms.node == 2  # node 2 free, the rest fixed to the hint
    doms.fix(free_cells, val)
    assert domains() == {(0, 0): [2, 2], (0, 1): [1, 1], (0, 2): [0, 3], (1, 0): [0, 0],
                         (1, 2): [0, 2]}
    doms.fix(doms.node == 0, val)
    assert domains() == {(0, 0): [0, 3], (0, 1): [1, 1], (0, 2): [0, 0], (1, 0): [0, 2],
                         (1, 2): [1, 1]}
    doms.restore()
    assert domains() == built


def _rounds_case(a_cost: list[float]) -> tuple[Any, Any, Any]:
    """Three nodes; node 0 holds one pod, nodes 1 and 2 two. Class A (one pod) prices the
    nodes ``a_cost``, class B (one pod) 1 $/h everywhere. The hint puts A on node 1 and B
    on node 0."""
    from cloud_core.placement.budget import StepClock
    from cloud_core.placement.classes import ClassSpec, integer_costs
    from cloud_core.placement.cpsat import class_model
    from cloud_core.placement.focus import FocusedRounds

    req = np.array([1000, 1 << 30, 0], dtype=np.int64)
    free = np.array([req, 2 * req, 2 * req], dtype=np.int64)
    every = np.ones(3, dtype=bool)
    specs = [ClassSpec(count=1, req=req, mask=every, cost=np.array(a_cost)),
             ClassSpec(count=1, req=req, mask=every, cost=np.ones(3))]
    icost, penalty = integer_costs(specs, 1000.0)
    hint = [[1], [0]]
    cm = class_model(specs, free, {}, icost, penalty, hint, full_hint=True)
    rounds = FocusedRounds(cm, specs, hint, free, icost, penalty, K8S,
                           StepClock(end_cpu=1e9, search_cpu=1e9), [False, False])
    return cm, rounds, hint


@pytest.mark.parametrize(("a_cost", "want"), [
    # A pays 100 on node 1 and 1 on node 0, where B sits: B moves on, A takes its place
    ([1.0, 100.0, 50.0], [[0], [1]]),
    # A pays the least where it is: nothing better, no answer
    ([5.0, 1.0, 5.0], None),
])
def test_cost_rounds_open_room_on_the_cheap_node(a_cost: list[float],
                                                  want: list[list[int]] | None) -> None:
    """``focus.FocusedRounds``: with every pod placed, the cost rounds free the node of the
    pod that pays most above its cheapest, and that node, so that the pod there moves on;
    an answer is kept only when cheaper, and every cell's domain is as built after."""
    cm, rounds, _ = _rounds_case(a_cost)
    proto = cm.model.proto
    built = {k: list(proto.variables[v.index].domain) for k, v in cm.x.items()}
    stats: dict[str, float] = {}
    got = rounds.run(stats)
    assert (None if got is None else [sorted(ns) for ns in got[1]]) == want
    assert stats["exact_focused"] == 0  # no pod out: no count round
    assert stats["exact_cost_rounds"] == (1 if want else 0)
    assert {k: list(proto.variables[v.index].domain) for k, v in cm.x.items()} == built


def test_cost_rounds_leave_a_pod_the_model_has_no_cell_for() -> None:
    """A hint with a pod where its class has no cell (the engine and the model disagree):
    the rounds run and leave it; no error stops the step."""
    from cloud_core.placement.budget import StepClock
    from cloud_core.placement.classes import ClassSpec, integer_costs
    from cloud_core.placement.cpsat import class_model
    from cloud_core.placement.focus import FocusedRounds

    req = np.array([1000, 1 << 30, 0], dtype=np.int64)
    free = np.array([req, req], dtype=np.int64)
    specs = [ClassSpec(count=1, req=req, mask=np.array([True, False]), cost=np.ones(2)),
             ClassSpec(count=1, req=req, mask=np.array([False, False]), cost=np.ones(2))]
    icost, penalty = integer_costs(specs, 1000.0)
    hint = [[0], [1]]  # class 1 may use no node, yet the hint puts its pod on node 1
    cm = class_model(specs, free, {}, icost, penalty, hint, full_hint=True)
    stats: dict[str, float] = {}
    FocusedRounds(cm, specs, hint, free, icost, penalty, K8S,
                  StepClock(end_cpu=1e9, search_cpu=1e9), [False, False]).run(stats)
    assert stats["exact_cost_rounds"] == 0


@pytest.mark.parametrize(("single", "want"), [
    # one pod per node: the cheap nodes its other pods hold are no place for the dear one;
    # the round frees node 3, the cheapest it may still use, and B moves on
    (True, [[0, 1, 2, 3], [4]]),
    # read as a class that may stack: the round frees its three cheapest nodes, where its
    # other pods are, and finds nothing better
    (False, None),
])
def test_cost_rounds_of_a_class_one_per_node(single: bool,
                                             want: list[list[int]] | None) -> None:
    """``focus.FocusedRounds``: class A repels itself per node and holds the three
    cheapest nodes (1 $/h) and node 6 (100 $/h); node 3 (2 $/h) holds B's pod, which may go to
    node 4 at the same price. A cost round for A's dear pod frees the cheapest nodes A does not
    hold yet."""
    from cloud_core.placement.budget import StepClock
    from cloud_core.placement.classes import HOST, ClassSpec, integer_costs
    from cloud_core.placement.cpsat import class_model
    from cloud_core.placement.focus import FocusedRounds

    req = np.array([1000, 1 << 30, 0], dtype=np.int64)
    free = np.array([req] * 7, dtype=np.int64)
    every = np.ones(7, dtype=bool)
    specs = [ClassSpec(count=4, req=req, mask=every,
                       cost=np.array([1.0, 1.0, 1.0, 2.0, 100.0, 100.0, 100.0]),
                       conflicts={HOST: [0]}),
             ClassSpec(count=1, req=req, mask=every,
                       cost=np.array([1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0]))]
    icost, penalty = integer_costs(specs, 1000.0)
    hint = [[0, 1, 2, 6], [3]]
    cm = class_model(specs, free, {HOST: np.arange(7)}, icost, penalty, hint,
                     full_hint=True)
    got = FocusedRounds(cm, specs, hint, free, icost, penalty, K8S,
                        StepClock(end_cpu=1e9, search_cpu=1e9), [single, False]).run({})
    assert (None if got is None else [sorted(ns) for ns in got[1]]) == want
