"""Which running pods of lower priority to evict so that a pod short of resources fits.

The rules are kube-scheduler's preemption (``pkg/scheduler/framework/preemption`` and the
``defaultpreemption`` plugin), applied to one node at a time:

* only running pods of strictly lower ``priority`` than the pod are candidates (a pod
  already terminating is not: it is leaving anyway);
* with all of them gone the pod must fit the node's cpu, memory and GPUs, or the node is
  not a candidate;
* the candidates, most important first (higher priority, then name), are split into those
  whose eviction a PodDisruptionBudget forbids and the others (``split_by_budget``: a budget
  of the pod's namespace whose non-empty selector matches its labels, with
  ``disruptionsAllowed`` spent one per pod, pods in its ``disruptedPods`` not counted), and
  as many as possible are *reprieved*, the forbidden ones first: a pod stays when the pod
  still fits without its resources. What is left are the victims;
* among the nodes, the one with the fewest budget violations, then the lowest highest
  victim priority, the lowest sum of victim priorities, the fewest victims, the cheapest.

Pure: no I/O, no clock. ``relax.py`` turns the best plan into a suggestion the validator
has checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cloud_core.errors import SpecError

from .config import EngineConfig
from .conflict import Constraint, Parts, fmt_amount
from .filters import selector_matches
from .model import ClusterSnapshot, LabelSelector, Resources, RunningPod, Workload
from .spec_terms import label_selector
from .validate import validate

MAX_NODES = 32  # candidate nodes whose victims are worked out, cheapest first
TRIES = 3  # plans the validator is asked about, best first
NAMED = 3  # victims named in the text (the pod's own namespace only)
RESOURCES = ("cpu", "memory", "gpu")


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget as preemption reads it (policy/v1)."""

    namespace: str
    name: str
    selector: LabelSelector | None  # None or empty: matches no pod (as preemption reads it)
    allowed: int  # status.disruptionsAllowed
    disrupted: frozenset[str] = field(default_factory=frozenset)  # status.disruptedPods

    def selects(self, p: RunningPod) -> bool:
        sel = self.selector
        if sel is None or not (sel.match_labels or sel.match_expressions) or not p.labels:
            return False
        return p.namespace == self.namespace and selector_matches(sel, p.labels)


def budget_of(obj: Mapping[str, Any]) -> DisruptionBudget | None:
    """A policy/v1 PodDisruptionBudget object as a :class:`DisruptionBudget` (None: not one
    preemption can read, e.g. a selector that does not parse)."""
    md = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(md, Mapping) and isinstance(spec, Mapping) and isinstance(status, Mapping)
    try:
        sel = (label_selector(spec["selector"], "spec.selector")
               if spec.get("selector") is not None else None)
    except SpecError:
        return None
    allowed = status.get("disruptionsAllowed", 0)
    disrupted = status.get("disruptedPods")
    return DisruptionBudget(
        str(md.get("namespace", "")), str(md.get("name", "")), sel,
        allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
        frozenset(str(k) for k in disrupted) if isinstance(disrupted, Mapping) else frozenset())


def split_by_budget(pods: Sequence[RunningPod], budgets: Sequence[DisruptionBudget]
                    ) -> tuple[list[RunningPod], list[RunningPod]]:
    """(violating, not violating), each in the order of ``pods`` (upstream
    ``filterPodsWithPDBViolation``)."""
    left = [b.allowed for b in budgets]
    bad: list[RunningPod] = []
    ok: list[RunningPod] = []
    for p in pods:
        violated = False
        for i, b in enumerate(budgets):
            if not b.selects(p) or p.name in b.disrupted:
                continue
            if left[i] <= 0:
                violated = True
                break
            left[i] -= 1
        (bad if violated else ok).append(p)
    return bad, ok


