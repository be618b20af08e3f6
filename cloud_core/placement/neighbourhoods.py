"""CP-SAT neighbourhoods over a packing (``packing.Pack``): for count (``lns``: a left-out
pod, the nodes closest to fitting it and roomy nodes its neighbours may move to) and for cost
among the pods that fit (``cost_lns``: largest regret first). Each neighbourhood's pods are
re-placed exactly by the class-level CP-SAT model (``cpsat.cpsat``), kept only when strictly
better. Once the count is settled, cost neighbourhoods on nodes apart are solved two at a
time, the second on a helper thread (``_solve_pair``). Seeded and bounded by counts and
CP-SAT's deterministic time: deterministic (the pairs too: which two, and which answers
stand, never depends on which finishes first).
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from .budget import Budget
from .classes import ClassSpec, has_room, most
from .config import EngineConfig
from .cpsat import cpsat
from .packing import Pack


def lns(pa: Pack, free: np.ndarray, domains: Mapping[str, np.ndarray], penalty: int,
        cfg: EngineConfig, budget: Budget) -> int:
    """Large neighbourhood search for count: take a left-out pod, the ``lns_near`` nodes
    it may use that are closest to fitting it, and ``lns_slack`` nodes with the most
    room among those the pods already there may move to; every pod on them and the
    left-out pods that could go there are re-placed exactly by CP-SAT (most pods, then
    least cost), kept only when strictly better. A pod that fails ``lns_tries`` times is
    given up. Seeded and bounded by counts and the step's ``budget``."""
    classes = pa.classes
    rng = random.Random(cfg.cpsat_seed)
    solved = 0
    fails: dict[int, int] = {}
    # at most as many as an allowed node's room and the class's anti-affinity to itself
    # allow (classes.most): a class at that bound is not tried
    tops = [most(ci, c, free, domains) for ci, c in enumerate(classes)]
    for _ in range(cfg.lns_iterations):
        if not budget.open():
            break
        out = [ci for ci, c in enumerate(classes)
               if len(pa.got[ci]) < min(c.count, tops[ci]) and c.gang is None
               and fails.get(ci, 0) < cfg.lns_tries]
        if not out:
            break
        ci0 = out[rng.randrange(len(out))]
        room = np.flatnonzero(pa.pk.unblocked(ci0))
        if room.size == 0:
            fails[ci0] = cfg.lns_tries
            continue
        req = classes[ci0].req
        short = (np.maximum(req - pa.pk.free[room], 0) * pa.inv[room]).sum(axis=1)
        near = room[np.argsort(short, kind="stable")[:2 * cfg.lns_near]].tolist()
        pick = rng.sample(near, min(cfg.lns_near, len(near)))
        # where the pods on those nodes could go instead
        may, dims = _reach(pa, pick, req > 0)
        others = np.flatnonzero(may)
        if others.size and dims.any():
            # a pod that failed gets a wider neighbourhood: a large pod needs the
            # scattered room of many nodes
            k = cfg.lns_slack + cfg.lns_grow * fails.get(ci0, 0)
            # room in the resources these pods ask for (a GPU pod's GPUs, not a
            # cpu-only pod's zero GPUs)
            slack = (pa.pk.free[others][:, dims] * pa.inv[others][:, dims]).min(axis=1)
            top = others[np.argsort(-slack, kind="stable")[:2 * k]].tolist()
            pick += rng.sample(top, min(k, len(top)))
        det = cfg.lns_deterministic_time
        if fails.get(ci0, 0) and dims[2] and cfg.lns_gpu_ring:
            pick += _gpu_ring(pa, pick, may, cfg, rng)
            det = cfg.lns_gpu_deterministic_time
        before = len(pa.got[ci0])
        _solve_sub(pa, np.array(sorted(pick), dtype=np.int64), domains, penalty, cfg,
                   budget, det_time=det)
        solved += 1
        if len(pa.got[ci0]) == before:
            fails[ci0] = fails.get(ci0, 0) + 1
    return solved


