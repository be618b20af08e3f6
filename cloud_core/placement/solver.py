"""The global solver: places classes of identical workloads (``classes.ClassSpec``) on node
arrays, minimising ``penalty x unplaced + cost`` (most pods first, then least cost; see
docs/placement.md, "Objective"). Two routes:

* **Flow route** (loose batches, ``flow.flow_route``): min-cost flow over class -> node
  arcs, exact when the constraints decompose; an exact packer (``classes.Packer``) replays
  it and the flow is re-solved on the residual capacity for what over-packs or clashes; a
  cheapest-feasible fill; gangs all-or-nothing. If pods that fit an allowed node are left
  out, ejection repair (and, when many are out, packing: ``packing.pack_stage``) may win.
* **Pack route** (tight batches, ``_tight``): rigid-and-large-first tightest-fit packing
  with a look-ahead on the demand still to come, ejection repair (``packing``), CP-SAT large
  neighbourhood search for the pods still out, then cost among the pods that fit (CP-SAT
  cost neighbourhoods for small batches: ``neighbourhoods``; the cost descent and slot-exchange
  min-cost flow: ``descent``).

**CP-SAT** (``cpsat``) then polishes coupled batches small enough (``cpsat_max_arcs``), with
the best answer as hint. Every step is bounded by work, never by the clock: CP-SAT by its
deterministic time, one worker and a fixed seed, so the same input gives the same answer on
any load (a wall-clock cap is only a safety net, reported in the stats when hit). The one
exception is a small batch's step budget on the Kubernetes path (``budget.step_clock``):
a CPU budget after which the neighbourhoods stop (the CPU taken is the same on any load),
and a wall-clock safety net, reported when it cuts them.

The reference models that tests and benchmarks compare against (a pod-level CP-SAT model,
CP-SAT's proven bounds, the LP relaxation) live in ``tools/placement_ref.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .budget import Budget, StepClock
from .classes import (
    ClassSpec,
    Packer,
    SolveOutput,
    fill,
    finish,
    has_room,
    integer_costs,
    objective,
    placeable,
    replay,
)
from .config import EngineConfig
from .cpsat import cpsat, warm_up
from .descent import improve_cost
from .flow import flow_route
from .neighbourhoods import cost_lns, lns
from .packing import Pack, pack_order, pack_stage

__all__ = ["ClassSpec", "SolveOutput", "solve", "warm_up"]


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


def _tight(classes: Sequence[ClassSpec], free: np.ndarray, cfg: EngineConfig) -> bool:
    """Does the batch ask for more than ``pack_tight`` of some resource of the nodes it may
    use? Then packing decides the count and goes first (the flow's per-shape capacities
    over-promise when shapes mix on nearly full nodes)."""
    if not classes:
        return False
    may = np.zeros(free.shape[0], dtype=bool)
    demand = np.zeros(3, dtype=np.float64)
    for c in classes:
        may |= c.mask
        demand += c.req * c.count
    supply = free[may].sum(axis=0).astype(np.float64)
    return bool((demand > cfg.pack_tight * supply).any())


def _arcs(classes: Sequence[ClassSpec], free: np.ndarray) -> int:
    return sum(int((c.mask & has_room(c.req, free)).sum()) for c in classes)


def _pack_route(classes: Sequence[ClassSpec], free: np.ndarray,
                domains: Mapping[str, np.ndarray], icost: list[np.ndarray], penalty: int,
                cfg: EngineConfig, stats: dict[str, float], budget: Budget
                ) -> list[list[int]]:
    """Count first: rigid-and-large-first tightest-fit packing with demand look-ahead,
    ejection repair, CP-SAT neighbourhoods for what is still out, then cheaper moves."""
    pa: Pack | None = None
    best: tuple[int, int] | None = None
    for big in (0.0, cfg.pack_big):  # the second order only if the first leaves pods out
        pb = Pack(classes, free, domains, icost)
        order = pack_order(classes, free, big)
        pb.greedy(order, cfg.pack_lookahead, cfg.pack_cost)
        pb.repair(order, cfg.pack_repair_nodes, cfg.pack_work)
        key = (-sum(map(len, pb.got)), objective(classes, icost, 0, pb.got))
        if best is None or key < best:
            pa, best = pb, key
        if not placeable(classes, free, pb.got, domains):
            break
    assert pa is not None
    budget.hold_back()
    out = placeable(classes, free, pa.got, domains)
    tried = 0
    if cfg.use_cpsat and out:
        tried = lns(pa, free, domains, penalty, cfg, budget)
        stats["lns_solved"] = float(tried)
    if cfg.use_cpsat and cfg.cost_lns_iterations and (
            sum(c.count for c in classes) <= cfg.pack_flow_max_pods):
        # pods still out that the count neighbourhoods tried and placed none of: no more
        # fit (the reference's count, measured on the SLA family), and the cost
        # neighbourhoods get the search's whole share, not the exact step -- unless a gang
        # is among them: the neighbourhoods never try one, the exact step places gangs whole
        # (the gpu family's 200 x 50, seed 2: 199 pods with the exact step's CPU, 197
        # without, 6 runs in 8)
        left = placeable(classes, free, pa.got, domains)
        gangs_out = any(c.gang is not None and len(pa.got[ci]) < c.count
                        for ci, c in enumerate(classes))
        budget.count_first(left > 0 and (gangs_out or not (tried and left == out)))
        stats["cost_lns_solved"] = float(
            cost_lns(pa, free, domains, penalty, cfg, budget, left))
    got = finish(classes, free, domains, [list(g) for g in pa.got])
    stats["pack_work"] = float(pa.work)
    return improve_cost(classes, free, domains, icost, penalty, got, cfg, stats)


def solve(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
          cfg: EngineConfig, clock: StepClock | None = None) -> SolveOutput:
    """Place every class's pods on node indices, most pods first, then least cost.

    A loose batch takes the flow route (cost-optimal flow, exact packing, repair); if pods
    that fit an allowed node are left out, the pack stage tries to place them. A tight
    batch (``_tight``) takes the pack route first, and the flow route too when small. The
    lexicographically better answer wins; CP-SAT then polishes coupled batches that are
    small enough. Bounded by work throughout: the same input, the same answer -- within
    a step budget (``clock``: ``budget.step_clock``) the CP-SAT sub-solves get the work
    that fits in the CPU left to the search, none starts past its end, and the wall-clock
    safety net cuts a running one short (``stats["budget_deadline_hits"]``); the steps
    without CP-SAT still run."""
    stats: dict[str, float] = {}
    if not classes:
        return SolveOutput([], "none", stats)
    if free.shape[0] == 0:
        return SolveOutput([[] for _ in classes], "none", stats)
    if len(classes) == 1 and classes[0].count == 1:
        return SolveOutput(_single(classes, free, domains), "single", stats)
    icost, penalty = integer_costs(classes, cfg.cost_scale)
    total = sum(c.count for c in classes)
    budget = Budget.for_batch(cfg, total, clock)
    if cfg.pack and _tight(classes, free, cfg):
        got = _pack_route(classes, free, domains, icost, penalty, cfg, stats, budget)
        best_obj = objective(classes, icost, penalty, got)
        method = "pack"
        arcs_total: int | None = None  # counted only if the CP-SAT polish may run
        if total <= cfg.pack_flow_max_pods:
            got_f, m_f, _ = flow_route(classes, free, domains, icost, penalty, cfg, stats)
            obj_f = objective(classes, icost, penalty, got_f)
            if obj_f < best_obj:
                got, best_obj, method = got_f, obj_f, m_f
    else:
        got, method, arcs_total = flow_route(classes, free, domains, icost, penalty, cfg,
                                              stats)
        best_obj = objective(classes, icost, penalty, got)
        if cfg.pack and placeable(classes, free, got, domains):
            got, best_obj, m = pack_stage(classes, free, domains, icost, penalty, got,
                                           best_obj, cfg, stats)
            method = m or method
        if cfg.flow_descent and total <= cfg.pack_flow_max_pods and method != "flow":
            # the flow over-promised (shapes mixed, anti-affinity across classes): the
            # exact packer's rejections went to the cheapest node with room, not the
            # cheapest overall. The count-keeping cost steps of the pack route fix that.
            if cfg.use_cpsat and cfg.cost_lns_iterations:
                budget.hold_back()
                left = placeable(classes, free, got, domains)
                budget.count_first(left > 0)
                pa = Pack(classes, free, domains, icost)
                for ci, nodes in enumerate(got):
                    for n in nodes:
                        pa.put(ci, n)
                stats["cost_lns_solved"] = float(
                    cost_lns(pa, free, domains, penalty, cfg, budget, left))
                got = [list(g) for g in pa.got]
            got = improve_cost(classes, free, domains, icost, penalty, got, cfg, stats)
            best_obj = objective(classes, icost, penalty, got)
    # the whole-batch polish: always with cpsat_polish (local mode), else (the Kubernetes
    # path) for small batches that left out pods some allowed node could hold, with less
    # work and kept only when strictly better (a batch that placed everything never
    # imports CP-SAT here: the time to a scheduler's first binding)
    small = (not cfg.cpsat_polish and total <= cfg.small_polish_max_pods
             and placeable(classes, free, got, domains) > 0)
    if (cfg.use_cpsat and (cfg.cpsat_polish or small) and _coupled(classes) and budget.open()
            and (_arcs(classes, free) if arcs_total is None else arcs_total)
            <= cfg.cpsat_max_arcs):
        det = cfg.small_polish_deterministic_time if small else cfg.cpsat_deterministic_time
        res = cpsat(classes, free, domains, icost, penalty, got, cfg, det_time=det,
                    budget=budget)
        if res is not None:
            got2, obj2, status = res
            stats["cpsat_objective"] = float(obj2)
            if obj2 < best_obj or (obj2 == best_obj and not small):
                # an answer stopped by the work limit may leave room: fill it (no gangs)
                pk2 = replay(classes, free, domains, got2)
                fill(pk2, got2, skip_gangs=True)
                got, best_obj = got2, objective(classes, icost, penalty, got2)
                method = f"cpsat-{status}"
    # The last step of every route: whatever a pod left out still fits goes in. The cost
    # steps (descent, slot flow, CP-SAT neighbourhoods) move pods and may free room that
    # none of them fills again (measured: 1,000-1,500-pod tight batches left pods out with
    # nodes still fitting them); count first, so a fill that places one more always wins.
    if placeable(classes, free, got, domains):
        pk = replay(classes, free, domains, got)
        before = sum(map(len, got))
        fill(pk, got, skip_gangs=True)
        if sum(map(len, got)) > before:
            stats["refilled"] = float(sum(map(len, got)) - before)
            best_obj = objective(classes, icost, penalty, got)
    if budget.wall_cap_hits:
        stats["cpsat_wall_cap_hits"] = float(budget.wall_cap_hits)
    if budget.deadline_hits:
        stats["budget_deadline_hits"] = float(budget.deadline_hits)
    if budget.spent:
        stats["cpsat_work"] = budget.spent
    stats["objective"] = float(best_obj)
    return SolveOutput(got, method, stats)
