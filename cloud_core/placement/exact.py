"""The small-batch exact step: the whole batch as one CP-SAT model over its classes, every
hard rule of the batch in it at once, solved from the engine's answer as a hint.

The engine places a batch in rounds (pod affinity orders them), classes with per-pod rules
(spread, host ports, extended resources, pods per node) pod by pod after the solver's
classes, and gangs are taken back when a route left them partial. Each step is greedy with
respect to the next: capacity the solver's classes take is gone for the pod-by-pod classes,
a pod-affinity round cannot see the rounds after it. On a small batch one model holds them
all: integer counts per (class, node) over the nodes a class may use before the batch
(``cpsat.class_model``: resources, anti-affinity, gangs, cost + penalty x unplaced) plus

* pods per node, extended resources and host ports, the running pods counted;
* required pod affinity: in each term's domain a pod matching every term (a running one, or
  another pod of the batch), unless the pod is the first of its group;
* ``DoNotSchedule`` topology spread on the final state (eligible domains, minDomains).

Solved from a hint that sets every variable (the engine's answer), most pods first, then
least cost. Bounded by work (CP-SAT's deterministic time, one worker, a fixed seed): with
no step budget the same batch gives the same answer on any load. On the Kubernetes path it
runs in what is left of the step's CPU budget (``budget.step_clock``): without presolve,
in rounds, the first with the work that fits in the CPU left, each next from the last
round's answer while the CPU left holds one of at least ``CHUNK``; a wall-clock safety net
stops it on a machine too loaded to give the step its CPU. The engine keeps the answer only
when it places more pods, or as many for less, and ``validate`` finds nothing wrong with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .budget import MIN_WORK, StepClock
from .classes import ClassSpec, integer_costs, objective
from .config import EngineConfig
from .cpsat import ClassModel, class_model
from .filters import selector_matches, term_matches_pod
from .focus import ROUND_SHARE, FocusedRounds, hint_all, round_solver
from .model import RunningPod, SpreadConstraint, Workload
from .prepared import ClusterView, PodIndex, all_ok, as_running, request_vector
from .sequential import BIG, NodeUsage, ports_conflict

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

# Within a step budget (budget.py) the exact step solves in rounds: the first one the work
# that fits in ROUND_SHARE of the CPU left at the step's rate (StepClock.work_per_cpu, the
# slowest rate measured on these models), each next one at the rate the last one ran; none
# with less than CHUNK of work after the first (0.05-0.15 s of CPU on the quality
# benchmark's models: a search that short mostly starts over)
CHUNK = 0.02


@dataclass
class Affinity:
    """One class's required pod affinity: the batch classes matching every term, whether it
    may be the first of its group, and per term its domains and those with a running mate."""

    mates: list[int]
    can_first: bool
    terms: list[tuple[np.ndarray, np.ndarray]]  # (domain id per node, near mask per domain)


@dataclass
class Spread:
    """One class's ``DoNotSchedule`` constraint: eligible nodes' domains, running counts."""

    dom: np.ndarray  # domain id per node, -1 where not eligible
    running: np.ndarray  # matching running pods per domain
    matching: list[int]  # batch classes the selector counts
    max_skew: int
    min_domains: int | None


@dataclass
class ExactInputs:
    """What the model needs, taken from the cluster as it was before the batch."""

    specs: list[ClassSpec]
    usage: NodeUsage
    free0: np.ndarray
    affinity: dict[int, Affinity]
    spreads: dict[int, list[Spread]]


def fits_exact(pods: int, nodes: int, max_pairs: int) -> bool:
    """Whether a batch is small enough for the exact step (pods x nodes pairs)."""
    return pods > 1 and 0 < pods * nodes <= max_pairs


def inputs(pc: ClusterView, reps: Sequence[Workload], counts: Sequence[int],
           free0: np.ndarray) -> ExactInputs:
    """The classes' masks (every filter but pod affinity, the nodes their terms and hard
    spread need carrying the topology key), costs and rules, on ``pc`` as it is now (the
    caller restores the state before the batch first)."""
    masks: list[np.ndarray] = []
    usage = NodeUsage(pc, pc.pods.all())
    for w in reps:
        frs = [fr for fr in pc.filter_results(w, resources=False) if fr.name != "pod_affinity"]
        m = all_ok(frs)
        # a node whose running pods alone leave no pod slot, extended resource or host port
        # for ``w`` is no cell: fewer variables, and a focused round frees only the nodes
        # the class may really use (an FPGA class: the FPGA nodes, not every node)
        room = usage.room(w)
        if room is not None:
            m &= room > 0
        for t in w.pod_affinity:
            m &= pc.ix.domain_ids(t.topology_key)[0] >= 0
        for c in w.spread:
            if c.hard:
                m &= pc.ix.domain_ids(c.topology_key)[0] >= 0
        masks.append(m)
    costs = pc.costs(list(reps), masks)
    specs = [ClassSpec(count=k, req=request_vector(w), mask=m, cost=c, gang=w.gang)
             for w, k, m, c in zip(reps, counts, masks, costs, strict=True)]
    affinity = {ci: _affinity(pc, reps, ci) for ci, w in enumerate(reps) if w.pod_affinity}
    spreads = {ci: [_spread(pc, reps, ci, c) for c in w.spread if c.hard]
               for ci, w in enumerate(reps) if any(c.hard for c in w.spread)}
    return ExactInputs(specs, usage, free0, affinity, spreads)


def _affinity(pc: ClusterView, reps: Sequence[Workload], ci: int) -> Affinity:
    w = reps[ci]
    terms = w.pod_affinity

    def every(ns: str, labels: Mapping[str, str]) -> bool:
        return all(term_matches_pod(t, w.namespace, ns, labels) for t in terms)

    running = [p for p in pc.pods.matching(terms[0], w.namespace) if every(p.namespace, p.labels)]
    mates = [b for b, o in enumerate(reps) if every(o.namespace, o.labels)]
    out = []
    for t in terms:
        dom, names = pc.ix.domain_ids(t.topology_key)
        near = np.zeros(len(names) + 1, dtype=bool)
        for p in running:
            i = pc.ix.pos.get(p.node)
            if i is not None and dom[i] >= 0:
                near[dom[i]] = True
        out.append((dom, near))
    return Affinity(mates, every(w.namespace, w.labels) and not running, out)


def _spread(pc: ClusterView, reps: Sequence[Workload], ci: int, c: SpreadConstraint
            ) -> Spread:
    w = reps[ci]
    by_name = {f.name: f.ok for f in pc.filter_results(w, resources=False)}
    dom_all, names = pc.ix.domain_ids(c.topology_key)
    elig = dom_all >= 0
    if c.honor_affinity:
        elig = elig & by_name["node_selector"] & by_name["node_affinity"]
    if c.honor_taints:
        elig = elig & by_name["taints"]
    dom = np.where(elig, dom_all, -1)
    running = np.zeros(len(names), dtype=np.int64)
    for p in pc.pods.all():
        i = pc.ix.pos.get(p.node)
        if (i is not None and dom[i] >= 0 and not p.terminating
                and p.namespace == w.namespace and selector_matches(c.selector, p.labels)):
            running[dom[i]] += 1
    matching = [b for b, o in enumerate(reps)
                if o.namespace == w.namespace and selector_matches(c.selector, o.labels)]
    return Spread(dom, running, matching, c.max_skew, c.min_domains)


def solve_exact(ex: ExactInputs, reps: Sequence[Workload], domains: Mapping[str, np.ndarray],
                hint: list[list[int]], cfg: EngineConfig, clock: StepClock | None = None,
                stats: dict[str, float] | None = None
                ) -> tuple[list[list[int]], tuple[int, int]] | None:
    """The batch's best placement per class, and its (count, cost) key; None when CP-SAT
    found nothing. Lexicographic: the most pods, then the least cost (the class model's
    objective, cost + penalty x unplaced), with ``exact_workers`` workers. Without a step
    budget in two solves, ``exact_deterministic_time`` of work, then the least cost at that
    count (``exact_cost_deterministic_time``). Within one (``clock``): without presolve, in
    rounds of ``CHUNK`` work, each from the last one's answer, until the engine's CPU
    (``StepClock.end_cpu``) would not hold another, the answer is proven, or the wall-clock
    safety net passes. ``stats["exact_work"]``: the work it took."""
    from ortools.sat.python import cp_model  # lazily, as in cpsat

    clock = clock or StepClock()
    stats = {} if stats is None else stats
    specs = ex.specs
    icost, penalty = integer_costs(specs, cfg.cost_scale)
    cm = class_model(specs, ex.free0, domains, icost, penalty, hint, full_hint=True)
    m, x = cm.model, cm.x
    by_class: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
    by_node: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
    for (ci, n), v in x.items():
        by_class.setdefault(ci, []).append((n, v))
        by_node.setdefault(n, []).append((ci, v))
    _node_rules(m, ex.usage, reps, by_node)
    for ci, aff in ex.affinity.items():
        _affinity_rule(cm, ci, specs, aff, by_class)
    for ci, lst in ex.spreads.items():
        for sp in lst:
            _spread_rule(cm, ci, specs, sp, by_class)
    if clock.limited:
        # focused rounds first, then the whole model from their answer in what is left
        single = [bool(w.host_ports) or any(ci in o for o in c.conflicts.values())
                  for ci, (w, c) in enumerate(zip(reps, specs, strict=True))]
        focused = FocusedRounds(cm, specs, hint, ex.free0, icost, penalty, cfg, clock,
                                single).run(stats)
        if focused is not None:
            hint_all(m, focused[0])
        got = _in_rounds(cm, len(specs), cfg, clock, stats)
        if got is None and focused is not None:
            got = focused[1]
        return None if got is None else (got, key_of(ex, got, cfg.cost_scale))
    s = round_solver(cfg, cfg.exact_deterministic_time, clock)
    status = s.solve(m)
    stats["exact_work"] = s.response_proto.deterministic_time
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    got = cm.placement(s, len(specs))
    count = sum(map(len, got))
    m.clear_hints()  # type: ignore[no-untyped-call]
    for v in x.values():
        m.add_hint(v, s.value(v))
    m.add(sum(x.values()) == count)
    m.minimize(sum(int(icost[ci][n]) * v for (ci, n), v in x.items()))
    s = round_solver(cfg, cfg.exact_cost_deterministic_time, clock)
    status = s.solve(m)
    stats["exact_work"] += s.response_proto.deterministic_time
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        got = cm.placement(s, len(specs))
    return got, (count, objective(specs, icost, 0, got))


def _in_rounds(cm: ClassModel, n_classes: int, cfg: EngineConfig, clock: StepClock,
               stats: dict[str, float]) -> list[list[int]] | None:
    """Solve ``cm`` within the step's CPU (at most ``exact_deterministic_time`` of work in
    all), each round from the last one's answer (every variable hinted). The first round
    gets the work that fits in ``ROUND_SHARE`` of the CPU left at the step's rate
    (``StepClock.work_per_cpu``), so that one search runs as long as the step allows (a
    search cut into short rounds starts over each time, and an answer that only a longer
    search finds is never reached); each next round as much at the rate the last one ran,
    while that is at least ``CHUNK``. A round stops by its work, never by the clock. None
    when no round found an answer."""
    from ortools.sat.python import cp_model

    m = cm.model
    got: list[list[int]] | None = None
    work = 0.0
    rate = clock.work_per_cpu
    while clock.wall_left() > 0.0:
        det = round_work(clock.cpu_left(clock.end_cpu), rate, work, got is None, cfg)
        if det <= 0.0:
            break
        if got is None and det > 2 * CHUNK:
            # a first round of CHUNK measures this model's rate (0.15-0.45 units per CPU
            # second on the quality benchmark's models): the next, the long one, gets
            # the work that fits in the CPU left at that rate, not at the slowest one
            det = CHUNK
        s = round_solver(cfg, det, clock)
        s.parameters.cp_model_presolve = False  # the hint is used as it is, at once
        c0 = clock.cpu()
        status = s.solve(m)
        took = clock.cpu() - c0
        done = s.response_proto.deterministic_time
        work += done
        if took > 0.0 and done > 0.0:
            rate = done / took
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        got = cm.placement(s, n_classes)
        if status == cp_model.OPTIMAL:
            break
        hint_all(m, list(s.response_proto.solution))
    stats["exact_work"] = stats.get("exact_work", 0.0) + work
    return got


def round_work(left: float, rate: float, work: float, first: bool, cfg: EngineConfig
               ) -> float:
    """The work of the exact step's next round (0: no round): ``ROUND_SHARE`` of the CPU
    seconds ``left`` at ``rate`` units per CPU second, within ``exact_deterministic_time``
    less the ``work`` done; none with less than ``step_exact_min_s`` of CPU left, nor after
    the first with less than ``CHUNK`` (a round that short mostly starts the search over)."""
    if left < cfg.step_exact_min_s or work >= cfg.exact_deterministic_time:
        return 0.0
    det = min(ROUND_SHARE * left * rate, cfg.exact_deterministic_time - work)
    if not first and det < CHUNK:
        return 0.0
    return max(det, MIN_WORK)


def key_of(ex: ExactInputs, got: list[list[int]], scale: float) -> tuple[int, int]:
    """(count, integer cost) of a placement per class, as ``solve_exact`` counts them."""
    icost, _ = integer_costs(ex.specs, scale)
    return sum(map(len, got)), objective(ex.specs, icost, 0, got)


def _node_rules(m: cp_model.CpModel, usage: NodeUsage, reps: Sequence[Workload],
                by_node: Mapping[int, list[tuple[int, cp_model.IntVar]]]) -> None:
    """Pods per node, extended resources and host ports (running pods counted)."""
    for n, lst in by_node.items():
        if usage.max_pods[n] < BIG:
            m.add(sum(v for _, v in lst) <= max(int(usage.max_pods[n] - usage.pods[n]), 0))
        names = sorted({k for ci, _ in lst for k in reps[ci].extended})
        for k in names:
            cap, used = usage.extended_use(k)
            m.add(sum(int(reps[ci].extended.get(k, 0)) * v for ci, v in lst
                      if k in reps[ci].extended) <= max(int(cap[n] - used[n]), 0))
        ported = [(ci, v) for ci, v in lst if reps[ci].host_ports]
        taken = usage.ports.get(n, [])
        for j, (ci, v) in enumerate(ported):
            m.add(v <= 1)  # a class's pods share their ports: one of them per node
            if any(ports_conflict(a, b) for a in reps[ci].host_ports for b in taken):
                m.add(v == 0)
            for cj, u in ported[j + 1:]:
                if any(ports_conflict(a, b) for a in reps[ci].host_ports
                       for b in reps[cj].host_ports):
                    m.add(v + u <= 1)


def _in_domain(cm: ClassModel, cells: list[tuple[int, cp_model.IntVar]],
               dom: np.ndarray, count: int) -> dict[int, tuple[cp_model.IntVar, list[
                   cp_model.IntVar]]]:
    """Per domain of ``cells`` (node, var): a literal "some pod there" (hinted) and the
    vars."""
    m = cm.model
    groups: dict[int, list[cp_model.IntVar]] = {}
    for n, v in cells:
        if dom[n] >= 0:
            groups.setdefault(int(dom[n]), []).append(v)
    out = {}
    for d, vs in groups.items():
        b = m.new_bool_var("")
        m.add_hint(b, cm.hint_any(vs))
        m.add(sum(vs) <= count * b)
        m.add(sum(vs) >= 1).only_enforce_if(b)
        out[d] = (b, vs)
    return out


def _affinity_rule(cm: ClassModel, ci: int, specs: Sequence[ClassSpec], aff: Affinity,
                   by_class: Mapping[int, list[tuple[int, cp_model.IntVar]]]) -> None:
    m = cm.model
    own = by_class.get(ci, [])
    if not own:
        return
    self_mate = ci in aff.mates
    first = None
    if aff.can_first:
        total = sum(specs[b].count for b in aff.mates)
        if total <= 1:
            return  # the first of its group whatever the batch does
        first = m.new_bool_var("")
        every = [v for b in aff.mates for _, v in by_class.get(b, [])]
        m.add(sum(every) <= 1).only_enforce_if(first)
        m.add_hint(first, int(sum(cm.hinted.get(v.index, 0) for v in every) <= 1))
    for dom, near in aff.terms:
        mine = _in_domain(cm, own, dom, specs[ci].count)
        for d, (lit, _) in mine.items():
            if near[d]:
                continue
            mates = [v for b in aff.mates for n, v in by_class.get(b, []) if dom[n] == d]
            need = 2 if self_mate else 1  # a pod is not its own mate
            cond = [lit] if first is None else [lit, first.Not()]
            if mates:
                m.add(sum(mates) >= need).only_enforce_if(cond)
            elif first is None:
                m.add(lit == 0)
            else:
                m.add_implication(lit, first)


def _spread_rule(cm: ClassModel, ci: int, specs: Sequence[ClassSpec], sp: Spread,
                 by_class: Mapping[int, list[tuple[int, cp_model.IntVar]]]) -> None:
    m = cm.model
    own = by_class.get(ci, [])
    if not own:
        return
    doms = sorted({int(d) for d in sp.dom if d >= 0})
    cnt: dict[int, cp_model.LinearExprT] = {}
    hinted: dict[int, int] = {}
    for d in doms:
        vs = [v for b in sp.matching for n, v in by_class.get(b, []) if sp.dom[n] == d]
        cnt[d] = sum(vs) + int(sp.running[d])
        hinted[d] = sum(cm.hinted.get(v.index, 0) for v in vs) + int(sp.running[d])
    if not cnt:
        return
    if sp.min_domains is not None and len(cnt) < sp.min_domains:
        low: cp_model.LinearExprT = 0
    else:
        hi = int(sp.running.max(initial=0)) + sum(s.count for s in specs)
        lv = m.new_int_var(0, hi, "")
        m.add_min_equality(lv, list(cnt.values()))
        m.add_hint(lv, min(hinted.values()))
        low = lv
    for d, (lit, _) in _in_domain(cm, own, sp.dom, specs[ci].count).items():
        if d in cnt:
            m.add(cnt[d] <= low + sp.max_skew).only_enforce_if(lit)


def running_after(members: Sequence[Sequence[Workload]], got: Sequence[Sequence[int]],
                  names: Sequence[str], pods0: Sequence[RunningPod]) -> PodIndex:
    """The pod index after the batch placed ``got`` (members in order take the nodes)."""
    out = list(pods0)
    for ci, nodes in enumerate(got):
        for j, n in enumerate(nodes):
            out.append(as_running(members[ci][j], names[n]))
    return PodIndex(out)


__all__ = ["ExactInputs", "fits_exact", "inputs", "key_of", "round_work", "running_after",
           "solve_exact"]
