"""Reference models for tests and benchmarks (never a scheduling path): what the engine's
answers are compared against.

* ``solve_exact_pods``: a pod-level CP-SAT model (one boolean per pod and feasible node),
  the reference optimum of small instances;
* ``cpsat_cost_reference``: the engine's own class-level CP-SAT model
  (``cloud_core.placement.cpsat.class_model``) solved long from a hint, with its proven
  bound, stopped by CPU time (``Watch``) so that a loaded machine does not shorten it;
* ``lp_lower_bound``: the LP relaxation (GLOP) -- a lower bound on the cost of placing at
  least a given count, or an upper bound on the count.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from cloud_core.placement.classes import (
    HOST,
    ClassSpec,
    capacity_per_node,
    integer_costs,
    objective,
)
from cloud_core.placement.config import EngineConfig
from cloud_core.placement.cpsat import class_model, cp_solver


class Watch:
    """For references: stops a CP-SAT search after ``cpu_limit_s`` of process CPU time (a
    watcher thread; the solve releases the GIL) and records each solution's CPU time and
    objective. It reads the clock, so only the benchmark's references use it."""

    def __init__(self, solver: Any, cpu_limit_s: float | None,
                 trace: list[tuple[float, int]] | None) -> None:
        self.t0 = time.process_time()
        self.done = threading.Event()
        trace_ = trace if trace is not None else []
        t0 = self.t0

        class _Cb(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:
                trace_.append((time.process_time() - t0, round(self.objective_value)))

        self.cb = _Cb()
        if cpu_limit_s is not None:
            def watch() -> None:
                while not self.done.wait(0.25):
                    if time.process_time() - t0 >= cpu_limit_s:
                        solver.stop_search()
                        return
            threading.Thread(target=watch, daemon=True).start()


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


@dataclass
class CostReference:
    """CP-SAT on the exact class-level model: is ``cost`` proven optimal among placements
    of the most pods, and a proven lower bound on that cost ($/hour)."""

    placed: int
    cost: float
    bound: float
    optimal: bool
    # the best cost found by each CPU-time checkpoint (s -> $/hour), when asked for
    at_cpu: dict[float, float] = field(default_factory=dict)


def cpsat_cost_reference(classes: Sequence[ClassSpec], free: np.ndarray,
                         domains: Mapping[str, np.ndarray], hint: list[list[int]],
                         cfg: EngineConfig, time_limit_s: float,
                         cpu_checkpoints: Sequence[float] = ()) -> CostReference:
    """The engine's own CP-SAT model (``cpsat.class_model``: count first, then cost; every resource,
    all anti-affinity, gangs), solved from ``hint`` for up to ``time_limit_s`` of wall
    time -- a reference for the benchmark, not a scheduling path. When the hint places
    every pod, CP-SAT's bound on its objective is a lower bound on the cost of any
    placement of every pod, one that integrality makes tighter than the LP's."""
    icost, penalty = integer_costs(classes, cfg.cost_scale)
    cpu = max(cpu_checkpoints) if cpu_checkpoints else None
    # with CPU checkpoints the wall clock is only a safety net (a loaded machine)
    ref = dataclasses.replace(cfg, cpsat_wall_cap_s=time_limit_s if cpu is None
                              else max(time_limit_s, 20 * cpu))
    trace: list[tuple[float, int]] = []
    cm = class_model(classes, free, domains, icost, penalty, hint)
    s = cp_solver(ref, 1e9)
    watch = Watch(s, cpu, trace)
    st = s.solve(cm.model, watch.cb)
    watch.done.set()
    res = None
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        res = (cm.placement(s, len(classes)), round(s.objective_value),
               "optimal" if st == cp_model.OPTIMAL else "feasible")
    bound = [float(s.best_objective_bound)]
    hint_obj = objective(classes, icost, penalty, hint)
    at: dict[float, float] = {}
    for t in cpu_checkpoints:
        best = min([o for ts, o in trace if ts <= t] + [hint_obj])
        at[t] = (best % penalty) / cfg.cost_scale  # cost < penalty: the rest is the count
    got = res[0] if res is not None else hint
    if objective(classes, icost, penalty, got) > objective(classes, icost, penalty, hint):
        got = hint
    placed = sum(map(len, got))
    unplaced = sum(c.count for c in classes) - placed
    lo = (bound[0] - penalty * unplaced) if bound else 0.0
    return CostReference(placed, objective(classes, icost, 0, got) / cfg.cost_scale,
                         max(lo, 0.0) / cfg.cost_scale,
                         res is not None and res[2] == "optimal", at)


def lp_lower_bound(classes: Sequence[ClassSpec], free: np.ndarray, min_placed: int | None,
                   time_limit_s: float = 60.0) -> tuple[float, bool]:
    """LP relaxation (GLOP) of the class-level problem: the least $/hour of placing at least
    ``min_placed`` pods with continuous counts, every resource per node, and self
    anti-affinity per host as a per-arc bound of 1. Cross-class and zone/region
    anti-affinity and gangs are relaxed away, so no integer placement of ``min_placed`` or
    more pods costs less. With ``min_placed`` None it maximises the number placed instead
    (an upper bound on what any placement can place). Returns (value, finished)."""
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
