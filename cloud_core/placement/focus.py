"""The exact step's focused rounds: searches of a few tens of the whole model's variables,
the rest held at the answer so far (their domains fixed for the round).

A left-out pod usually needs a few pods moved off its own nodes, and a pod that pays far
above its class's cheapest node needs room opened there; a search of the whole model
reaches either only after long. Each round frees a few nodes' cells, and the cells of the
classes with a pod on them on the ``FOCUS_SPARE_NODES`` roomiest nodes with room for one of
their pods, and solves that with the model's objective (cost + penalty x unplaced); an
answer is kept only when strictly better.

* **Count rounds** go over the left-out classes in turn, those with the fewest cells first,
  each freeing every cell on the nodes the class may use, until each was tried once since
  the last better answer, or ``1 - COST_SHARE`` of the CPU the rounds started with is
  spent. A round that would free more than ``FOCUS_MAX_FREE`` of the model's cells is
  skipped.
* **Cost rounds** then go over the pods that pay more than their class's cheapest cell,
  largest regret first, each freeing the pod's node and the class's ``lns_near`` cheapest
  nodes (ties: the most room first), each node in one round at most.

Each round gets at most ``FOCUS_WORK`` of CP-SAT's deterministic time, and what fits in
``ROUND_SHARE`` of the step's CPU left; none starts with less than ``step_exact_min_s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .budget import MIN_WORK, StepClock, work_rate
from .classes import ClassSpec, objective
from .config import EngineConfig
from .cpsat import ClassModel, cp_solver

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

# A round of the exact step gets at most the work that fits in ROUND_SHARE of the CPU left
ROUND_SHARE = 0.8
# A focused round's work at most: 0.03 units, 0.05-0.15 s of CPU on the quality benchmark's
# mixed batches, where a round of its tens of free variables proves its answer or gets close
FOCUS_WORK = 0.03
# ... and the classes with a pod on the round's nodes may move to this many other nodes,
# those with the most room (all of them: rounds 1.5-2 times as long, fewer of them; 20: the
# mixed family's 200 x 50 seed 1 and 300 x 75 seed 3 placed one pod fewer each, and its
# batches priced up to 2 % more)
FOCUS_SPARE_NODES = 40
# ... and a count round that would free more than this share of the model's cells is
# skipped: on the quality benchmark's mixed 300 x 75 such rounds (55-60 % free) took
# 0.1-0.17 s each and placed nothing; the whole-model rounds after them search that model
FOCUS_MAX_FREE = 0.5
# The cost rounds' share of the CPU left when the rounds start. Measured on the mixed
# family, seeds 1-10 at 200 and 300 pods (one run each): 4,713 pods placed against 4,708
# without cost rounds, cheaper on 15 batches of 20 (mixed 300 x 75 seed 1: 28.1 $/h
# against 29.3, the reference 27.2; seed 5: 22.9 against 23.3, the reference 22.3); the
# count rounds of a batch with pods that no node can take left none of it before
COST_SHARE = 0.35


class FocusedRounds:
    """The focused rounds over one exact model (``cm``) from the engine's answer ``hint``;
    ``free0``: each node's room before the batch; ``icost``, ``penalty``: the model's
    objective (``classes.integer_costs``); ``single``: per class, whether at most one of its
    pods may be on a node (host ports, or a class that repels itself)."""

    def __init__(self, cm: ClassModel, specs: Sequence[ClassSpec], hint: list[list[int]],
                 free0: np.ndarray, icost: list[np.ndarray], penalty: int,
                 cfg: EngineConfig, clock: StepClock, single: Sequence[bool]) -> None:
        self.cm, self.specs, self.free0, self.single = cm, specs, free0, single
        self.icost, self.cfg, self.clock = icost, cfg, clock
        self.cells: dict[int, list[int]] = {}
        for ci, n in cm.x:
            self.cells.setdefault(ci, []).append(n)
        self.doms = RoundDomains(cm)
        self.sol: list[int] | None = None  # the best answer, every variable's value
        self.best = float(objective(specs, icost, penalty, hint))
        self.work, self.rate = 0.0, clock.work_per_cpu
        self.count_tries = self.cost_tries = 0
        self._keep([list(ns) for ns in hint])

    def _keep(self, cur: list[list[int]]) -> None:
        """``cur`` is the answer now: the room it leaves, its cells' values, spare nodes."""
        self.cur = cur
        self.room = room_left(cur, self.specs, self.free0)
        self.val = self.doms.values(cur)
        self.spare = spare_nodes(self.room, self.free0)

    def run(self, stats: dict[str, float]) -> tuple[list[int], list[list[int]]] | None:
        """Count rounds, then cost rounds. Returns the best answer found, as every
        variable's value (the next solve's hint) and per class its pods' nodes, or None
        when no round found a better one."""
        count_end = self.clock.used() + (1.0 - COST_SHARE) * self.clock.cpu_left(
            self.clock.end_cpu)
        try:
            self._count_rounds(count_end)
            self._cost_rounds()
        finally:  # the model is the whole step's: its domains as they were, whatever happens
            self.doms.restore()
        stats["exact_work"] = stats.get("exact_work", 0.0) + self.work
        stats["exact_focused"] = float(self.count_tries)
        stats["exact_cost_rounds"] = float(self.cost_tries)
        return None if self.sol is None else (self.sol, self.cur)

    def _det(self) -> float:
        """The next round's work; 0: no round (the CPU or the safety net is spent)."""
        left = self.clock.cpu_left(self.clock.end_cpu)
        det = min(FOCUS_WORK, ROUND_SHARE * left * self.rate)
        if (self.clock.wall_left() <= 0.0 or left < self.cfg.step_exact_min_s
                or det < MIN_WORK):
            return 0.0
        return det

    def _count_rounds(self, until: float) -> None:
        tries = stale = 0
        while self.clock.used() < until:
            # the classes with the fewest cells first: their rounds free the fewest
            # variables and cost the least; a class that may use most nodes frees most of
            # the model
            out = sorted((ci for ci in range(len(self.specs))
                          if len(self.cur[ci]) < self.specs[ci].count and ci in self.cells),
                         key=lambda ci: len(self.cells[ci]))
            det = self._det()
            if not out or stale >= len(out) or not det:
                break
            group = out[tries % len(out)]
            tries += 1
            on = np.zeros(len(self.room), dtype=bool)
            on[self.cells[group]] = True
            free = self._free(on, {group})
            if int(free.sum()) > FOCUS_MAX_FREE * len(free):
                stale += 1  # most of the model: the whole-model rounds' search, not this one's
                continue
            had = self.sol is not None  # the first better answer resets nothing
            if not self._round(free, det):
                stale += 1
            elif had:
                stale = 0
        self.count_tries = tries

    def _cost_rounds(self) -> None:
        icost = self.icost
        seen: set[int] = set()
        for _, ci, n in self._regrets():
            det = self._det()
            if not det:
                break
            if n in seen or n not in self.cur[ci]:
                continue
            cand = self._open(ci, n)
            roomy = room_share(self.room, self.free0)[cand]
            cheap = cand[np.lexsort((-roomy, icost[ci][cand]))].tolist()
            pick = [n, *cheap[:self.cfg.lns_near]]
            seen.update(pick)
            on = np.zeros(len(self.room), dtype=bool)
            on[pick] = True
            self.cost_tries += 1
            self._round(self._free(on, set()), det)

    def _open(self, ci: int, n: int) -> np.ndarray:
        """The nodes where the pod of class ``ci`` on node ``n`` might go instead: the
        class's cells but ``n``, and for a class with at most one pod per node, but those
        its other pods hold (its cheapest node already holding one of them leaves the pod
        no cheaper place there)."""
        cells = np.asarray(self.cells[ci], dtype=np.int64)
        keep = cells != n
        if self.single[ci]:
            keep &= ~np.isin(cells, self.cur[ci])
        out: np.ndarray = cells[keep]
        return out

    def _regrets(self) -> list[tuple[int, int, int]]:
        """(minus the regret, class, node) of each pod that pays more than the cheapest
        node open to it (``_open``), largest regret first. A pod of a class with no cell
        (an answer the model would not give) is left as it is."""
        icost, out = self.icost, set()
        for ci, ns in enumerate(self.cur):
            if ci not in self.cells:
                continue
            for n in set(ns):
                cand = self._open(ci, n)
                lo = int(icost[ci][cand].min()) if len(cand) else None
                if lo is not None and int(icost[ci][n]) > lo:
                    out.add((lo - int(icost[ci][n]), ci, n))
        return sorted(out)

    def _free(self, on: np.ndarray, also: set[int]) -> np.ndarray:
        """The round's free cells: every cell on the ``on`` nodes, and the cells of the
        classes with a pod there (and ``also``) on spare nodes with room for one of their
        pods."""
        doms, specs = self.doms, self.specs
        movers = {ci for ci, ns in enumerate(self.cur) if on[ns].any()} | also
        goes = np.zeros((len(specs), len(self.room)), dtype=bool)
        for ci in movers:
            goes[ci] = self.spare & (self.room >= specs[ci].req).all(axis=1)
        free: np.ndarray = on[doms.node] | goes[doms.cls, doms.node]
        return free

    def _round(self, free: np.ndarray, det: float) -> bool:
        """Solve with only the ``free`` cells free; True when the answer is kept (better)."""
        from ortools.sat.python import cp_model  # lazily, as in cpsat

        m = self.cm.model
        self.doms.fix(free, self.val)
        if self.sol is not None:
            hint_all(m, self.sol)
        s = round_solver(self.cfg, det, self.clock)
        # the fixed variables propagate at once; a presolve of the whole model each round
        # took more CPU than the round's search
        s.parameters.cp_model_presolve = False
        c0 = self.clock.cpu()
        status = s.solve(m)
        took, done = self.clock.cpu() - c0, s.response_proto.deterministic_time
        self.work += done
        self.rate = work_rate(done, det, took, min_cpu=0.0) or self.rate
        if (status not in (cp_model.OPTIMAL, cp_model.FEASIBLE)
                or s.objective_value >= self.best - 0.5):
            return False
        self.best = s.objective_value
        self._keep(self.cm.placement(s, len(self.specs)))
        self.sol = list(s.response_proto.solution)
        return True


