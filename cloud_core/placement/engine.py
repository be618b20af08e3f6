"""The batch engine (``PreparedCluster``, over ``prepared.ClusterView``): groups workloads
into classes, places them in rounds (pod affinity orders the rounds) through the solver and,
pod by pod, through ``sequential``, and turns the answer into explained decisions. Pure: no
I/O; the clock only for a small batch's step budget (``budget.step_clock``: the deciding
thread's CPU, a wall-clock safety net).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cloud_core.errors import PlacementError

from . import scores
from .anchors import Deps, anchor_domains, domains_of, followers
from .budget import StepClock, step_clock
from .classes import integer_costs, placeable
from .descent import improve_cost
from .exact import fits_exact, key_of, running_after, solve_exact
from .exact import inputs as exact_inputs
from .explain import Explanation, first_failure_counts, first_failure_examples, summary
from .filters import selector_matches
from .model import Resources, RunningPod, Workload
from .prepared import ClusterView, PodIndex, all_ok, as_running, request_vector
from .repair import repair_count
from .rounds import (
    affinity_deps,
    classes_of,
    ready_classes,
    set_conflicts,
    take_back_partial_gangs,
    waiting_reason,
)
from .sequential import BIG, NodeUsage, needs_sequential, place_classes, pod_by_pod_results
from .solver import ClassSpec, solve
from .validate import validate


@dataclass(frozen=True, slots=True)
class Decision:
    """Where one workload goes (``node`` None: not now), the runner-up and why."""

    workload_uid: str
    node: str | None
    runner_up: str | None
    reasons: tuple[str, ...]
    summary: str
    cost: float | None


@dataclass(frozen=True, slots=True)
class PlacementResult:
    """Decisions in input order, the uid -> node map, total $/hour of the placed workloads."""

    decisions: tuple[Decision, ...]
    assignments: Mapping[str, str]
    total_cost: float
    solver: str
    stats: Mapping[str, float] = field(default_factory=dict)

    def decision(self, uid: str) -> Decision:
        for d in self.decisions:
            if d.workload_uid == uid:
                return d
        raise KeyError(uid)

    @property
    def unplaced(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.node is None)


class PreparedCluster(ClusterView):
    """A snapshot with its indexes built, reusable for many ``place`` calls: the batch
    engine and ``explain`` over a ``ClusterView``."""

    def place(self, workloads: Sequence[Workload], cpu_start: float | None = None
              ) -> PlacementResult:
        """Place a batch together; every workload gets a node or the reason it has none.
        ``cpu_start``: this thread's ``time.thread_time()`` at the step's start (budget.py)."""
        members = classes_of(workloads)
        reps = [g[0] for g in members]
        nclass = len(reps)
        deps = affinity_deps(reps)
        placed_nodes: list[list[int]] = [[] for _ in reps]
        # spread, host ports, extended resources, the spread policy: pod by pod, after
        seq = {ci for ci in range(nclass) if needs_sequential(reps[ci], self.cfg.policy)}
        pending = set(range(nclass)) - seq
        rounds, method, stats = 0, list[str](), dict[str, float]()
        deferred_reason: dict[int, str] = {}
        base_mask: dict[int, np.ndarray] = {}
        batch_cost: dict[int, np.ndarray] = {}
        free0 = self.free.copy()
        start, clock = self._start(len(workloads), cpu_start)
        def run_round(order: list[int], first_only: set[int],
                      restrict: Mapping[int, np.ndarray] | None = None) -> int:
            specs: list[ClassSpec] = []
            masks = [all_ok(self.filter_results(reps[ci], resources=False)) for ci in order]
            # costs only where the class may go: most classes are confined to a few
            # regions, so this skips most of the arithmetic; the round's new ones at once
            todo = [j for j, ci in enumerate(order) if ci not in batch_cost
                    or not np.isfinite(batch_cost[ci][masks[j]]).all()]
            for j, c in zip(todo, self.costs([reps[order[j]] for j in todo],
                                             [masks[j] for j in todo]), strict=True):
                batch_cost[order[j]] = c
            for ci, mask in zip(order, masks, strict=True):
                w = reps[ci]
                base_mask.setdefault(ci, mask)
                cost = batch_cost[ci]
                count = len(members[ci]) - len(placed_nodes[ci])
                if restrict and ci in restrict:
                    mask = mask & restrict[ci]
                specs.append(ClassSpec(count=1 if ci in first_only else count,
                                       req=request_vector(w), mask=mask, cost=cost,
                                       gang=w.gang))
            set_conflicts([reps[ci] for ci in order], specs)
            domains = {k: self.ix.domain_ids(k)[0] for s in specs for k in s.conflicts}
            out = solve(specs, self.free, domains, self.cfg, clock)
            method.append(out.method)
            for k, v in out.stats.items():
                stats[k] = stats.get(k, 0.0) + v
            placed = 0
            for j, ci in enumerate(order):
                for n in out.nodes[j]:
                    w = members[ci][len(placed_nodes[ci])]
                    placed_nodes[ci].append(n)
                    self.free[n] -= specs[j].req
                    self.pods.add(as_running(w, self.ix.nodes[n].name))
                    placed += 1
                if ci not in first_only or not out.nodes[j]:
                    pending.discard(ci)
            return placed

        while pending:
            ready, first_pod_only = ready_classes(reps, pending, deps, self.pods)
            if not ready:
                deferred_reason.update({ci: waiting_reason(reps[ci]) for ci in pending})
                break
            rounds += 1
            # the anchors of waiting classes' pod affinity: one pod per picked domain first
            for ci, where in self._anchors_first(reps, members, placed_nodes, deps,
                                                 ready - first_pod_only, (pending - ready) | seq):
                run_round([ci], {ci}, {ci: where})
            run_round(sorted(ready), first_pod_only)
        # Pods placed in later rounds may open domains for the pod affinity of classes
        # placed earlier: give their leftovers another go until nothing changes.
        for _ in range(3):
            again = [ci for ci in range(nclass) if deps.get(ci) and reps[ci].gang is None
                     and ci not in deferred_reason and ci not in seq
                     and len(placed_nodes[ci]) < len(members[ci])]
            if not again:
                break
            rounds += 1
            if run_round(again, set()) == 0:
                break
        place_classes(self, reps, members, seq, placed_nodes, base_mask, batch_cost,
                      deferred_reason)
        take_back_partial_gangs(self, reps, members, placed_nodes, deferred_reason)
        if start is not None and self._repair(reps, members, seq, placed_nodes, batch_cost,
                                              deferred_reason, *start, stats):
            method.append("eject")
        if start is not None and any(
                len(p) < len(m) for p, m in zip(placed_nodes, members, strict=True)
        ) and self._exact(reps, members, placed_nodes, base_mask, batch_cost, deferred_reason,
                          free0, *start, clock, stats):
            method.append("exact")
            if self._repair(reps, members, seq, placed_nodes, batch_cost, deferred_reason,
                            *start, stats):
                method.append("eject")
        stats.update(rounds=float(rounds), classes=float(nclass))
        result = self._decide(reps, members, placed_nodes, base_mask, batch_cost, free0,
                              deferred_reason, workloads)
        clock.report(stats)
        self._settle(stats, result[2], result[3])
        return PlacementResult(result[0], result[1], result[2],
                               "+".join(dict.fromkeys(method)) or "none", stats)

    def _settle(self, stats: dict[str, float], cost: float, bound: float) -> None:
        """Record the batch's lower bound on the cost of placing the same pods (each at the
        cheapest node that fitted it before the batch, capacity shared by the batch
        ignored) and the gap to it; keep the batch's placements accounted in the prepared
        view (like bind())."""
        stats["bound"] = bound
        stats["gap"] = (cost - bound) / cost if cost > 0 else 0.0
        self.forget_costs()
        self.ix.alloc = self.ix.cap - self.free

    def _anchors_first(self, reps: list[Workload], members: list[list[Workload]],
                       placed_nodes: list[list[int]], deps: Deps, ready: set[int],
                       waiting: set[int]) -> list[tuple[int, np.ndarray]]:
        """(anchor class, node mask) per pod to place first (``anchors.py``): for the ready
        classes that waiting classes follow by required pod affinity, the domains picked by
        weighted coverage of those followers."""
        out: list[tuple[int, np.ndarray]] = []
        # the classes some term may select: a batch without pod affinity skips it all
        anchored = {b for terms in deps.values() for _, ms in terms for b in ms}
        usage: list[NodeUsage] = []  # pod slots, extended resources, ports: counted once
        slots = bool((self.ix.max_pods(BIG) < BIG).any())

        def room(f: Workload) -> np.ndarray | None:
            if not (f.extended or f.host_ports or slots):
                return None
            if not usage:
                usage.append(NodeUsage(self, self.pods.all()))
            return usage[0].room(f)

        for a in sorted(ready & anchored):
            w = reps[a]
            fl = followers(deps, a, waiting)
            left = len(members[a]) - len(placed_nodes[a])
            if not fl or w.gang is not None or left <= 0:
                continue
            by_key: dict[str, list[int]] = {}
            for ci, key in fl:
                by_key.setdefault(key, []).append(ci)
            amask = all_ok(self.filter_results(w, resources=False))
            for key, cis in sorted(by_key.items()):
                dom = self.ix.domain_ids(key)[0]
                follow, covered, per_domain = [], [], []
                for ci in cis:
                    f = reps[ci]
                    # a hard spread over the same key: max_skew pods per domain, as the
                    # domains it may use without an anchor stay empty
                    skews = [c.max_skew for c in f.spread if c.hard and c.topology_key == key
                             and selector_matches(c.selector, f.labels)]
                    per_domain.append(min(skews, default=len(members[ci])))
                    mask = all_ok([fr for fr in self.filter_results(f, resources=False)
                                   if fr.name != "pod_affinity"])
                    follow.append((len(members[ci]) - len(placed_nodes[ci]), mask,
                                   request_vector(f), room(f)))
                    term = next(t for t, ms in deps[ci] if a in ms)
                    covered.append(domains_of(dom, [self.ix.pos.get(p.node, -1) for p in
                                                    self.pods.matching(term, f.namespace)]))
                picks = anchor_domains(amask, request_vector(w), left, dom, self.free,
                                       follow, covered, per_domain)
                out += [(a, dom == d) for d in picks]
                left -= len(picks)
        return out

    def _start(self, pods: int, cpu_start: float | None
               ) -> tuple[tuple[list[RunningPod], np.ndarray] | None, StepClock]:
        """The state before the batch, for the exact step (small batches only, else None),
        and the step's clock (``budget.step_clock``: no limit unless small)."""
        small = self.cfg.use_cpsat and fits_exact(pods, self.ix.n, self.cfg.exact_max_pairs)
        start = (self.pods.all(), self.ix.alloc.copy()) if small else None
        return start, step_clock(self.cfg, small, pods, cpu_start)

    def _repair(self, reps: list[Workload], members: list[list[Workload]], seq: set[int],
                placed_nodes: list[list[int]], costs: dict[int, np.ndarray],
                deferred: dict[int, str], pods0: list[RunningPod], alloc0: np.ndarray,
                stats: dict[str, float]) -> bool:
        """The count repair (``repair.py``) of the pod-by-pod classes' left-out pods; its
        answer stands when ``validate`` finds nothing wrong with it, else the one before."""
        before = ([list(ns) for ns in placed_nodes], self.free.copy(), self.ix.alloc.copy(),
                  self.pods, {ci: c.copy() for ci, c in costs.items()})
        added = repair_count(self, reps, members, seq, placed_nodes, pods0, costs)
        if not added:
            return False
        if self._invalid(pods0, alloc0, members, placed_nodes):
            for ns, old in zip(placed_nodes, before[0], strict=True):
                ns[:] = old
            self.free, self.ix.alloc, self.pods = before[1], before[2], before[3]
            costs.clear()
            costs.update(before[4])
            return False
        stats["repaired"] = float(added)
        for ci in range(len(reps)):
            if len(placed_nodes[ci]) == len(members[ci]):
                deferred.pop(ci, None)
        return True

    def _invalid(self, pods0: list[RunningPod], alloc0: np.ndarray,
                 members: list[list[Workload]], got: list[list[int]]) -> bool:
        """Whether ``validate`` finds anything wrong with the batch's answer ``got`` on the
        cluster as it was before the batch (``pods0``, ``alloc0``)."""
        names = [nd.name for nd in self.ix.nodes]
        nodes = tuple(dataclasses.replace(nd, allocated=Resources(*map(int, a)))
                      for nd, a in zip(self.ix.nodes, alloc0.tolist(), strict=True))
        snap = dataclasses.replace(self.snapshot, nodes=nodes, pods=tuple(pods0))
        batch = [w for m in members for w in m]
        assign = {members[ci][j].uid: names[n] for ci, ns in enumerate(got)
                  for j, n in enumerate(ns)}
        return bool(validate(snap, batch, assign, self.cfg))

    def _exact(self, reps: list[Workload], members: list[list[Workload]],
               placed_nodes: list[list[int]], base: dict[int, np.ndarray],
               costs: dict[int, np.ndarray], deferred: dict[int, str], free0: np.ndarray,
               pods0: list[RunningPod], alloc0: np.ndarray, clock: StepClock,
               stats: dict[str, float]) -> bool:
        """The exact step (``exact.py``) from the batch's answer, within what is left of the
        step's budget (``clock``; skipped when less than ``step_exact_min_s`` of CPU is left,
        or the wall-clock safety net has passed); its answer replaces the batch's when it
        places more pods, or as many for less, and validates."""
        if (clock.cpu_left(clock.end_cpu) < self.cfg.step_exact_min_s
                or clock.wall_left() <= 0.0):
            stats["exact_skipped"] = 1.0
            return False
        t0 = clock.cpu()
        after = self.pods, self.ix.alloc, self.free
        self.pods, self.ix.alloc, self.free = PodIndex(pods0), alloc0, free0.copy()
        try:  # the filters and costs as they were before the batch
            ex = exact_inputs(self, reps, [len(m) for m in members], free0)
        finally:
            self.pods, self.ix.alloc, self.free = after
        set_conflicts(reps, ex.specs)
        domains = {k: self.ix.domain_ids(k)[0] for s in ex.specs for k in s.conflicts}
        if not placeable(ex.specs, free0, placed_nodes, domains):
            # what is left out fits no node on its own, or no domain its anti-affinity to
            # itself leaves: nothing to gain
            return False
        now = key_of(ex, placed_nodes, self.cfg.cost_scale)
        res = solve_exact(ex, reps, domains, placed_nodes, self.cfg, clock, stats)
        stats["exact_cpu_s"] = clock.cpu() - t0
        if res is None or (res[1][0], -res[1][1]) <= (now[0], -now[1]):
            return False
        names = [nd.name for nd in self.ix.nodes]
        nodes = tuple(dataclasses.replace(nd, allocated=Resources(*map(int, a)))
                      for nd, a in zip(self.ix.nodes, alloc0.tolist(), strict=True))
        snap = dataclasses.replace(self.snapshot, nodes=nodes, pods=tuple(pods0))
        batch = [w for m in members for w in m]

        def invalid(got: list[list[int]]) -> bool:
            assign = {members[ci][j].uid: names[n] for ci, ns in enumerate(got)
                      for j, n in enumerate(ns)}
            return bool(validate(snap, batch, assign, self.cfg))

        # the exact step's answer, cut short by the step's CPU, often places more at a
        # higher cost: the cost descent (moves, swaps and chains, the count kept; no
        # CP-SAT, milliseconds) from it, kept where validate agrees (the descent knows
        # resources and anti-affinity, not the per-pod rules the exact model adds)
        got = res[0]
        icost, penalty = integer_costs(ex.specs, self.cfg.cost_scale)
        cheaper = improve_cost(ex.specs, free0, domains, icost, penalty,
                               [list(ns) for ns in got], self.cfg, stats)
        if cheaper != got and not invalid(cheaper):
            got = cheaper
        elif invalid(got):
            return False  # a rule the model states differently: the batch's answer stands
        free = free0.copy()
        for ci, ns in enumerate(got):
            if len(ns) != len(placed_nodes[ci]):
                deferred.pop(ci, None)
            placed_nodes[ci][:] = ns
            base[ci], costs[ci] = ex.specs[ci].mask, ex.specs[ci].cost
            for n in ns:
                free[n] -= ex.specs[ci].req
        self.free = free
        self.pods = running_after(members, got, names, pods0)
        return True

    def _decide(self, reps: list[Workload], members: list[list[Workload]],
                placed_nodes: list[list[int]], base: dict[int, np.ndarray],
                costs: dict[int, np.ndarray], free0: np.ndarray, deferred: dict[int, str],
                workloads: Sequence[Workload]
                ) -> tuple[tuple[Decision, ...], dict[str, str], float, float]:
        names = self.ix.names()
        total = self.ix.n
        usage: list[NodeUsage] = []  # the state after the batch, counted once if needed

        def usage_of() -> NodeUsage:
            if not usage:
                usage.append(NodeUsage(self, self.pods.all()))
            return usage[0]

        by_uid: dict[str, Decision] = {}
        assignments: dict[str, str] = {}
        total_cost = bound = 0.0
        # what fitted before the batch, and the two cheapest nodes there (the runner-up
        # comes from them), for the classes the rounds priced: in blocks of classes
        fits = runners_up([ci for ci in range(len(reps)) if ci in costs and ci in base],
                           [request_vector(w) for w in reps], base, costs, free0)
        for ci, w in enumerate(reps):
            if ci in fits:
                fit0, top = fits[ci]
                cost = costs[ci]
            else:
                cost = costs[ci] if ci in costs else self.cost(w)
                static_ok = base[ci] if ci in base else all_ok(self.filter_results(w, free0))
                req = request_vector(w)
                for r in range(3):
                    if req[r]:
                        static_ok = static_ok & (free0[:, r] >= req[r])
                fit0 = int(static_ok.sum())
                top = two_cheapest(np.where(static_ok, cost, np.inf)[None, :])[0]
            nodes = placed_nodes[ci]
            unplaced: Decision | None = None
            for j, m in enumerate(members[ci]):
                if j < len(nodes):
                    n = nodes[j]
                    c = float(cost[n])
                    total_cost += c
                    bound += min(c, float(cost[top[0]])) if top else c
                    ru = next((t for t in top if t != n), None)
                    if ru is None:
                        why = "no other node fits"
                    elif cost[ru] < c:
                        why = (f"runner-up {names[ru]} is cheaper ({cost[ru]:.5f} $/h) but was "
                               "taken by the batch")
                    else:
                        why = f"runner-up {names[ru]} costs +{cost[ru] - c:.5f} $/h"
                    assignments[m.uid] = names[n]
                    by_uid[m.uid] = Decision(
                        m.uid, names[n], names[ru] if ru is not None else None, (why,),
                        f"placed on {names[n]} ({c:.5f} $/h); {fit0}/{total} nodes fit", c)
                else:
                    if unplaced is None:  # identical for every member of the class
                        unplaced = self._unplaced(m, ci, deferred, top, names, usage_of)
                    by_uid[m.uid] = dataclasses.replace(unplaced, workload_uid=m.uid)
        decisions = tuple(by_uid[w.uid] for w in workloads)
        return decisions, assignments, total_cost, bound

    def _unplaced(self, w: Workload, ci: int, deferred: dict[int, str],
                  top: list[int], names: list[str],
                  usage_of: Callable[[], NodeUsage]) -> Decision:
        # reasons are counted against the state after the batch: what is left now, the
        # constraints checked pod by pod included, each node under its first refusal, as
        # kube-scheduler's "0/5 nodes are available: 3 Insufficient cpu, 2 node(s) didn't
        # have free ports" (the same tally as explain())
        frs = self.filter_results(w)
        fit, counts = first_failure_counts(frs, self.ix.n)
        if fit:  # else every node is refused already: the pod-by-pod checks change nothing
            frs = [*frs, *pod_by_pod_results(self, w, usage_of)]
            fit, counts = first_failure_counts(frs, self.ix.n)
        reasons: list[str] = []
        if ci in deferred:
            reasons.append(deferred[ci])
        if w.gang is not None and fit > 0:
            reasons.append(f"gang {w.gang}: not every member fits at once")
        if not reasons:
            reasons.append("no node satisfies every constraint" if not top
                           else "capacity taken by other workloads of the batch")
        ru = names[top[0]] if top else None
        text = summary(fit, self.ix.n, counts)
        if ci in deferred and fit:  # the nodes fit one by one; the rule that stopped it
            text += f"; {deferred[ci]}"
        return Decision(w.uid, None, ru, tuple(reasons), text, None)

    def explain(self, w: Workload, node: str | None = None, top: int = 3) -> Explanation:
        # the pod-by-pod constraints too: "fits" is never said of a node the validator rejects
        frs = [*self.filter_results(w), *pod_by_pod_results(self, w)]
        fit, counts = first_failure_counts(frs, self.ix.n)
        cost = self.cost(w)
        ok = all_ok(frs)
        cand = np.where(ok, cost, np.inf)
        best = tuple((self.ix.nodes[int(i)].name, float(cand[i]))
                     for i in np.argsort(cand)[:top] if np.isfinite(cand[i]))
        node_reasons: tuple[str, ...] = ()
        breakdown: dict[str, float] = {}
        if node is not None:
            i = self.ix.pos.get(node)
            if i is None:
                raise PlacementError(f"explain: unknown node {node!r}")
            node_reasons = tuple(r for fr in frs if (r := fr.reason(i)) is not None)
            breakdown = self._terms(w, i)
        # Runner-up: the cheapest fitting node that is not the one chosen (or,
        # with none chosen, not the cheapest), with its cost terms to compare.
        first = node if node is not None else (best[0][0] if best else None)
        runner_up = next((self.ix.nodes[int(i)].name for i in np.argsort(cand)[:top + 1]
                          if np.isfinite(cand[i]) and self.ix.nodes[int(i)].name != first), None)
        runner_terms = self._terms(w, self.ix.pos[runner_up]) if runner_up is not None else {}
        examples = first_failure_examples(frs, self.ix.n, [nd.name for nd in self.ix.nodes]) \
            if fit < self.ix.n else ()
        return Explanation(w.uid, self.ix.n, fit, dict(counts), summary(fit, self.ix.n, counts),
                           node, node_reasons, breakdown, best, runner_up, runner_terms,
                           examples)

    def _terms(self, w: Workload, i: int) -> dict[str, float]:
        comp = scores.components(w, self.ix, np.array([i]), self.pod_cost(w))
        return {k: float(v[0]) for k, v in comp.items()}