def _gpu_ring(pa: Pack, pick: list[int], may: np.ndarray, cfg: EngineConfig,
              rng: random.Random) -> list[int]:
    """For a GPU pod that failed once: up to ``lns_gpu_ring`` nodes with GPUs that the
    pods of the neighbourhood may use (most free GPUs first), and ``lns_slack`` nodes
    with the most room for the pods on *those*. GPUs are packed to the last one, so
    freeing a large GPU node moves its GPU pods across many GPU nodes, and each of
    those takes them only if cpu pods there that tolerate the taint move on to cpu
    nodes: a chain the first ring leaves out (measured: the 8-GPU pod of the 300 x 60
    tight instance, seed 2, placed only with this ring)."""
    classes = pa.classes
    gpus = may & pa.gpu_nodes
    gpus[pick] = False
    idx = np.flatnonzero(gpus)
    ring: list[int] = idx[np.lexsort((idx, -pa.pk.free[idx, 2]))[:cfg.lns_gpu_ring]].tolist()
    may2 = np.zeros_like(may)
    dims = np.zeros(3, dtype=bool)
    for n in ring:
        for cj in set(pa.on[n]):
            may2 |= classes[cj].mask
            dims |= classes[cj].req > 0
    may2[pick + ring] = False
    others = np.flatnonzero(may2)
    if not ring or not others.size or not dims.any():
        return ring
    slack = (pa.pk.free[others][:, dims] * pa.inv[others][:, dims]).min(axis=1)
    top: list[int] = others[np.argsort(-slack, kind="stable")[:2 * cfg.lns_slack]].tolist()
    return ring + rng.sample(top, min(cfg.lns_slack, len(top)))


def cost_lns(pa: Pack, free: np.ndarray, domains: Mapping[str, np.ndarray], penalty: int,
             cfg: EngineConfig, budget: Budget, left: int) -> int:
    """Cost among the pods that fit: for the pods that pay most above their cheapest
    allowed node (largest regret first), a neighbourhood of their node, the ``lns_near``
    cheapest allowed nodes with room for one of them before the batch (``free``) and the
    ``cost_lns_slack`` nodes with the most room for the pods on those (``_roomy``: on
    nearly full nodes a cheaper place opens only if its pods move on), re-placed by CP-SAT
    with the full objective (count first, then cost), ``cost_lns_deterministic_time`` each
    -- never fewer pods. Up to ``cost_lns_passes`` passes (regrets recomputed), while a
    pass lowers the cost; ``cost_lns_iterations`` neighbourhoods in all, within the step's
    ``budget``. Within a pass, a neighbourhood whose nodes were all in earlier ones is
    skipped; while pods of the batch are out, so is any on a node an earlier one held.
    ``left``: the pods an allowed node could hold that are still out. Where a step budget
    holds and none is (the count settled), ``cost_lns_settled_deterministic_time`` each and
    ``cost_lns_settled_passes``. With none out and ``cost_lns_threads`` > 1, neighbourhoods
    are solved two at a time (``_second``, ``_solve_pair``)."""
    classes = pa.classes
    done = 0
    room: dict[int, np.ndarray] = {}  # per class, the allowed nodes with room for a pod
    settled = not left and budget.clock.limited
    # Every pod of the batch placed: the neighbourhoods are for cost alone, and a node an
    # earlier one of the pass held no longer hides the neighbourhood of another pod on it.
    # A GPU pod's regret (against the cpu-only nodes its filters pass) led every pass; its
    # neighbourhood held its node, and the cpu pods there that paid most above their
    # cheapest node never had one of their own (the tight family at 80 x 16, seed 3: one
    # pod at 6.19 $/h, 0.40 on its cheapest node; +11 % over the reference, +0.3 % with
    # this). While pods are out, these neighbourhoods place them too, and their order stays
    # as it was: with this, tight 80 seed 10 and SLA 200 seed 12 each placed one pod fewer.
    every = all(len(g) == c.count for g, c in zip(pa.got, classes, strict=True))
    det, passes = ((cfg.cost_lns_settled_deterministic_time, cfg.cost_lns_settled_passes)
                   if settled else (cfg.cost_lns_deterministic_time, cfg.cost_lns_passes))
    # two at a time once no pod an allowed node could hold is out (the count settled); the
    # second re-places only the pods on its nodes (``_prepare``'s ``own``): a left-out pod
    # offered to both could be placed twice
    width = 2 if not left and threads(cfg) > 1 else 1
    with (ThreadPoolExecutor(1, thread_name_prefix="cfnet-cost-lns") if width > 1
          else nullcontext()) as pool:
        for _pass in range(max(passes, 1)):
            total = _regret_cost(pa)
            queue = deque((ci, n) for _, ci, n in _regrets(pa))
            seen: set[int] = set()
            start = done
            while queue and done < cfg.cost_lns_iterations and budget.open():
                first: list[int] | None = None
                while queue and first is None:
                    ci, n = queue.popleft()
                    first = _cost_pick(pa, ci, n, seen, every, free, room, cfg)
                if first is None:
                    break
                seen.update(first)
                second = None
                if pool is not None and done + 1 < cfg.cost_lns_iterations:
                    second = _second(pa, queue, first, seen, every, free, room, cfg)
                if second is None or pool is None:
                    _solve_sub(pa, np.array(first, dtype=np.int64), domains, penalty, cfg,
                               budget, count_only=False, det_time=det)
                    done += 1
                    continue
                # the second's nodes hide no later neighbourhood of the pass: it was chosen
                # apart from the first's, not for its own pod alone (with them in ``seen``,
                # the tight family's 80-120 pods, seeds 1-12: mean +2.18 %, against +1.58 %)
                if not _solve_pair(pa, np.array(first, dtype=np.int64),
                                   np.array(second[1], dtype=np.int64), domains, penalty,
                                   cfg, budget, det, pool):
                    # the second's pods no longer fit where it put them (anti-affinity
                    # across its nodes and the first's): it comes again
                    queue.appendleft(second[0])
                done += 2
            after = _regret_cost(pa)
            if (done == start or after >= total or done >= cfg.cost_lns_iterations
                    or not budget.open()):
                break
    return done