class RoundDomains:
    """The count variables' domains, set for each focused round. Only the cells whose domain
    changes are written: a round fixes thousands of cells, most to the value the round
    before fixed them to, and each write to the model's proto is a Python call (writing
    every fixed cell and restoring it after the solve was half of a round's CPU)."""

    def __init__(self, cm: ClassModel) -> None:
        keys = list(cm.x)
        self.cls = np.array([ci for ci, _ in keys], dtype=np.int64)
        self.node = np.array([n for _, n in keys], dtype=np.int64)
        self.pos = {k: j for j, k in enumerate(keys)}
        self.vars = [cm.model.proto.variables[v.index] for v in cm.x.values()]
        # each count variable is built as [0, top] (cpsat.class_model); the proto's
        # repeated fields take no negative index (``domain[-1]`` reads the first)
        self.lo0 = np.array([v.domain[0] for v in self.vars], dtype=np.int64)
        self.hi0 = np.array([v.domain[len(v.domain) - 1] for v in self.vars], dtype=np.int64)
        self.lo, self.hi = self.lo0.copy(), self.hi0.copy()

    def values(self, cur: Sequence[Sequence[int]]) -> np.ndarray:
        """Per cell, the pods the answer ``cur`` puts there."""
        val = np.zeros(len(self.vars), dtype=np.int64)
        for ci, ns in enumerate(cur):
            for n in ns:
                j = self.pos.get((ci, n))
                if j is not None:
                    val[j] += 1
        return val

    def fix(self, free: np.ndarray, val: np.ndarray) -> None:
        """The ``free`` cells as built, every other one fixed to ``val``."""
        lo = np.where(free, self.lo0, val)
        hi = np.where(free, self.hi0, val)
        for j in np.flatnonzero((lo != self.lo) | (hi != self.hi)).tolist():
            d = self.vars[j].domain
            d.clear()
            d.extend([int(lo[j]), int(hi[j])])
        self.lo, self.hi = lo, hi

    def restore(self) -> None:
        self.fix(np.ones(len(self.vars), dtype=bool), self.lo0)


