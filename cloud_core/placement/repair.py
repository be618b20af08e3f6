"""The count repair after the pod-by-pod classes (``sequential.py``).

The pod-by-pod classes (spread, host ports, extended resources) are placed after the
solver's classes, which have by then taken the cpu, memory and pod slots of whatever nodes
were cheapest for them -- among them the few nodes with an FPGA or a free host port that a
pod-by-pod class may use at all. A pod left out that way gets one of those nodes when one
or two pods (``EngineConfig.eject_max_moves``) of the solver's classes there can move to
another node with room for them as it stands (an ejection of depth one); of the nodes that
can be freed, the one where the pod's cost and the moves' added cost are least wins. It
runs on the batches the exact step (``exact.py``) takes, after it: on the answer the exact
step kept, or the engine's where its CPU ran out first.

Only pods nothing else refers to are moved: classes of the solver's rounds without gangs,
without required pod (anti-)affinity of their own, and whose labels no term or spread
selector of the batch selects (moving them changes no other pod's constraint). The pod
placed must pass every filter, the pod-by-pod checks (extended resources, host ports, pod
slots) and its ``DoNotSchedule`` spread on the state after the moves; the caller validates
the whole answer and keeps the one before the repair if anything is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np

from .exact import running_after
from .filters import selector_matches, term_matches_pod
from .model import RunningPod, Workload
from .prepared import ClusterView, all_ok, request_vector
from .sequential import BIG, NodeUsage, SpreadState

POOL = 8  # pods of one node an ejection chooses among


def _referenced(reps: list[Workload], ci: int) -> bool:
    """Does a term or spread selector of any class of the batch select class ``ci``?"""
    w = reps[ci]
    for o in reps:
        for t in (*o.pod_affinity, *o.pod_anti_affinity,
                  *(t for _, t in o.preferred_pod_affinity),
                  *(t for _, t in o.preferred_pod_anti_affinity)):
            if term_matches_pod(t, o.namespace, w.namespace, w.labels):
                return True
        if o.namespace == w.namespace and any(selector_matches(c.selector, w.labels)
                                              for c in o.spread):
            return True
    return False


def movable_classes(reps: list[Workload], seq: set[int]) -> set[int]:
    """The classes whose pods the repair may move (see the module docstring)."""
    return {ci for ci, w in enumerate(reps)
            if ci not in seq and w.gang is None and not w.pod_affinity
            and not w.pod_anti_affinity and not _referenced(reps, ci)}


def repair_count(pc: ClusterView, reps: list[Workload], members: list[list[Workload]],
                 seq: set[int], placed_nodes: list[list[int]], pods0: Sequence[RunningPod],
                 costs: dict[int, np.ndarray]) -> int:
    """Place left-out pods of the ``seq`` classes by moving pods of movable classes off the
    nodes that suit them; updates ``placed_nodes``, ``pc.free``, ``pc.ix.alloc`` and
    ``pc.pods`` (rebuilt from ``pods0`` and ``placed_nodes``). Returns the pods placed."""
    # gangs are all-or-nothing (drop_partial_gangs has had its say): never topped up
    short = [ci for ci in sorted(seq) if len(placed_nodes[ci]) < len(members[ci])
             and reps[ci].gang is None]
    depth = pc.cfg.eject_max_moves
    movable = movable_classes(reps, seq) if short and depth > 0 else set()
    if not movable:
        return 0
    names = pc.ix.names()
    limit = pc.ix.max_pods(BIG)
    unbounded = np.full(pc.ix.n, BIG, dtype=np.int64)
    reqs = {cm: request_vector(reps[cm]) for cm in movable}
    # where a movable class may go (its own pods don't repel it: no anti-affinity of its
    # own, no term selects it); the pods the repair places change no filter of theirs
    # but anti-affinity of the placed pods to them, which validate catches
    masks = {cm: all_ok(pc.filter_results(reps[cm], resources=False)) for cm in movable}
    added = 0
    # hard spread last, as place_classes: the other pods are counted when they choose
    for ci in sorted(short, key=lambda ci: (any(c.hard for c in reps[ci].spread), ci)):
        w = reps[ci]
        req = request_vector(w)
        while len(placed_nodes[ci]) < len(members[ci]):
            pick = _best_ejection(pc, w, req, placed_nodes, movable, reqs, masks, costs,
                                  limit, unbounded, depth)
            if pick is None:
                break
            node, moves, price = pick
            if not np.isfinite(costs[ci][node]):  # priced over the nodes its first pod saw
                costs[ci][node] = price
            for cm, k, dest in moves:
                placed_nodes[cm][k] = dest
                pc.free[node] += reqs[cm]
                pc.free[dest] -= reqs[cm]
            placed_nodes[ci].append(node)
            pc.free[node] -= req
            pc.ix.alloc = pc.ix.cap - pc.free
            pc.pods = running_after(members, placed_nodes, names, pods0)
            added += 1
    return added


def _best_ejection(pc: ClusterView, w: Workload, req: np.ndarray,
                   placed_nodes: list[list[int]], movable: set[int],
                   reqs: dict[int, np.ndarray], masks: dict[int, np.ndarray],
                   costs: dict[int, np.ndarray], limit: np.ndarray, unbounded: np.ndarray,
                   depth: int) -> tuple[int, list[tuple[int, int, int]], float] | None:
    """The node for one more pod like ``w``, the moves ((class, member, node)) that make
    room there (at most ``depth`` pods moved) and the pod's cost there, the least added
    cost first; None when no node can be freed."""
    frs = pc.filter_results(w, resources=False)
    by_name = {f.name: f.ok for f in frs}
    ok = all_ok(frs)
    usage = NodeUsage(pc, pc.pods.all())
    slots = usage.pods.copy()
    usage.max_pods = unbounded  # pod slots are what an ejection frees: judged below
    um, _ = usage.mask(w)
    ok &= um
    for c in w.spread:
        if c.hard:
            ok &= SpreadState(pc, w, c, by_name["node_selector"] & by_name["node_affinity"],
                              by_name["taints"]).ok()
    if not ok.any():
        return None
    cost_w = pc.cost(w, ok)
    residents: dict[int, list[tuple[int, int]]] = {}
    for cm in movable:
        for k, n in enumerate(placed_nodes[cm]):
            if ok[n]:
                residents.setdefault(n, []).append((cm, k))
    best: tuple[float, int, list[tuple[int, int, int]]] | None = None
    for i in map(int, np.flatnonzero(ok)):
        room = pc.free[i] >= req
        if room.all() and slots[i] < limit[i]:
            if best is None or cost_w[i] < best[0]:
                best = (float(cost_w[i]), i, [])
            continue
        # one pod of each movable class is enough to try alone (its members are
        # interchangeable); groups of up to ``depth`` pods only where no smaller one frees
        # the node, drawn from at most ``depth`` pods per class and the POOL largest
        pool = _pool(residents.get(i, []), reqs, depth)
        for size in range(1, depth + 1):
            found = False
            for group in map(list, combinations(pool, size)):
                if size == 1 and group[0] != next(p for p in pool if p[0] == group[0][0]):
                    continue
                freed = sum((reqs[cm] for cm, _ in group), np.zeros_like(req))
                if not (pc.free[i] + freed >= req).all() or slots[i] - size >= limit[i]:
                    continue
                moves = _destinations(pc, group, i, reqs, masks, costs, slots, limit)
                if moves is None:
                    continue
                found = True
                extra = sum(float(costs[cm][d] - costs[cm][i]) for cm, _, d in moves)
                total = float(cost_w[i]) + extra
                if best is None or total < best[0]:
                    best = (total, i, moves)
            if found:
                break
    return None if best is None else (best[1], best[2], float(cost_w[best[1]]))


def _pool(residents: list[tuple[int, int]], reqs: dict[int, np.ndarray], depth: int
          ) -> list[tuple[int, int]]:
    """The pods of a node an ejection may move: at most ``depth`` per class, the ``POOL``
    that free the most cpu and memory (a node may hold hundreds of small pods)."""
    per: dict[int, int] = {}
    out: list[tuple[int, int]] = []
    for cm, k in residents:
        if per.get(cm, 0) < depth:
            per[cm] = per.get(cm, 0) + 1
            out.append((cm, k))
    out.sort(key=lambda p: (-int(reqs[p[0]][0]), -int(reqs[p[0]][1]), p))
    return out[:POOL]


def _destinations(pc: ClusterView, group: list[tuple[int, int]], i: int,
                  reqs: dict[int, np.ndarray],
                  masks: dict[int, np.ndarray], costs: dict[int, np.ndarray],
                  slots: np.ndarray, limit: np.ndarray) -> list[tuple[int, int, int]] | None:
    """The cheapest node with room for each pod of ``group`` (taken one after the other),
    never ``i``; None when one has none."""
    free = pc.free.copy()
    used = slots.copy()
    moves: list[tuple[int, int, int]] = []
    for cm, k in group:
        fit = masks[cm] & (free >= reqs[cm]).all(axis=1) & (used < limit)
        fit[i] = False
        if not fit.any():
            return None
        cand = np.where(fit, costs[cm], np.inf)
        d = int(np.argmin(cand))
        if not np.isfinite(cand[d]):
            return None
        free[d] -= reqs[cm]
        used[d] += 1
        moves.append((cm, k, d))
    return moves
