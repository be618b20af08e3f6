"""Min-cost flow steps of the solver (``ortools.graph``'s min-cost flow).

* ``class_flow``: class -> node arcs, exact when the constraints decompose, pruned to the
  cheapest nodes per class;
* ``flow_route``: the loose batch's route -- flow rounds on the residual capacity, each
  replayed through the exact packer, a cheapest-feasible fill, gangs all-or-nothing;
* ``slot_flow``: cost among the pods that fit, the count kept -- pods into *slots* (each
  placed pod's requests on its node, each node's free rest).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
from ortools.graph.python import min_cost_flow

from .classes import (
    HOST,
    ClassSpec,
    Packer,
    capacity_per_node,
    drop_partial_gangs,
    fill,
    replay,
    rigidity_order,
)
from .config import EngineConfig


def class_flow(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
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


def flow_route(classes: Sequence[ClassSpec], free: np.ndarray,
                domains: Mapping[str, np.ndarray], icost: list[np.ndarray], penalty: int,
                cfg: EngineConfig, stats: dict[str, float]
                ) -> tuple[list[list[int]], str, int]:
    """Cost first: flow rounds on the residual capacity with exact packing, a
    cheapest-feasible fill, gangs all-or-nothing. Returns (placement, method, arcs)."""
    pk = Packer(free, domains, classes)
    got: list[list[int]] = [[] for _ in classes]
    order = rigidity_order(classes)
    method = "flow"
    arcs_total = 0
    for rnd in range(max(cfg.flow_rounds, 1)):
        active = [ci for ci in range(len(classes)) if len(got[ci]) < classes[ci].count]
        if not active:
            break
        sub = [dataclasses.replace(classes[ci], count=classes[ci].count - len(got[ci]),
                                   mask=pk.candidates(ci)) for ci in active]
        wanted, arcs, pruned = class_flow(sub, pk.free, domains, [icost[ci] for ci in active],
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
    fill(pk, got, skip_gangs=False)
    if drop_partial_gangs(classes, got):
        pk = replay(classes, free, domains, got)
        fill(pk, got, skip_gangs=True)
    return got, method, arcs_total


def slot_flow(classes: Sequence[ClassSpec], free: np.ndarray, icost: list[np.ndarray],
               penalty: int, got: list[list[int]], cfg: EngineConfig) -> list[list[int]]:
    """Cost among the pods that fit, without losing any: a min-cost flow of pods into
    *slots* -- each placed pod's requests on its node, and each node's free rest -- where a
    pod may take a slot only if the slot holds it in every resource and the node is
    allowed. Whatever goes where, no node holds more than before, so the count is kept
    (every pod may stay in its own slot) and left-out pods may still take a free rest
    (at the penalty, so count still comes first). Classes with anti-affinity or gangs stay
    where they are. Exact, and fast: the flow has one arc per (class, slot shape) kept."""
    fixed = [bool(c.conflicts) or c.gang is not None for c in classes]
    slots = _slots(classes, free, got, fixed)
    if slots is None:
        return got
    s_node, s_req, mult = slots
    ns = s_node.size
    movable = [ci for ci in range(len(classes)) if not fixed[ci]]
    nc = len(movable)
    sink = nc + ns
    tails: list[np.ndarray] = []
    heads: list[np.ndarray] = []
    caps: list[np.ndarray] = []
    costs: list[np.ndarray] = []
    meaning: list[tuple[int, int, np.ndarray]] = []
    n_arcs = 0
    supply = np.zeros(sink + 1, dtype=np.int64)
    for j, ci in enumerate(movable):
        c = classes[ci]
        supply[j] = c.count
        ok = c.mask[s_node]
        for r in range(3):
            if c.req[r]:
                ok &= s_req[:, r] >= c.req[r]
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            continue
        cst = icost[ci][s_node[idx]]
        want = max(int(cfg.flow_arc_slack * c.count), cfg.flow_min_arcs)
        if idx.size > want:
            # the cheapest slots, and always the slots of its own pods (it may stay)
            # (every slot on a node of its pods: ``uniq`` is sorted by node, so those are
            # ranges -- one searchsorted instead of a set test over all slots)
            own = np.zeros(ns, dtype=bool)
            its = np.unique(np.asarray(got[ci], dtype=np.int64))
            if its.size:
                lo_s = np.searchsorted(s_node, its, "left")
                hi_s = np.searchsorted(s_node, its, "right")
                marks = np.zeros(ns + 1, dtype=np.int64)
                np.add.at(marks, lo_s, 1)
                np.add.at(marks, hi_s, -1)
                own = np.cumsum(marks[:ns]) > 0
            keep = np.zeros(idx.size, dtype=bool)
            keep[np.argsort(cst, kind="stable")[:want]] = True
            keep |= own[idx]
            idx, cst = idx[keep], cst[keep]
        tails.append(np.full(idx.size, j))
        heads.append(nc + idx)
        caps.append(np.minimum(mult[idx], c.count))
        costs.append(cst)
        meaning.append((n_arcs, ci, idx))
        n_arcs += idx.size
    tails.append(nc + np.arange(ns))
    heads.append(np.full(ns, sink))
    caps.append(mult)
    costs.append(np.zeros(ns, dtype=np.int64))
    tails.append(np.arange(nc))
    heads.append(np.full(nc, sink))
    caps.append(supply[:nc].copy())
    costs.append(np.full(nc, penalty))
    supply[sink] = -int(supply[:nc].sum())
    mcf = min_cost_flow.SimpleMinCostFlow()
    mcf.add_arcs_with_capacity_and_unit_cost(
        np.concatenate(tails).astype(np.int32), np.concatenate(heads).astype(np.int32),
        np.concatenate(caps).astype(np.int64), np.concatenate(costs).astype(np.int64))
    mcf.set_nodes_supplies(np.arange(sink + 1, dtype=np.int32), supply)
    if mcf.solve() != mcf.OPTIMAL:
        return got
    out = [list(g) if fixed[ci] else [] for ci, g in enumerate(got)]
    for start, ci, idx in meaning:
        fl = mcf.flows(np.arange(start, start + idx.size, dtype=np.int32))
        nz = np.flatnonzero(fl)
        out[ci].extend(np.repeat(s_node[idx[nz]], fl[nz]).tolist())
    return out


def _slots(classes: Sequence[ClassSpec], free: np.ndarray, got: list[list[int]],
           fixed: list[bool]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The slots of ``slot_flow``, distinct (sorted by node, then shape): each placed pod's
    requests on its node (pods of ``fixed`` classes only take room) and each node's free
    rest; as (node, requests, how many alike). None: no slot at all."""
    used = np.zeros_like(free)
    slot_n: list[int] = []
    slot_r: list[np.ndarray] = []
    for ci, nodes in enumerate(got):
        for n in nodes:
            used[n] += classes[ci].req
            if not fixed[ci]:
                slot_n.append(n)
                slot_r.append(classes[ci].req)
    rest = free - used
    for n in np.flatnonzero((rest > 0).any(axis=1)).tolist():
        slot_n.append(n)
        slot_r.append(rest[n])
    if not slot_n:
        return None
    sn = np.asarray(slot_n, dtype=np.int64)
    sr = np.asarray(slot_r, dtype=np.int64)
    key = np.concatenate([sn[:, None], sr], axis=1)
    uniq, mult = np.unique(key, axis=0, return_counts=True)
    return uniq[:, 0], uniq[:, 1:], mult