def threads(cfg: EngineConfig) -> int:
    """How many cost neighbourhoods are solved at a time: ``cost_lns_threads``, at most
    the CPUs this process may run on."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    return max(1, min(cfg.cost_lns_threads, cpus))


def _regret_cost(pa: Pack) -> int:
    """The cost of the placed pods outside gangs (what the cost neighbourhoods lower)."""
    return sum(int(pa.icost[ci][np.asarray(g)].sum())
               for ci, g in enumerate(pa.got) if g and pa.classes[ci].gang is None)


def _regrets(pa: Pack) -> list[tuple[int, int, int]]:
    """(minus the regret, class, node) per class and node it pays above its cheapest
    allowed node, outside gangs: largest regret first."""
    regret: list[tuple[int, int, int]] = []
    for ci, nodes in enumerate(pa.got):
        c = pa.classes[ci]
        if not nodes or c.gang is not None:
            continue
        ic = pa.icost[ci]
        lo = int(ic[c.mask].min())
        for n in set(nodes):
            if int(ic[n]) > lo:
                regret.append((lo - int(ic[n]), ci, n))
    regret.sort()
    return regret


def _second(pa: Pack, queue: deque[tuple[int, int]], first: list[int], seen: set[int],
            every: bool, free: np.ndarray, room: dict[int, np.ndarray], cfg: EngineConfig
            ) -> tuple[tuple[int, int], list[int]] | None:
    """A neighbourhood to solve beside ``first``: among the next ``cost_lns_pair_window``
    of the queue, the first whose pod, node and cheapest nodes are apart from ``first``'s
    nodes (its roomy nodes then chosen apart too), taken out of the queue; None if none is.
    Apart, both answers stand together."""
    apart = set(first)
    for i, (ci, n) in enumerate(list(itertools.islice(queue, cfg.cost_lns_pair_window))):
        pick = _cost_pick(pa, ci, n, seen, every, free, room, cfg, apart)
        if pick is not None:
            del queue[i]
            return (ci, n), pick
    return None


def _cost_pick(pa: Pack, ci: int, n: int, seen: set[int], every: bool, free: np.ndarray,
               room: dict[int, np.ndarray], cfg: EngineConfig,
               apart: set[int] | None = None) -> list[int] | None:
    """The nodes of class ``ci``'s cost neighbourhood from node ``n`` (``cost_lns``), or
    None where it is skipped: the pod left ``n``, or the pass's earlier neighbourhoods
    (``seen``) hold it, or it would share a node with ``apart``."""
    if n not in pa.got[ci] or (n in seen and not every):
        return None
    if ci not in room:
        # a node without room for one pod of the class, whatever moves, is no cheaper
        # place for it: a 2-GPU pod passes the filters of every cpu-only node, and those
        # were its cheapest (the SLA family's 300 x 60, seed 3: two such pods stayed on a
        # node dearer by 1.5-1.8 $/h each). The regret stays against every allowed node:
        # against these alone, the order of the neighbourhoods moved the tight family's
        # prices (mean +1.2 %, seeds 1-5) and the SLA family's 200 x 40, seed 12 placed
        # one pod fewer
        c = pa.classes[ci]
        room[ci] = np.flatnonzero(c.mask & has_room(c.req, free))
    cand = room[ci]
    cheap = cand[np.argsort(pa.icost[ci][cand], kind="stable")[:cfg.lns_near]]
    pick = {n, *cheap.tolist()}
    if (every and pick <= seen) or (apart and pick & apart):
        return None
    if cfg.cost_lns_slack:
        pick.update(_roomy(pa, sorted(pick), cfg.cost_lns_slack, apart))
    return sorted(pick)


def _reach(pa: Pack, nodes: list[int], dims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the pods on ``nodes`` may go instead (a mask without ``nodes``), and the
    resources asked for: ``dims`` and those the pods ask for."""
    may = np.zeros(pa.pk.free.shape[0], dtype=bool)
    dims = dims.copy()
    for n in nodes:
        for cj in set(pa.on[n]):
            may |= pa.classes[cj].mask
            dims |= pa.classes[cj].req > 0
    may[nodes] = False
    return may, dims