def runners_up(cis: list[int], reqs: list[np.ndarray], base: Mapping[int, np.ndarray],
                costs: Mapping[int, np.ndarray], free0: np.ndarray
                ) -> dict[int, tuple[int, list[int]]]:
    """Per class ``ci`` of ``cis``: how many nodes fit it before the batch (``base[ci]``
    and room in ``free0``) and its two cheapest of them by ``costs[ci]``, the cheaper
    first -- the same as ``_decide``'s per-class arithmetic (``two_cheapest``), over
    blocks of classes at once (1,762 classes of the 3,000-pod tight benchmark: ~8 numpy
    calls each)."""
    out: dict[int, tuple[int, list[int]]] = {}
    n = max(free0.shape[0], 1)
    block = max(1, (1 << 20) // n)
    for lo in range(0, len(cis), block):
        part = cis[lo:lo + block]
        ok = np.stack([base[ci] for ci in part])
        req = np.stack([reqs[ci] for ci in part])
        for r in range(3):
            ok &= (free0[None, :, r] >= req[:, r, None]) | (req[:, r, None] == 0)
        fit0 = ok.sum(axis=1).tolist()
        tops = two_cheapest(np.where(ok, np.stack([costs[ci] for ci in part]), np.inf))
        for j, ci in enumerate(part):
            out[ci] = (fit0[j], tops[j])
    return out


def two_cheapest(cand: np.ndarray) -> list[list[int]]:
    """Per row of ``cand`` (costs, inf where a node does not fit): its two cheapest
    columns of finite cost, the cheaper first, the lower index first among equal costs.
    Two ``argmin`` passes: a partition (``argpartition``) of a 5,000-node row took ~50 us,
    an ``argmin`` ~1 us (a lone pod's step makes one per class)."""
    k, n = cand.shape
    rows = np.arange(k)
    out: list[list[int]] = [[] for _ in range(k)]
    if n == 0:
        return out
    cand = cand.copy()
    for _ in range(min(2, n)):
        at = cand.argmin(axis=1)
        got = cand[rows, at]
        for j, (i, v) in enumerate(zip(at.tolist(), got.tolist(), strict=True)):
            if math.isfinite(v):
                out[j].append(i)
        cand[rows, at] = np.inf
    return out
