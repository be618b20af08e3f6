"""Evicting pods of lower priority to make room (``preempt.py``), as kube-scheduler's
preemption chooses them: a table of cases whose victims are known by construction, each
suggestion checked again with the validator on the cluster without its victims."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from placement_helpers import GIB, node, snap, wl

from cloud_core.placement import LabelSelector, Resources, RunningPod
from cloud_core.placement.preempt import (
    DisruptionBudget,
    budget_of,
    split_by_budget,
    without,
)
from cloud_core.placement.relax import Relaxation, diagnose
from cloud_core.placement.spec import parse_pod
from cloud_core.placement.validate import validate

Pod = tuple[str, str, int, int, dict[str, str]]  # (name, node, priority, cpu milli, labels)


def _cluster(pods: Sequence[Pod], ns: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """Nodes a and b (4 cpus each) with ``pods`` running, their cpu counted on the node."""
    running = tuple(RunningPod(n, n, (ns or {}).get(n, "default"), on,
                               labels=lb, requests=Resources(cpu, 0, 0), priority=pr)
                    for n, on, pr, cpu, lb in pods)
    used = {m: sum(p.requests.cpu_milli for p in running if p.node == m) for m in "ab"}
    nodes = [node(m, allocated=Resources(used[m], 0, 0)) for m in "ab"]
    return snap(nodes, pods=running)


DB = {"app": "db"}
WEB = {"app": "web"}


def _pdb(allowed: int, sel: LabelSelector | None = LabelSelector(DB),
         disrupted: frozenset[str] = frozenset()) -> DisruptionBudget:
    return DisruptionBudget("default", "pdb", sel, allowed, disrupted)


# (name, running pods, budgets, cpu asked by the pending pod of priority 100,
#  node and victims expected (None: no eviction suggested), budget violations)
CASES: list[tuple[str, list[Pod], list[DisruptionBudget] | None, int,
                  tuple[str, set[str]] | None, int]] = [
    ("one pod of lower priority", [("low", "a", 0, 2000, {}), ("mid", "a", 200, 1000, {}),
                                   ("hi", "b", 500, 3500, {})], [], 3000, ("a", {"low"}), 0),
    ("the more important reprieved first", [("l50", "a", 50, 1000, {}),
                                            ("l10", "a", 10, 1000, {}),
                                            ("l0", "a", 0, 1000, {}), ("hi", "b", 500, 4000, {})],
     [], 2000, ("a", {"l0"}), 0),
    ("equal priority is no victim", [("e", "a", 100, 3500, {}), ("q", "b", 100, 3500, {})],
     [], 3000, None, 0),
    ("a terminating pod is no victim", [("t", "a", 0, 3500, {}), ("q", "b", 500, 3500, {})],
     [], 3000, None, 0),
    ("the node without a budget violation", [("x", "a", 0, 3000, DB), ("y", "b", 0, 3000, WEB)],
     [_pdb(0)], 3000, ("b", {"y"}), 0),
    ("a violation when nothing else makes room", [("x", "a", 0, 3000, DB),
                                                  ("h", "b", 500, 4000, {})],
     [_pdb(0)], 3000, ("a", {"x"}), 1),
    ("violating pods reprieved before the others", [("db1", "a", 0, 1000, DB),
                                                    ("w1", "a", 0, 1000, WEB),
                                                    ("h", "b", 500, 4000, {})],
     [_pdb(0)], 3000, ("a", {"w1"}), 0),
    ("disruptionsAllowed spent one pod at a time", [("db1", "a", 0, 2000, DB),
                                                    ("db2", "a", 0, 2000, DB),
                                                    ("h", "b", 500, 4000, {})],
     [_pdb(1)], 4000, ("a", {"db1", "db2"}), 1),
    ("a pod in disruptedPods is not counted", [("db1", "a", 0, 2000, DB),
                                               ("db2", "a", 0, 2000, DB),
                                               ("h", "b", 500, 4000, {})],
     [_pdb(1, disrupted=frozenset({"db2"}))], 4000, ("a", {"db1", "db2"}), 0),
    ("an empty selector matches no pod", [("x", "a", 0, 3000, DB), ("h", "b", 500, 4000, {})],
     [_pdb(0, LabelSelector())], 3000, ("a", {"x"}), 0),
    ("fewest victims among equals", [("a1", "a", 0, 1500, {}), ("a2", "a", 0, 1500, {}),
                                     ("b1", "b", 0, 3000, {})], [], 3000, ("b", {"b1"}), 0),
    ("lowest priority victims first", [("a1", "a", 50, 3000, {}), ("b1", "b", 10, 3000, {})],
     [], 3000, ("b", {"b1"}), 0),
    ("budgets not known: nothing suggested", [("low", "a", 0, 3000, {}),
                                              ("h", "b", 500, 4000, {})],
     None, 3000, None, 0),
]


def _eviction(d_relaxations: Sequence[Relaxation]) -> Relaxation | None:
    return next((r for r in d_relaxations if r.evict), None)


@pytest.mark.parametrize(("pods", "budgets", "cpu", "want", "violations"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_victims(pods: list[Pod], budgets: list[DisruptionBudget] | None, cpu: int,
                 want: tuple[str, set[str]] | None, violations: int) -> None:
    s = _cluster(pods)
    if any(n == "t" for n, *_ in pods):  # the terminating case
        s = dataclasses.replace(s, pods=tuple(dataclasses.replace(p, terminating=p.uid == "t")
                                              for p in s.pods))
    w = wl("new", requests=Resources(cpu, GIB, 0), priority=100)
    d = diagnose(s, w, budgets=budgets)
    assert {c.kind for c in d.conflict.alone or d.conflict.constraints} == {"cpu"}
    r = _eviction(d.relaxations)
    if want is None:
        assert r is None, str(r)
        return
    assert r is not None, [str(x) for x in d.relaxations]
    assert (r.node, set(r.evict)) == want, str(r)
    assert r.constraint.kind == "cpu"
    said = (f"{violations} against a PodDisruptionBudget" if violations
            else "PodDisruptionBudgets allowing")
    assert said in r.evidence, r.evidence
    n = len(want[1])
    assert f"{n} pod{'s' if n > 1 else ''} of lower priority" in r.evidence
    # the validator agrees: without the victims the pod fits the node named
    assert not validate(without(s, r.evict), [w], {w.uid: r.node})
    # and the resize suggestion is still there beside it
    assert any(x.change.startswith("cpu ") for x in d.relaxations)


def test_text_names_own_namespace_and_counts_others() -> None:
    s = _cluster([("mine", "a", 0, 1500, {}), ("theirs", "a", 0, 1500, {}),
                  ("h", "b", 500, 4000, {})], ns={"theirs": "tenant-b"})
    w = wl("new", requests=Resources(3500, GIB, 0), priority=100)
    d = diagnose(s, w)
    r = _eviction(d.relaxations)
    assert r is not None and set(r.evict) == {"mine", "theirs"}
    assert r.change == "evict default/mine, 1 pod(s) of other namespaces to free 2.5 cpu"
    assert "theirs" not in d.event_text() and "default/mine" in d.event_text()
    assert str(r) == ("evict default/mine, 1 pod(s) of other namespaces to free 2.5 cpu: "
                      "a fits (2 pods of lower priority, PodDisruptionBudgets allowing)")


def test_split_by_budget_keeps_the_order() -> None:
    pods = [RunningPod(n, n, "default", "a", labels=DB) for n in ("p1", "p2", "p3")]
    other_ns = DisruptionBudget("elsewhere", "x", LabelSelector(DB), 0)
    bad, ok = split_by_budget(pods, [_pdb(2), other_ns])
    assert [p.name for p in ok] == ["p1", "p2"] and [p.name for p in bad] == ["p3"]
    unlabelled = [RunningPod("u", "u", "default", "a")]
    assert split_by_budget(unlabelled, [_pdb(0, LabelSelector({}))]) == ([], unlabelled)


def test_budget_of_reads_policy_v1() -> None:
    b = budget_of({"metadata": {"namespace": "ns", "name": "db"},
                   "spec": {"selector": {"matchLabels": {"app": "db"}}},
                   "status": {"disruptionsAllowed": 2, "disruptedPods": {"db-0": "t"}}})
    assert b == DisruptionBudget("ns", "db", LabelSelector({"app": "db"}), 2,
                                 frozenset({"db-0"}))
    assert budget_of({"metadata": {}, "spec": {}, "status": {}}) == \
        DisruptionBudget("", "", None, 0)
    bad_sel = {"spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Nope"}]}}}
    assert budget_of(bad_sel) is None
    assert budget_of({"status": {"disruptionsAllowed": True}}) == \
        DisruptionBudget("", "", None, 0)


def test_priority_read_from_the_pod_spec() -> None:
    pod = {"metadata": {"name": "x", "namespace": "default"},
           "spec": {"priority": 1000, "priorityClassName": "high",
                    "containers": [{"name": "c"}]}}
    assert parse_pod(pod).priority == 1000
    pod["spec"]["priority"] = 2**40  # not an int32: clamped
    assert parse_pod(pod).priority == 2**31 - 1
    pod["spec"]["priority"] = "high"
    assert parse_pod(pod).priority == 0
    w = parse_pod({**pod, "spec": {**pod["spec"], "priority": 7}})
    assert RunningPod.of(w, "a").priority == 7
