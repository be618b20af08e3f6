"""CP-SAT neighbourhoods over a packing (``packing.Pack``): for count (``lns``: a left-out
pod, the nodes closest to fitting it and roomy nodes its neighbours may move to) and for cost
among the pods that fit (``cost_lns``: largest regret first). Each neighbourhood's pods are
re-placed exactly by the class-level CP-SAT model (``cpsat.cpsat``), kept only when strictly
better. Seeded and bounded by counts and CP-SAT's deterministic time: deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

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
    ``cost_lns_settled_passes``."""
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
    for _pass in range(max(passes, 1)):
        regret: list[tuple[int, int, int]] = []
        total = 0
        for ci, nodes in enumerate(pa.got):
            c = classes[ci]
            if not nodes or c.gang is not None:
                continue
            ic = pa.icost[ci]
            total += int(ic[np.asarray(nodes)].sum())
            lo = int(ic[c.mask].min())
            for n in set(nodes):
                if int(ic[n]) > lo:
                    regret.append((lo - int(ic[n]), ci, n))
        regret.sort()
        seen: set[int] = set()
        start = done
        for _, ci, n in regret:
            if done >= cfg.cost_lns_iterations or not budget.open():
                break
            if n not in pa.got[ci] or (n in seen and not every):
                continue
            if ci not in room:
                # a node without room for one pod of the class, whatever moves, is no
                # cheaper place for it: a 2-GPU pod passes the filters of every cpu-only
                # node, and those were its cheapest (the SLA family's 300 x 60, seed 3:
                # two such pods stayed on a node dearer by 1.5-1.8 $/h each). The regret
                # stays against every allowed node: against these alone, the order of
                # the neighbourhoods moved the tight family's prices (mean +1.2 %, seeds
                # 1-5) and the SLA family's 200 x 40, seed 12 placed one pod fewer
                c = classes[ci]
                room[ci] = np.flatnonzero(c.mask & has_room(c.req, free))
            cand = room[ci]
            cheap = cand[np.argsort(pa.icost[ci][cand], kind="stable")[:cfg.lns_near]]
            pick = {n, *cheap.tolist()}
            if every and pick <= seen:
                continue
            if cfg.cost_lns_slack:
                pick.update(_roomy(pa, sorted(pick), cfg.cost_lns_slack))
            seen.update(pick)
            _solve_sub(pa, np.array(sorted(pick), dtype=np.int64), domains, penalty,
                       cfg, budget, count_only=False,
                       det_time=det)
            done += 1
        after = sum(int(pa.icost[ci][np.asarray(g)].sum())
                    for ci, g in enumerate(pa.got) if g and classes[ci].gang is None)
        if (done == start or after >= total or done >= cfg.cost_lns_iterations
                or not budget.open()):
            break
    return done


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


def _roomy(pa: Pack, nodes: list[int], k: int) -> list[int]:
    """The ``k`` nodes with the most room (least normalised free resource among those
    asked for) where the pods on ``nodes`` may go instead; ties by index."""
    may, dims = _reach(pa, nodes, np.zeros(3, dtype=bool))
    others = np.flatnonzero(may)
    if not others.size or not dims.any():
        return []
    slack = (pa.pk.free[others][:, dims] * pa.inv[others][:, dims]).min(axis=1)
    result: list[int] = others[np.argsort(-slack, kind="stable")[:k]].tolist()
    return result


def _solve_sub(pa: Pack, nodes: np.ndarray, domains: Mapping[str, np.ndarray], penalty: int,
               cfg: EngineConfig, budget: Budget, count_only: bool = True,
               det_time: float | None = None) -> None:
    """Re-place every pod on ``nodes`` and left-out pods that may go there by CP-SAT; kept
    only when strictly better (count first, then cost, or count alone)."""
    classes = pa.classes
    removed: list[tuple[int, int]] = [(cj, int(n)) for n in nodes.tolist()
                                      for cj in pa.on[n]
                                      if classes[cj].gang is None]
    for cj, n in removed:
        pa.take(cj, n)
    inside = {cj for cj, _ in removed}
    extra = [ci for ci, c in enumerate(classes)
             if ci not in inside and c.gang is None and len(pa.got[ci]) < c.count
             and c.mask[nodes].any()][:cfg.lns_extra_classes]
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
            count=c.count - len(pa.got[ci]), req=c.req,
            mask=pa.pk.unblocked(ci)[nodes], cost=c.cost[nodes],
            conflicts={k: v for k, v in conf.items() if v}))
    before += penalty * sum(sc.count - len(h) for sc, h in zip(sub, hint, strict=True))
    sub_free = pa.pk.free[nodes]
    sub_dom = {k: domains[k][nodes] for k in domains}
    sub_cost = [pa.icost[ci][nodes] for ci in members]
    res = cpsat(sub, sub_free, sub_dom, sub_cost, penalty, hint, cfg,
                det_time=det_time or cfg.lns_deterministic_time, budget=budget,
                count_only=count_only, presolve=False)
    pa.work += 1
    better = res is not None and res[1] < before
    new = res[0] if better and res is not None else hint
    for j, ci in enumerate(members):
        for ln in new[j]:
            pa.put(ci, int(nodes[ln]))