def _req(r: Any) -> np.ndarray:
    return np.array([r.cpu_milli, r.mem_bytes, r.gpus], dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Victims:
    """Evicting ``pods`` from ``node`` makes room for the pod; ``violations`` of them are
    against a PodDisruptionBudget."""

    node: int  # position in the snapshot's nodes
    pods: tuple[RunningPod, ...]
    violations: int
    cost: float

    def rank(self) -> tuple[int, int, int, int, float]:
        """Upstream ``pickOneNodeForPreemption``'s order (start times, which the snapshot
        lacks, replaced by the node's cost)."""
        prios = [p.priority for p in self.pods]
        return (self.violations, max(prios, default=-(2**31)), sum(prios), len(self.pods),
                self.cost)


def victims_on(w: Workload, room: np.ndarray, pods: Sequence[RunningPod],
               budgets: Sequence[DisruptionBudget], node: int = 0, cost: float = 0.0
               ) -> Victims | None:
    """The victims on one node (``room``: its capacity less what runs there, per cpu,
    memory, GPUs; ``pods``: what runs there), or None when evicting every pod of lower
    priority still leaves no room (upstream ``SelectVictimsOnNode``)."""
    need = _req(w.requests)
    asked = need > 0
    lower = sorted((p for p in pods if p.priority < w.priority and not p.terminating),
                   key=lambda p: (-p.priority, p.namespace, p.name))
    free = room + sum((_req(p.requests) for p in lower), np.zeros(3, dtype=np.int64))
    if not lower or (free[asked] < need[asked]).any():
        return None
    bad, ok = split_by_budget(lower, budgets)
    victims: list[RunningPod] = []
    violations = 0
    for group, violating in ((bad, True), (ok, False)):
        for p in group:
            after = free - _req(p.requests)
            if (after[asked] >= need[asked]).all():
                free = after  # reprieved: it stays
            else:
                victims.append(p)
                violations += violating
    if not victims:
        return None  # it fits without evicting anyone: not a resource conflict here
    return Victims(node, tuple(victims), violations, cost)


def best_victims(w: Workload, room: np.ndarray, on_node: Mapping[int, Sequence[RunningPod]],
                 candidates: np.ndarray, cost: np.ndarray,
                 budgets: Sequence[DisruptionBudget]) -> list[Victims]:
    """Plans for the candidate nodes (positions, ``room[i]`` per cpu, memory, GPUs), best
    first; at most :data:`MAX_NODES` nodes are worked out, those where evicting every pod
    of lower priority makes room, cheapest first."""
    need = _req(w.requests)
    asked = need > 0
    lowsum = np.zeros((len(room), 3), dtype=np.int64)
    for i in candidates.tolist():
        for p in on_node.get(i, ()):
            if p.priority < w.priority and not p.terminating:
                lowsum[i] += _req(p.requests)
    ok = np.zeros(len(room), dtype=bool)
    ok[candidates] = True
    ok &= ((room + lowsum)[:, asked] >= need[asked]).all(axis=1)
    idx = np.flatnonzero(ok)
    idx = idx[np.argsort(cost[idx], kind="stable")][:MAX_NODES]
    plans = [v for i in idx.tolist()
             if (v := victims_on(w, room[i], on_node.get(i, ()), budgets, i, float(cost[i])))
             is not None]
    return sorted(plans, key=Victims.rank)


def without(snapshot: ClusterSnapshot, uids: Sequence[str]) -> ClusterSnapshot:
    """``snapshot`` as if the running pods ``uids`` were gone (their resources freed)."""
    gone = [p for p in snapshot.pods if p.uid in uids]
    if not gone:
        return snapshot
    freed: dict[str, Resources] = {}
    for p in gone:
        freed[p.node] = freed.get(p.node, Resources()) + p.requests
    nodes = tuple(dataclasses.replace(n, allocated=n.allocated - freed[n.name])
                  if n.name in freed else n for n in snapshot.nodes)
    return dataclasses.replace(snapshot, nodes=nodes,
                               pods=tuple(p for p in snapshot.pods if p.uid not in uids))


@dataclass(frozen=True, slots=True)
class Eviction:
    """A checked plan: evicting ``uids`` makes ``node`` fit the pod."""

    node: str
    uids: tuple[str, ...]
    change: str
    evidence: str


def eviction(snap: ClusterSnapshot, parts: Parts, conflict: Sequence[Constraint],
             cost: np.ndarray, cfg: EngineConfig, budgets: Sequence[DisruptionBudget]
             ) -> Eviction | None:
    """For a conflict with a resource part: the best node where evicting pods of lower
    priority makes room (every other part of the pod passing there), checked by the
    validator on ``snap`` without them; None when there is none."""
    kinds = [c.kind for c in conflict if c.kind in RESOURCES]
    w = parts.workload
    if not kinds or not snap.pods:
        return None
    pc = parts.pc
    others = [x for x in parts.masks if x.kind not in (*RESOURCES, "gang")]
    on_node: dict[int, list[RunningPod]] = {}
    for p in snap.pods:
        if (i := pc.ix.pos.get(p.node)) is not None and p.priority < w.priority:
            on_node.setdefault(i, []).append(p)
    room = pc.ix.cap - pc.ix.alloc
    cand = np.flatnonzero(parts.passing(others))
    for v in best_victims(w, room, on_node, cand, cost, budgets)[:TRIES]:
        name = pc.ix.nodes[v.node].name
        uids = tuple(p.uid for p in v.pods)
        if not validate(without(snap, uids), [dataclasses.replace(w, gang=None)],
                        {w.uid: name}, cfg):
            return Eviction(name, uids, _text(w, v, room[v.node], kinds),
                            _evidence(v))
    return None


def _text(w: Workload, v: Victims, room: np.ndarray, kinds: Sequence[str]) -> str:
    """``evict ns/a, ns/b to free 0.8 cpu``; pods of other namespaces counted, never named
    (the answer goes into this pod's event, which its tenant reads)."""
    need = _req(w.requests)
    short = [f"{fmt_amount(k, int(need[r] - room[r]))} {k}"
             for r, k in enumerate(RESOURCES) if k in kinds and need[r] > room[r]]
    own = [f"{p.namespace}/{p.name}" for p in v.pods if p.namespace == w.namespace]
    other = len(v.pods) - len(own)
    said = [*own[:NAMED], *([f"+{len(own) - NAMED} more"] if len(own) > NAMED else []),
            *([f"{other} pod(s) of other namespaces"] if other else [])]
    return f"evict {', '.join(said)} to free {', '.join(short) or 'room'}"


def _evidence(v: Victims) -> str:
    n = len(v.pods)
    budget = ("PodDisruptionBudgets allowing" if not v.violations else
              f"{v.violations} against a PodDisruptionBudget")
    return f"{n} pod{'s' if n > 1 else ''} of lower priority, {budget}"