def _roomy(pa: Pack, nodes: list[int], k: int, apart: set[int] | None = None) -> list[int]:
    """The ``k`` nodes with the most room (least normalised free resource among those
    asked for) where the pods on ``nodes`` may go instead, none of ``apart``; ties by
    index."""
    may, dims = _reach(pa, nodes, np.zeros(3, dtype=bool))
    if apart:
        may[sorted(apart)] = False
    others = np.flatnonzero(may)
    if not others.size or not dims.any():
        return []
    slack = (pa.pk.free[others][:, dims] * pa.inv[others][:, dims]).min(axis=1)
    result: list[int] = others[np.argsort(-slack, kind="stable")[:k]].tolist()
    return result


@dataclass
class _Sub:
    """A neighbourhood's sub-problem: its nodes, the pods taken off them (class, node),
    the classes it re-places and their model, and the price of the pods as they were."""

    nodes: np.ndarray
    removed: list[tuple[int, int]]
    members: list[int]
    classes: list[ClassSpec]
    hint: list[list[int]]
    free: np.ndarray
    domains: dict[str, np.ndarray]
    icost: list[np.ndarray]
    before: int


def _prepare(pa: Pack, nodes: np.ndarray, domains: Mapping[str, np.ndarray], penalty: int,
             cfg: EngineConfig, own: bool = False) -> _Sub:
    """Take every pod on ``nodes`` off (outside gangs) and state their sub-problem, with
    the left-out pods that may go there (``own``: those pods alone)."""
    classes = pa.classes
    removed: list[tuple[int, int]] = [(cj, int(n)) for n in nodes.tolist()
                                      for cj in pa.on[n]
                                      if classes[cj].gang is None]
    for cj, n in removed:
        pa.take(cj, n)
    inside = {cj for cj, _ in removed}
    extra = [ci for ci, c in enumerate(classes)
             if not own and ci not in inside and c.gang is None
             and len(pa.got[ci]) < c.count and c.mask[nodes].any()][:cfg.lns_extra_classes]
    members = sorted(inside | set(extra))
    pos = {ci: j for j, ci in enumerate(members)}
    sub: list[ClassSpec] = []
    hint: list[list[int]] = [[] for _ in members]
    local = {int(n): j for j, n in enumerate(nodes.tolist())}
    before = 0
    for cj, n in removed:
        hint[pos[cj]].append(local[n])
        before += int(pa.icost[cj][n])
    for ci in members:
        c = classes[ci]
        conf = {k: [pos[o] for o in others if o in pos]
                for k, others in c.conflicts.items()}
        sub.append(ClassSpec(
            count=len(hint[pos[ci]]) if own else c.count - len(pa.got[ci]), req=c.req,
            mask=pa.pk.unblocked(ci)[nodes], cost=c.cost[nodes],
            conflicts={k: v for k, v in conf.items() if v}))
    before += penalty * sum(sc.count - len(h) for sc, h in zip(sub, hint, strict=True))
    return _Sub(nodes, removed, members, sub, hint, pa.pk.free[nodes],
                {k: domains[k][nodes] for k in domains},
                [pa.icost[ci][nodes] for ci in members], before)