def room_left(cur: Sequence[Sequence[int]], specs: Sequence[ClassSpec], free0: np.ndarray
              ) -> np.ndarray:
    """Each node's room left by the answer ``cur``."""
    room = free0.copy()
    for ci, ns in enumerate(cur):
        for n in ns:
            room[n] -= specs[ci].req
    return room


def room_share(room: np.ndarray, free0: np.ndarray) -> np.ndarray:
    """Per node, the lesser of its CPU and memory room left as a share of what was free
    before the batch."""
    share: np.ndarray = (room[:, :2] / np.maximum(free0[:, :2], 1)).min(axis=1)
    return share


def spare_nodes(room: np.ndarray, free0: np.ndarray) -> np.ndarray:
    """The ``FOCUS_SPARE_NODES`` nodes with the most room left (the lesser of CPU and
    memory, as a share of what was free before the batch): where a focused round's movers
    may go."""
    share = room_share(room, free0)
    spare = np.zeros(len(room), dtype=bool)
    spare[np.argsort(-share, kind="stable")[:FOCUS_SPARE_NODES]] = True
    return spare


def hint_all(m: cp_model.CpModel, sol: Sequence[int]) -> None:
    """Every variable hinted with ``sol``, straight into the proto (the library's
    per-variable look-up and add_hint took a third of a round's CPU)."""
    m.clear_hints()  # type: ignore[no-untyped-call]
    m.proto.solution_hint.vars.extend(range(len(sol)))
    m.proto.solution_hint.values.extend(sol)


def round_solver(cfg: EngineConfig, det_time: float, clock: StepClock) -> cp_model.CpSolver:
    """A solver of the exact step: ``det_time`` of work, ``exact_workers`` workers, the
    wall-clock cap within the step's safety net."""
    s = cp_solver(cfg, det_time)
    s.parameters.num_workers = max(cfg.exact_workers, 1)
    s.parameters.max_time_in_seconds = max(min(cfg.cpsat_wall_cap_s, clock.wall_left()), 1e-3)
    return s
