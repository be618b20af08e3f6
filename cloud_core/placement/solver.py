"""The global solver -- the only module that imports OR-Tools.

Works on *classes* of identical workloads (``ClassSpec``) against node arrays:

1. **Min-cost flow** over class -> node arcs (``ortools.graph.python.min_cost_flow``). It is
   exact when the constraints decompose: one resource shape per node, anti-affinity only
   within a class (a unit-capacity arc per host, or a unit-capacity hub per zone/region).
2. **Exact packing** (``Packer``) replays the flow, pod by pod, checking every resource and
   every cross-class anti-affinity; what over-packs or clashes is rejected and the flow is
   re-solved for the rejected pods on the residual capacity (a few rounds); a
   cheapest-feasible fill places the rest, and gangs are made all-or-nothing. This is the
   feasible warm start.
3. **CP-SAT** when the batch is coupled (several shapes on one node, cross-class
   anti-affinity, gangs) and small enough (``cpsat_max_arcs``): class-level integer counts,
   the warm start as a hint, a time limit; its answer replaces the warm start only if better.

``solve_exact_pods`` is a pod-level CP-SAT model used as the reference optimum by tests
and the benchmark.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from ortools.graph.python import min_cost_flow

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

from .config import EngineConfig

HOST = "kubernetes.io/hostname"


@dataclass
class ClassSpec:
    """One equivalence class of workloads in a round: identical requests and constraints."""

    count: int
    req: np.ndarray  # (3,) int64: cpu_milli, mem_bytes, gpus
    mask: np.ndarray  # (N,) bool: passes every filter except batch resources/conflicts
    cost: np.ndarray  # (N,) float64 $/hour per pod
    # classes this one may not share a domain with, per topology key (self included if so)
    conflicts: dict[str, list[int]] = field(default_factory=dict)
    gang: str | None = None


@dataclass
class SolveOutput:
    """Per class, the node index of each placed pod (with repetition); how it was found."""

    nodes: list[list[int]]
    method: str
    stats: dict[str, float]


def capacity_per_node(req: np.ndarray, free: np.ndarray) -> np.ndarray:
    """How many pods of shape ``req`` fit on each node's free resources (int64)."""
    pos = req > 0
    if not pos.any():
        return np.full(free.shape[0], 1 << 40, dtype=np.int64)
    return np.maximum((free[:, pos] // req[pos]).min(axis=1), 0).astype(np.int64)


class Packer:
    """Exact incremental state: free resources and blocked anti-affinity domains."""

    def __init__(self, free: np.ndarray, domains: Mapping[str, np.ndarray],
                 classes: Sequence[ClassSpec]) -> None:
        self.free = free.copy()
        self.domains = domains
        self.classes = classes
        self.blocked: list[dict[str, np.ndarray]] = []
        for c in classes:
            self.blocked.append({k: np.zeros(int(domains[k].max(initial=-1)) + 2, dtype=bool)
                                 for k in c.conflicts})
        # who must be told when a pod of class s lands: (class c, key) with s in c's conflicts
        self.watchers: list[list[tuple[int, str]]] = [[] for _ in classes]
        for ci, c in enumerate(classes):
            for k, others in c.conflicts.items():
                for s in others:
                    self.watchers[s].append((ci, k))

    def ok(self, ci: int, n: int) -> bool:
        c = self.classes[ci]
        if not c.mask[n]:
            return False
        f = self.free[n]
        r = c.req
        if r[0] > f[0] or r[1] > f[1] or r[2] > f[2]:
            return False
        for k, bl in self.blocked[ci].items():
            d = self.domains[k][n]
            if d >= 0 and bl[d]:
                return False
        return True

    def put(self, ci: int, n: int) -> None:
        self.free[n] -= self.classes[ci].req
        for c2, k in self.watchers[ci]:
            d = self.domains[k][n]
            if d >= 0:
                self.blocked[c2][k][d] = True

    def candidates(self, ci: int) -> np.ndarray:
        c = self.classes[ci]
        cand = c.mask.copy()
        for r in range(3):  # column by column: no (N, 3) temporary, skip zero requests
            if c.req[r]:
                cand &= self.free[:, r] >= c.req[r]
        for k, bl in self.blocked[ci].items():
            d = self.domains[k]
            cand &= ~(bl[d] & (d >= 0))
        return cand


def _penalty(classes: Sequence[ClassSpec], scale: float) -> tuple[list[np.ndarray], int]:
    """Integer costs and an unplaced penalty larger than any total cost (placing first)."""
    icost = [np.round(np.where(np.isfinite(c.cost), c.cost, 0.0) * scale).astype(np.int64)
             for c in classes]
    mx = max((int(ic[c.mask].max(initial=0)) for ic, c in zip(icost, classes, strict=True)),
             default=0)
    total = sum(c.count for c in classes)
    return icost, (mx + 1) * (total + 1)


def _flow(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
          icost: list[np.ndarray], penalty: int, cfg: EngineConfig
          ) -> tuple[list[list[int]], int, list[bool]]:
    """Min-cost flow over class -> node arcs; per class the cheapest nodes that can hold
    ``flow_arc_slack`` x its pods (at least ``flow_min_arcs``) -- the rest is pruned, and a
    later residual round or the fill reaches it if the cheap nodes run out."""
    n_nodes = free.shape[0]
    nc = len(classes)
    sink = nc + n_nodes
    next_id = sink + 1
    tails: list[np.ndarray] = []
    heads: list[np.ndarray] = []
    caps: list[np.ndarray] = []
    costs: list[np.ndarray] = []
    kcn_max = np.zeros(n_nodes, dtype=np.int64)
    meaning: list[tuple[int, int, np.ndarray]] = []
    pruned = [False] * nc
    n_arcs = 0

    def add(t: np.ndarray, h: np.ndarray, cap: np.ndarray, cost: np.ndarray) -> int:
        nonlocal n_arcs
        tails.append(t.astype(np.int32))
        heads.append(h.astype(np.int32))
        caps.append(cap.astype(np.int64))
        costs.append(cost.astype(np.int64))
        start = n_arcs
        n_arcs += len(t)
        return start

    for ci, c in enumerate(classes):
        k = capacity_per_node(c.req, free)
        idx = np.flatnonzero(c.mask & (k > 0))
        if idx.size == 0:
            continue
        k_node = k[idx]  # what the node holds of this shape: its share of the sink arc
        k = np.minimum(k_node, c.count)
        self_keys = [key for key, others in c.conflicts.items() if ci in others]
        if HOST in self_keys:
            k = np.minimum(k, 1)
        want = max(int(cfg.flow_arc_slack * c.count), cfg.flow_min_arcs)
        if idx.size > want:
            # keep the cheapest nodes whose capacity covers ``want`` pods
            cst = icost[ci][idx]
            order = np.argsort(cst, kind="stable")
            cum = np.cumsum(k[order])
            keep = int(np.searchsorted(cum, want)) + 1
            keep = max(keep, min(cfg.flow_min_arcs, idx.size))
            if keep < idx.size:
                sel = np.sort(order[:keep])
                idx, k, k_node = idx[sel], k[sel], k_node[sel]
                pruned[ci] = True
        np.maximum.at(kcn_max, idx, k_node)
        wide = [key for key in self_keys if key != HOST]
        if wide:
            # one unit-capacity hub per domain: at most one pod of the class per zone/region
            dom = domains[wide[0]][idx]
            keep_d = dom >= 0
            idx, dom, k = idx[keep_d], dom[keep_d], np.minimum(k[keep_d], 1)
            uniq, inv = np.unique(dom, return_inverse=True)
            hubs = next_id + np.arange(uniq.size)
            next_id += uniq.size
            add(np.full(uniq.size, ci), hubs, np.ones(uniq.size), np.zeros(uniq.size))
            s = add(hubs[inv], nc + idx, k, icost[ci][idx])
        else:
            s = add(np.full(idx.size, ci), nc + idx, k, icost[ci][idx])
        meaning.append((s, ci, idx))
    used = np.flatnonzero(kcn_max > 0)
    add(nc + used, np.full(used.size, sink), kcn_max[used], np.zeros(used.size))
    counts = np.array([c.count for c in classes], dtype=np.int64)
    add(np.arange(nc), np.full(nc, sink), counts, np.full(nc, penalty))
    mcf = min_cost_flow.SimpleMinCostFlow()
    mcf.add_arcs_with_capacity_and_unit_cost(np.concatenate(tails), np.concatenate(heads),
                                             np.concatenate(caps), np.concatenate(costs))
    supplies = np.zeros(next_id, dtype=np.int64)
    supplies[:nc] = counts
    supplies[sink] = -int(counts.sum())
    mcf.set_nodes_supplies(np.arange(next_id, dtype=np.int32), supplies)
    status = mcf.solve()
    if status != mcf.OPTIMAL:
        raise RuntimeError(f"min-cost flow status {status}")
    out: list[list[int]] = [[] for _ in classes]
    for start, ci, idx in meaning:
        fl = mcf.flows(np.arange(start, start + idx.size, dtype=np.int32))
        nz = np.flatnonzero(fl)
        out[ci].extend(np.repeat(idx[nz], fl[nz]).tolist())
    return out, n_arcs, pruned


def _rigidity_order(classes: Sequence[ClassSpec]) -> list[int]:
    """Most constrained classes first: they have the fewest alternatives."""
    return sorted(range(len(classes)), key=lambda ci: int(classes[ci].mask.sum()))


def _replay(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
            got: list[list[int]]) -> Packer:
    pk = Packer(free, domains, classes)
    for ci, nodes in enumerate(got):
        for n in nodes:
            pk.put(ci, n)
    return pk


def _fill(pk: Packer, got: list[list[int]], skip_gangs: bool) -> None:
    """Cheapest-feasible placement of whatever is still unplaced (exact checks)."""
    classes = pk.classes
    for ci in _rigidity_order(classes):
        c = classes[ci]
        if skip_gangs and c.gang is not None:
            continue
        left = c.count - len(got[ci])
        while left > 0:
            cand = pk.candidates(ci)
            if not cand.any():
                break
            costs = np.where(cand, c.cost, np.inf)
            if not c.conflicts:
                # no anti-affinity: fill the cheapest nodes to capacity in one sweep
                k = capacity_per_node(c.req, pk.free)
                for n in np.argsort(costs, kind="stable"):
                    if left == 0 or not np.isfinite(costs[n]):
                        break
                    take = int(min(k[n], left))
                    for _ in range(take):
                        pk.put(ci, int(n))
                        got[ci].append(int(n))
                    left -= take
                break
            n = int(np.argmin(costs))
            pk.put(ci, n)
            got[ci].append(n)
            left -= 1


def _gangs(classes: Sequence[ClassSpec], got: list[list[int]]) -> bool:
    """Drop partially placed gangs (all or nothing); True if anything was dropped."""
    members: dict[str, list[int]] = {}
    for ci, c in enumerate(classes):
        if c.gang is not None:
            members.setdefault(c.gang, []).append(ci)
    dropped = False
    for cis in members.values():
        if any(len(got[ci]) < classes[ci].count for ci in cis):
            for ci in cis:
                if got[ci]:
                    dropped = True
                got[ci] = []
    return dropped


def _objective(classes: Sequence[ClassSpec], icost: list[np.ndarray], penalty: int,
               got: list[list[int]]) -> int:
    tot = 0
    for ci, c in enumerate(classes):
        if got[ci]:
            tot += int(icost[ci][np.asarray(got[ci])].sum())
        tot += penalty * (c.count - len(got[ci]))
    return tot


def _coupled(classes: Sequence[ClassSpec]) -> bool:
    shapes = {tuple(c.req.tolist()) for c in classes}
    if len(shapes) > 1 or any(c.gang for c in classes):
        return True
    for ci, c in enumerate(classes):
        for others in c.conflicts.values():
            if any(o != ci for o in others):
                return True
    return False


def _single(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray]
            ) -> list[list[int]]:
    """One pod: the cheapest node that fits is optimal; no flow needed."""
    pk = Packer(free, domains, classes)
    cand = pk.candidates(0)
    if not cand.any():
        return [[]]
    return [[int(np.argmin(np.where(cand, classes[0].cost, np.inf)))]]


def solve(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
          cfg: EngineConfig) -> SolveOutput:
    """Place every class's pods on node indices: flow rounds on the residual capacity with
    exact packing, a cheapest-feasible fill, gangs all-or-nothing, then CP-SAT if coupled."""
    stats: dict[str, float] = {}
    if not classes:
        return SolveOutput([], "none", stats)
    if len(classes) == 1 and classes[0].count == 1:
        return SolveOutput(_single(classes, free, domains), "single", stats)
    icost, penalty = _penalty(classes, cfg.cost_scale)
    pk = Packer(free, domains, classes)
    got: list[list[int]] = [[] for _ in classes]
    order = _rigidity_order(classes)
    method = "flow"
    arcs_total = 0
    for rnd in range(max(cfg.flow_rounds, 1)):
        active = [ci for ci in range(len(classes)) if len(got[ci]) < classes[ci].count]
        if not active:
            break
        sub = [dataclasses.replace(classes[ci], count=classes[ci].count - len(got[ci]),
                                   mask=pk.candidates(ci)) for ci in active]
        wanted, arcs, pruned = _flow(sub, pk.free, domains, [icost[ci] for ci in active],
                                     penalty, cfg)
        arcs_total += arcs
        pos = {ci: j for j, ci in enumerate(active)}
        rejected = 0
        for ci in order:
            j = pos.get(ci)
            if j is None:
                continue
            for n in wanted[j]:
                if pk.ok(ci, n):
                    pk.put(ci, n)
                    got[ci].append(n)
                else:
                    rejected += 1
        stats["flow_rounds"] = float(rnd + 1)
        short_pruned = any(pruned[j] and len(wanted[j]) < sub[j].count
                           for j in range(len(active)))
        if rejected:
            method = "flow+repair"
        if not rejected and not short_pruned:
            break
    stats["flow_arcs"] = float(arcs_total)
    _fill(pk, got, skip_gangs=False)
    if _gangs(classes, got):
        pk = _replay(classes, free, domains, got)
        _fill(pk, got, skip_gangs=True)
    best_obj = _objective(classes, icost, penalty, got)
    if cfg.use_cpsat and _coupled(classes) and arcs_total <= cfg.cpsat_max_arcs:
        res = _cpsat(classes, free, domains, icost, penalty, got, cfg)
        if res is not None:
            got2, obj2, status = res
            stats["cpsat_objective"] = float(obj2)
            if obj2 <= best_obj:
                # a time-limited answer may leave room: fill it (never gang members)
                pk2 = _replay(classes, free, domains, got2)
                _fill(pk2, got2, skip_gangs=True)
                got, best_obj = got2, _objective(classes, icost, penalty, got2)
                method = f"cpsat-{status}"
    stats["objective"] = float(best_obj)
    return SolveOutput(got, method, stats)


def _cpsat(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
           icost: list[np.ndarray], penalty: int, hint: list[list[int]], cfg: EngineConfig
           ) -> tuple[list[list[int]], int, str] | None:
    # imported here: cp_model pulls in pandas (~0.5 s), which a scheduler's start-up (time to
    # its first binding) should not pay before it needs CP-SAT
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    per_node: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
    placed = []
    obj = []
    for ci, c in enumerate(classes):
        k = capacity_per_node(c.req, free)
        hint_counts: dict[int, int] = {}
        for n in hint[ci]:
            hint_counts[n] = hint_counts.get(n, 0) + 1
        vs = []
        for n in np.flatnonzero(c.mask & (k > 0)).tolist():
            v = m.new_int_var(0, int(min(k[n], c.count)), f"x{ci}_{n}")
            m.add_hint(v, hint_counts.get(n, 0))
            x[ci, n] = v
            per_node.setdefault(n, []).append((ci, v))
            vs.append(v)
            obj.append(int(icost[ci][n]) * v)
        p = m.new_int_var(0, c.count, f"p{ci}")
        m.add(p == sum(vs))
        m.add_hint(p, len(hint[ci]))
        placed.append(p)
        obj.append(penalty * (c.count - p))
    for n, lst in per_node.items():
        for r in range(3):
            if any(classes[ci].req[r] for ci, _ in lst):
                m.add(sum(int(classes[ci].req[r]) * v for ci, v in lst) <= int(free[n, r]))
    # anti-affinity: u[ci,key,d] says "class ci has a pod in domain d"
    used: dict[tuple[int, str, int], cp_model.IntVar] = {}

    def u(ci: int, key: str, d: int) -> cp_model.IntVar:
        if (ci, key, d) not in used:
            b = m.new_bool_var(f"u{ci}_{key}_{d}")
            dom = domains[key]
            vs = [v for (cj, n), v in x.items() if cj == ci and dom[n] == d]
            m.add(sum(vs) <= classes[ci].count * b)
            used[ci, key, d] = b
        return used[ci, key, d]

    for ci, c in enumerate(classes):
        for key, others in c.conflicts.items():
            dom = domains[key]
            ds = {int(dom[n]) for (cj, n) in x if cj == ci and dom[n] >= 0}
            for d in ds:
                if ci in others:
                    m.add(sum(v for (cj, n), v in x.items() if cj == ci and dom[n] == d) <= 1)
                for o in others:
                    if o > ci or (o < ci and ci not in classes[o].conflicts.get(key, [])):
                        m.add(u(ci, key, d) + u(o, key, d) <= 1)
    gangs: dict[str, list[int]] = {}
    for ci, c in enumerate(classes):
        if c.gang is not None:
            gangs.setdefault(c.gang, []).append(ci)
    for cis in gangs.values():
        y = m.new_bool_var("gang")
        for ci in cis:
            m.add(placed[ci] == classes[ci].count * y)
    m.minimize(sum(obj))
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = cfg.cpsat_time_limit_s
    s.parameters.num_workers = cfg.cpsat_workers
    st = s.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    got: list[list[int]] = [[] for _ in classes]
    for (ci, n), v in x.items():
        got[ci].extend([n] * int(s.value(v)))
    return got, round(s.objective_value), "optimal" if st == cp_model.OPTIMAL else "feasible"


# -- references for tests and the benchmark -------------------------------------------------
@dataclass
class ExactResult:
    """Pod-level reference: proven optimal or not, objective and node per pod (-1: none)."""

    optimal: bool
    objective: int
    nodes: list[int]


def solve_exact_pods(feasible: Sequence[Mapping[int, int]], req: Sequence[Sequence[int]],
                     free: Sequence[Sequence[int]], conflicts: Sequence[tuple[int, int, str]],
                     domains: Mapping[str, Sequence[int]], gangs: Sequence[Sequence[int]],
                     penalty: int, time_limit_s: float = 10.0) -> ExactResult:
    """One boolean per (pod, feasible node): resources, pairwise anti-affinity per domain,
    gangs; minimise cost + penalty x unplaced. ``feasible[p]`` maps node -> integer cost."""
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    obj: list[Any] = []
    for p, nodes in enumerate(feasible):
        vs = []
        for n, cst in nodes.items():
            v = m.new_bool_var(f"x{p}_{n}")
            x[p, n] = v
            vs.append(v)
            obj.append(cst * v)
        m.add(sum(vs) <= 1)
        obj.append(penalty * (1 - sum(vs)))
    for n in range(len(free)):
        for r in range(3):
            terms = [req[p][r] * x[p, n] for p in range(len(feasible)) if (p, n) in x]
            if terms:
                m.add(sum(terms) <= free[n][r])
    for p, q, key in conflicts:
        dom = domains[key]
        for n1 in feasible[p]:
            for n2 in feasible[q]:
                if dom[n1] >= 0 and dom[n1] == dom[n2] and (p != q):
                    m.add(x[p, n1] + x[q, n2] <= 1)
    for g in gangs:
        y = m.new_bool_var("g")
        for p in g:
            m.add(sum(x[p, n] for n in feasible[p]) == y)
    m.minimize(sum(obj))
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = time_limit_s
    s.parameters.num_workers = 1
    st = s.solve(m)
    where = [-1] * len(feasible)
    for (p, n), v in x.items():
        if s.value(v):
            where[p] = n
    return ExactResult(st == cp_model.OPTIMAL, round(s.objective_value), where)


def lp_lower_bound(classes: Sequence[ClassSpec], free: np.ndarray, min_placed: int | None,
                   time_limit_s: float = 60.0) -> tuple[float, bool]:
    """LP relaxation (GLOP) of the class-level problem: the least $/hour of placing at least
    ``min_placed`` pods with continuous counts, every resource per node, and self
    anti-affinity per host as a per-arc bound of 1. Cross-class and zone/region
    anti-affinity and gangs are relaxed away, so no integer placement of ``min_placed`` or
    more pods costs less. With ``min_placed`` None it maximises the number placed instead
    (an upper bound on what any placement can place). Returns (value, finished)."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("GLOP")
    solver.SetTimeLimit(int(time_limit_s * 1000))
    inf = solver.infinity()
    per_node: dict[int, list[tuple[int, object]]] = {}
    obj = solver.Objective()
    total = solver.Constraint(float(min_placed or 0), inf)
    for ci, c in enumerate(classes):
        k = capacity_per_node(c.req, free)
        idx = np.flatnonzero(c.mask & (k > 0))
        self_host = ci in c.conflicts.get(HOST, [])
        row = solver.Constraint(0.0, float(c.count))
        for n in idx.tolist():
            ub = 1.0 if self_host else float(min(k[n], c.count))
            v = solver.NumVar(0, ub, "")
            row.SetCoefficient(v, 1)
            total.SetCoefficient(v, 1)
            obj.SetCoefficient(v, 1.0 if min_placed is None else float(c.cost[n]))
            per_node.setdefault(n, []).append((ci, v))
    for n, lst in per_node.items():
        for r in range(3):
            if len(lst) > 1 and any(classes[ci].req[r] for ci, _ in lst):
                ct = solver.Constraint(-inf, float(free[n, r]))
                for ci, v in lst:
                    ct.SetCoefficient(v, float(classes[ci].req[r]))
    if min_placed is None:
        obj.SetMaximization()
    else:
        obj.SetMinimization()
    st = solver.Solve()
    if st != pywraplp.Solver.OPTIMAL:
        return float("nan"), False
    return float(obj.Value()), True
