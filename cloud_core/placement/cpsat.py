"""The class-level CP-SAT model: integer counts per (class, node), resources per node,
anti-affinity per domain, gangs; minimise cost + penalty x unplaced from a hint. Bounded by
work, never by the clock: a deterministic time limit, one worker, a fixed seed.

CP-SAT (``ortools.sat``) is imported lazily: it pulls in pandas, which a scheduler's
start-up should not pay for before it needs it (``warm_up``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .budget import Budget
from .classes import ClassSpec, capacity_per_node, objective
from .config import EngineConfig

if TYPE_CHECKING:
    from ortools.sat.python import cp_model


def warm_up() -> None:
    """Import CP-SAT now, off the decision path. It is imported lazily (it pulls in pandas:
    0.8 s of CPU with compiled files, far more without), so a scheduler's first bindings do
    not wait for it; but the first batch that needs it then stalled the loop for that long
    mid-step (the starvation benchmark's canary p99). A long-running core calls this once its
    first decisions are out (``k8s/wiring.py``)."""
    from ortools.sat.python import cp_model  # noqa: F401


def cp_solver(cfg: EngineConfig, det_time: float) -> cp_model.CpSolver:
    """A CP-SAT solver bounded by work, not by the clock: a deterministic time limit, one
    worker, a fixed seed -- the same model gives the same answer on a busy machine. The
    wall-clock limit is only a safety net (far above what the work limit takes); a caller
    that sees it hit reports it (``stats["cpsat_wall_cap_hits"]``), since that answer may
    depend on load."""
    from ortools.sat.python import cp_model  # lazily, as in cpsat

    s = cp_model.CpSolver()
    p = s.parameters
    p.max_deterministic_time = det_time
    p.max_time_in_seconds = cfg.cpsat_wall_cap_s
    p.num_workers = 1
    p.random_seed = cfg.cpsat_seed
    return s


@functools.cache
def _model_type() -> type[cp_model.CpModel]:
    from ortools.sat.python import cp_model

    class Model(cp_model.CpModel):
        """``CpModel`` without the camelCase aliases its constructor sets on each instance:
        a ``dir()`` walk with a wrapper per method, 1 ms a model (a small batch's step
        builds 50-100 sub-models: 7 % of its CPU). Nothing here calls the aliases."""

        def _add_pre_pep8_methods(self) -> None:
            pass

    return Model


def new_model() -> cp_model.CpModel:
    """An empty CP-SAT model (CP-SAT imported on the first call)."""
    return _model_type()()


@dataclass
class ClassModel:
    """A class-level CP-SAT model: ``x[class, node]`` counts the class's pods on the node."""

    model: cp_model.CpModel
    x: dict[tuple[int, int], cp_model.IntVar]
    hinted: dict[int, int]  # variable index -> its hinted value (the x and p variables)

    def hint_any(self, vs: Sequence[cp_model.IntVar]) -> int:
        """1 if the hint puts a pod in one of ``vs``, else 0."""
        return int(any(self.hinted.get(v.index, 0) for v in vs))

    def placement(self, solver: cp_model.CpSolver, n_classes: int) -> list[list[int]]:
        """Per class, its pods' nodes in ``solver``'s answer."""
        got: list[list[int]] = [[] for _ in range(n_classes)]
        for (ci, n), v in self.x.items():
            got[ci].extend([n] * int(solver.value(v)))
        return got


def class_model(classes: Sequence[ClassSpec], free: np.ndarray,
                domains: Mapping[str, np.ndarray], icost: list[np.ndarray], penalty: int,
                hint: list[list[int]], count_only: bool = False, full_hint: bool = False
                ) -> ClassModel:
    """Integer counts per (class, node), resources per node, anti-affinity per domain,
    gangs; minimise cost + penalty x unplaced (``count_only``: unplaced only), hinted with
    ``hint`` (``full_hint``: the auxiliary variables too, so that CP-SAT without presolve
    starts from the hint at once: the exact step within the step's budget)."""
    # imported here: cp_model pulls in pandas (~0.5 s), which a scheduler's start-up (time to
    # its first binding) should not pay before it needs CP-SAT
    from ortools.sat.python import cp_model

    m = new_model()
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    hinted: dict[int, int] = {}
    per_node: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
    placed = []
    # the objective's terms (cost per cell, penalty per class), set on the proto below
    obj_vars: list[cp_model.IntVar] = []
    obj_coef: list[int] = []
    offset = 0
    for ci, c in enumerate(classes):
        k = capacity_per_node(c.req, free)
        hint_counts: dict[int, int] = {}
        for n in hint[ci]:
            hint_counts[n] = hint_counts.get(n, 0) + 1
        vs = []
        cells = np.flatnonzero(c.mask & (k > 0))
        tops = np.minimum(k[cells], c.count).tolist()
        costs = icost[ci][cells].tolist()
        for n, top, cost in zip(cells.tolist(), tops, costs, strict=True):
            v = m.new_int_var(0, int(top), "")
            h = hint_counts.get(n, 0)
            hinted[v.index] = h
            x[ci, n] = v
            per_node.setdefault(n, []).append((ci, v))
            vs.append(v)
            if not count_only:
                obj_vars.append(v)
                obj_coef.append(int(cost))
        p = m.new_int_var(0, c.count, "")
        m.add(p == cp_model.LinearExpr.sum(vs))
        hinted[p.index] = len(hint[ci])
        placed.append(p)
        weight = 1 if count_only else penalty
        obj_vars.append(p)
        obj_coef.append(-weight)
        offset += weight * c.count
    for n, lst in per_node.items():
        for r in range(3):
            coef = [int(classes[ci].req[r]) for ci, _ in lst]
            if any(coef):
                m.add(cp_model.LinearExpr.weighted_sum([v for _, v in lst], coef)
                      <= int(free[n, r]))
    # hints and objective straight into the model's proto, in one call each (the
    # library's add_hint and minimize append them one by one: half the time of building a
    # cost neighbourhood's model)
    proto = m.proto
    proto.solution_hint.vars.extend(list(hinted))
    proto.solution_hint.values.extend(list(hinted.values()))
    proto.objective.vars.extend([v.index for v in obj_vars])
    proto.objective.coeffs.extend(obj_coef)
    proto.objective.offset = offset
    proto.objective.scaling_factor = 1.0
    cm = ClassModel(m, x, hinted)
    _anti_affinity(cm, classes, domains, full_hint)
    gangs: dict[str, list[int]] = {}
    for ci, c in enumerate(classes):
        if c.gang is not None:
            gangs.setdefault(c.gang, []).append(ci)
    for cis in gangs.values():
        y = m.new_bool_var("gang")
        if full_hint:
            m.add_hint(y, int(all(len(hint[ci]) == classes[ci].count for ci in cis)))
        for ci in cis:
            m.add(placed[ci] == classes[ci].count * y)
    return cm


def _anti_affinity(cm: ClassModel, classes: Sequence[ClassSpec],
                   domains: Mapping[str, np.ndarray], full_hint: bool) -> None:
    """Per topology key and domain: at most one pod of a class that repels itself, and
    never two classes that repel each other (``u[ci, key, d]``: class ci has a pod in d)."""
    m = cm.model
    used: dict[tuple[int, str, int], cp_model.IntVar] = {}
    # a class's cells in the model's order, once: scanning every cell per class and domain
    # took 1.5 s of CPU building the exact step's model of a 300-pod, 75-node batch
    cells: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
    for (cj, n), v in cm.x.items():
        cells.setdefault(cj, []).append((n, v))

    def u(ci: int, key: str, d: int) -> cp_model.IntVar:
        if (ci, key, d) not in used:
            b = m.new_bool_var(f"u{ci}_{key}_{d}")
            dom = domains[key]
            vs = [v for n, v in cells.get(ci, []) if dom[n] == d]
            m.add(sum(vs) <= classes[ci].count * b)
            if full_hint:
                m.add_hint(b, cm.hint_any(vs))
            used[ci, key, d] = b
        return used[ci, key, d]

    for ci, c in enumerate(classes):
        for key, others in c.conflicts.items():
            dom = domains[key]
            ds = {int(dom[n]) for n, _ in cells.get(ci, []) if dom[n] >= 0}
            for d in ds:
                if ci in others:
                    m.add(sum(v for n, v in cells.get(ci, []) if dom[n] == d) <= 1)
                for o in others:
                    if o > ci or (o < ci and ci not in classes[o].conflicts.get(key, [])):
                        m.add(u(ci, key, d) + u(o, key, d) <= 1)


def cpsat(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
          icost: list[np.ndarray], penalty: int, hint: list[list[int]], cfg: EngineConfig,
          det_time: float | None = None, budget: Budget | None = None,
          count_only: bool = False, presolve: bool = True
          ) -> tuple[list[list[int]], int, str] | None:
    """Solve ``class_model`` from ``hint`` within ``det_time`` (default
    ``cpsat_deterministic_time``) and what is left of ``budget``: (placement, objective,
    "optimal" or "feasible"), None when CP-SAT found nothing. The work it took and a
    wall-clock stop are charged to ``budget``."""
    from ortools.sat.python import cp_model

    if budget is None:
        budget = Budget()
    cm = class_model(classes, free, domains, icost, penalty, hint, count_only)
    # the limits after the model is built: the budget times the solve alone (its rate)
    det, wall, by_deadline = budget.limits(
        det_time if det_time is not None else cfg.cpsat_deterministic_time,
        cfg.cpsat_wall_cap_s)
    s = cp_solver(cfg, det)
    s.parameters.max_time_in_seconds = wall
    # small neighbourhoods: presolve costs more than it saves (measured: 10 ms vs 45 ms)
    s.parameters.cp_model_presolve = presolve
    st = s.solve(cm.model)
    budget.charge(s.response_proto.deterministic_time,
                  s.wall_time >= s.parameters.max_time_in_seconds * 0.98, by_deadline)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    got = cm.placement(s, len(classes))
    value = objective(classes, icost, penalty, got) if count_only else round(s.objective_value)
    return got, value, "optimal" if st == cp_model.OPTIMAL else "feasible"