def _run(sb: _Sub, penalty: int, cfg: EngineConfig, budget: Budget, count_only: bool,
         det_time: float) -> list[list[int]] | None:
    """Solve ``sb`` by CP-SAT: its new placement where strictly better, else None. Touches
    no packing: it may run beside the deciding thread (``_solve_pair``)."""
    res = cpsat(sb.classes, sb.free, sb.domains, sb.icost, penalty, sb.hint, cfg,
                det_time=det_time, budget=budget, count_only=count_only, presolve=False)
    return res[0] if res is not None and res[1] < sb.before else None


def _put(pa: Pack, sb: _Sub, new: list[list[int]]) -> None:
    """Put ``sb``'s pods where ``new`` says (local node indices)."""
    for j, ci in enumerate(sb.members):
        for ln in new[j]:
            pa.put(ci, int(sb.nodes[ln]))


def _solve_sub(pa: Pack, nodes: np.ndarray, domains: Mapping[str, np.ndarray], penalty: int,
               cfg: EngineConfig, budget: Budget, count_only: bool = True,
               det_time: float | None = None) -> bool:
    """Re-place every pod on ``nodes`` and left-out pods that may go there by CP-SAT; kept
    only when strictly better (count first, then cost, or count alone). True when kept."""
    sb = _prepare(pa, nodes, domains, penalty, cfg)
    new = _run(sb, penalty, cfg, budget, count_only, det_time or cfg.lns_deterministic_time)
    pa.work += 1
    _put(pa, sb, new if new is not None else sb.hint)
    return new is not None


def _solve_pair(pa: Pack, first: np.ndarray, second: np.ndarray,
                domains: Mapping[str, np.ndarray], penalty: int, cfg: EngineConfig,
                budget: Budget, det_time: float, pool: Executor) -> bool:
    """Two cost neighbourhoods on nodes apart, at once, once the count is settled: both
    stated on the packing as it is, the second solved on ``pool``'s thread while this one
    solves the first (CP-SAT lets go of the GIL while it searches: twice the
    neighbourhoods in the same wall time). The second re-places the pods on its nodes alone
    (a left-out pod offered to both could be placed twice). Each answer is kept where
    strictly better, as ``_solve_sub`` keeps it; the second's only if its pods still fit
    where it puts them after the first's (anti-affinity spans nodes): False where it is
    dropped. The step's
    CPU budget counts the deciding thread's CPU, and the time it waits for the second
    (``Budget.absorb``)."""
    a = _prepare(pa, first, domains, penalty, cfg)
    _put(pa, a, a.hint)
    b = _prepare(pa, second, domains, penalty, cfg, own=True)
    _put(pa, b, b.hint)
    side = budget.beside(det_time)
    later = pool.submit(_run, b, penalty, cfg, side, False, det_time)
    try:
        new_a = _run(a, penalty, cfg, budget, False, det_time)
    finally:
        waited = time.perf_counter()
        new_b = later.result()
        budget.absorb(side, time.perf_counter() - waited)
    pa.work += 2
    if new_a is not None:
        _take(pa, a)
        _put(pa, a, new_a)
    if new_b is None:
        return True
    _take(pa, b)
    done: list[tuple[int, int]] = []
    for j, ci in enumerate(b.members):
        for ln in new_b[j]:
            n = int(b.nodes[ln])
            if not pa.pk.ok(ci, n):
                for cj, m in reversed(done):
                    pa.take(cj, m)
                _put(pa, b, b.hint)
                return False
            pa.put(ci, n)
            done.append((ci, n))
    return True


def _take(pa: Pack, sb: _Sub) -> None:
    """Take ``sb``'s pods off again (as ``_prepare`` found them)."""
    for cj, n in sb.removed:
        pa.take(cj, n)
