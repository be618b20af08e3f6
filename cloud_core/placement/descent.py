"""Cost among the pods that fit, the count kept exactly: the cost descent (relocate, swap
and chain moves, largest regret first) and, for small batches, slot-flow rounds
(``flow.slot_flow``); every answer replayed through the exact packer and kept only if valid
and cheaper.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .classes import ClassSpec, objective, valid
from .config import EngineConfig
from .flow import slot_flow


def improve_cost(classes: Sequence[ClassSpec], free: np.ndarray,
                 domains: Mapping[str, np.ndarray], icost: list[np.ndarray], penalty: int,
                 got: list[list[int]], cfg: EngineConfig, stats: dict[str, float]
                 ) -> list[list[int]]:
    """Cost among the pods that fit, the count kept: cost descent (``cost_descent``), then
    for batches up to ``pack_flow_max_pods`` slot-flow rounds (``flow.slot_flow``) while they
    lower the objective and a second descent (and for any batch whose descent is skipped for
    its size, ``descent_max_cells``). Each answer is replayed through the exact packer
    and kept only if valid and better. Measured on the tight benchmark: at 3,289 pods the
    slot flow costs 0.5 s CPU and, run before the descent, leaves it a worse start (2,422
    vs 2,402 $/h); at 339 pods it is cheap and takes off another 0.3-0.7 %."""
    obj = objective(classes, icost, penalty, got)

    def step() -> None:
        nonlocal got, obj
        new = cost_descent(classes, free, icost, got, cfg, stats)
        new_obj = objective(classes, icost, penalty, new)
        if new_obj < obj and valid(classes, free, domains, new):
            got, obj = new, new_obj

    step()
    if sum(c.count for c in classes) > cfg.pack_flow_max_pods and (
            "descent_skipped" not in stats):
        return got
    slot_obj = obj
    for _ in range(cfg.slot_rounds):
        new = slot_flow(classes, free, icost, penalty, got, cfg)
        ok = valid(classes, free, domains, new)
        new_obj = objective(classes, icost, penalty, new)
        if not ok or new_obj >= obj:
            break
        got, obj = new, new_obj
        stats["slot_rounds"] = stats.get("slot_rounds", 0.0) + 1
    if obj < slot_obj:
        step()
    return got


_NEVER = np.int64(1) << 60  # integer cost of a node a class may not use
# a move that cannot be made, in the descent's per-candidate sums: any saving added to it
# (> -2^60) stays above every cost that can win, so no mask has to be applied after the sum
_BIG = np.int64(1) << 61


def cost_descent(classes: Sequence[ClassSpec], free: np.ndarray, icost: list[np.ndarray],
                 got: list[list[int]], cfg: EngineConfig, stats: dict[str, float]
                 ) -> list[list[int]]:
    """Cost descent among the pods that fit, the count kept exactly: each pod paying more
    than ``descent_regret`` of its cost above its cheapest allowed node (largest regret
    first) takes the best strictly improving move of three -- to a cheaper node with room
    (relocate); to a cheaper node ``y``, a pod ``b`` of ``y`` taking its place (swap); or to
    ``y`` with ``b`` going to its own cheapest node with room (chain). Every move keeps every
    node within its free resources; classes with anti-affinity or gangs stay put (as in the
    slot flow). Measured on the tight benchmark: most of the gain is cpu pods that tolerate
    the GPU taint leaving GPU nodes (priced by the GPU) for cpu nodes, by trading places
    with pods whose other resource fits the room those nodes still have. Bounded by
    ``descent_rounds`` passes and ``descent_work`` pods looked at: deterministic."""
    pods = [(ci, n) for ci, ns in enumerate(got) for n in ns]
    if not pods or not cfg.descent_rounds:
        return got
    if len(classes) * free.shape[0] > cfg.descent_max_cells:
        # its tables are (classes x nodes), about 20 bytes a cell at the peak: bounded
        stats["descent_skipped"] = 1.0
        return got
    d = _Descent(classes, free, icost, pods)
    work = 0
    moves = 0
    for _ in range(cfg.descent_rounds):
        improved = 0
        d.new_pass()
        regret = d.p_cost - d.lo[d.p_cls]
        for a in np.lexsort((d.every, -regret)).tolist():
            ca, here = d.p_cls_l[a], d.pc_l[a]
            if not d.mov_l[a] or (here - d.lo_l[ca]) <= cfg.descent_regret * here:
                continue
            if work >= cfg.descent_work:
                break
            work += 1
            if d.improve(a):
                improved += 1
        moves += improved
        if not improved or work >= cfg.descent_work:
            break
    stats["descent_moves"] = stats.get("descent_moves", 0.0) + moves
    stats["descent_work"] = stats.get("descent_work", 0.0) + work
    out: list[list[int]] = [[] for _ in classes]
    for ci, n in zip(d.p_cls.tolist(), d.p_node.tolist(), strict=True):
        out[ci].append(n)
    return out


class _Descent:
    """The descent's state: per pod its class, node and cost; per node the free room.

    Per pod looked at, the work is a few numpy operations over all pods: what does not
    depend on that pod is kept per pod between moves (``slot``: the room at a pod's node
    once it leaves; ``ez``/``ec``: the two nodes a chain may send it to), so that only the
    candidates that pass every check are gathered (3,289 pods: 5x fewer operations than
    gathering and filtering them resource by resource)."""

    def __init__(self, classes: Sequence[ClassSpec], free: np.ndarray,
                 icost: list[np.ndarray], pods: list[tuple[int, int]]) -> None:
        n_cls = self.n_cls = len(classes)
        movable = np.array([not c.conflicts and c.gang is None for c in classes])
        reqs = self.reqs = np.stack([c.req for c in classes]).astype(np.int64)
        allowed = self.allowed = np.stack([c.mask for c in classes])
        cost = self.cost = np.where(allowed, np.stack(icost), _NEVER)
        # per node, every class's cost there, _BIG where it may not go (one contiguous row
        # per node): the swap check then compares requests only
        self.cost_tb = np.ascontiguousarray(np.where(allowed, cost, _BIG).T)
        p_cls = self.p_cls = np.array([ci for ci, _ in pods], dtype=np.int64)
        p_node = self.p_node = np.array([n for _, n in pods], dtype=np.int64)
        p_mov = self.p_mov = movable[p_cls]
        used = np.zeros_like(free)
        np.add.at(used, p_node, reqs[p_cls])
        # resources as rows (one contiguous array per resource): the checks below compare
        # column by column, much cheaper than ``(k, 3)`` comparisons reduced along an axis
        self.fr = np.ascontiguousarray((free - used).T)
        p_req = self.p_req = np.ascontiguousarray(reqs[p_cls].T)
        # a pod that may not move never has room for another (its room below any request):
        # a class with a request needs no separate mask of the movable pods
        p_req[:, ~p_mov] = -_NEVER
        self.p_cost = cost[p_cls, p_node]
        self.lo = cost.min(axis=1)
        self.lo_l: list[int] = self.lo.tolist()
        self.mov_l: list[bool] = p_mov.tolist()
        self.by_cls: list[list[int]] = [[] for _ in classes]
        self.on_node: list[list[int]] = [[] for _ in range(free.shape[0])]
        for i, (ci, n) in enumerate(pods):
            self.by_cls[ci].append(i)
            self.on_node[n].append(i)
        self.top = min(3, self.fr.shape[1])
        self.best_z = np.full((n_cls, 3), -1, dtype=np.int64)  # padded: -1 never has room
        self.best_c = np.full((n_cls, 3), _NEVER, dtype=np.int64)
        self.ez = np.full((2, p_cls.size), -1, dtype=np.int64)
        self.ec = np.full((2, p_cls.size), _BIG, dtype=np.int64)  # _BIG: no target
        self.reqs_l: list[list[int]] = reqs.tolist()
        # per class, its requests above zero as (resource, amount): what a room check compares
        self.dims_l = [[(r, v) for r, v in enumerate(rq) if v] for rq in self.reqs_l]
        self.p_cls_l: list[int] = p_cls.tolist()
        # the same as p_node and p_cost, as lists for the per-pod reads (kept in step)
        self.pn_l: list[int] = p_node.tolist()
        self.pc_l: list[int] = self.p_cost.tolist()
        self.reqs_t = np.ascontiguousarray(reqs.T)
        self.every = np.arange(p_cls.size)
        self.cx_key: tuple[int, int, int, int] | None = None
        self.cx = self.cost_tb[0]
        self.slot = self.fr[:, p_node] + p_req

    def chain_targets(self, sel: np.ndarray) -> None:
        """Per pod of ``sel``: the first two of its class's cheapest nodes with room that are
        not its own node."""
        p_cls, ez, ec = self.p_cls, self.ez, self.ec
        zs, cs = self.best_z[p_cls[sel]], self.best_c[p_cls[sel]]
        other = zs != self.p_node[sel][:, None]
        o = np.argsort(~other, axis=1, kind="stable")[:, :2]
        ok = np.take_along_axis(other, o, axis=1)
        ez[:, sel] = np.where(ok, np.take_along_axis(zs, o, axis=1), -1).T
        ok &= np.take_along_axis(cs, o, axis=1) < _NEVER
        ec[:, sel] = np.where(ok, np.take_along_axis(cs, o, axis=1), _BIG).T

    def chain_targets_of(self, sel: list[int]) -> None:
        """The same for a few pods (a move's, a refreshed class's): plain Python is
        cheaper."""
        ez, ec = self.ez, self.ec
        rows: dict[int, list[tuple[int, int]]] = {}  # per class, read once a call
        for p in sel:
            c, own = self.p_cls_l[p], int(self.p_node[p])
            zc = rows.get(c)
            if zc is None:
                zc = rows[c] = list(zip(self.best_z[c].tolist(), self.best_c[c].tolist(),
                                        strict=True))
            picks = [(z, v) for z, v in zc if z != own]
            picks += [(-1, int(_NEVER))] * (2 - len(picks))
            (ez[0, p], c0), (ez[1, p], c1) = picks[0], picks[1]
            ec[0, p] = c0 if c0 < _NEVER else _BIG
            ec[1, p] = c1 if c1 < _NEVER else _BIG

    def new_pass(self) -> None:
        """Per class, the three cheapest nodes with room now: where a chain sends the pod
        it displaces -- the first that is neither its own node nor the one the moving pod
        leaves (refreshed each pass; checked again before a chain is made); and the room at
        each pod's node once it leaves, per resource."""
        fr, reqs, top = self.fr, self.reqs, self.top
        # (``cost`` is _NEVER already where a class may not go: no permission mask here)
        room = fr[0][None, :] >= reqs[:, 0][:, None]
        for r in (1, 2):
            room &= fr[r][None, :] >= reqs[:, r][:, None]
        cz = np.where(room, self.cost, _NEVER)
        part = np.argpartition(cz, top - 1, axis=1)[:, :top] if cz.shape[1] > top else \
            np.broadcast_to(np.arange(top), (self.n_cls, top))
        part_c = np.take_along_axis(cz, part, axis=1)
        # ties broken by node index, so the answer never depends on the partition's order
        order3 = np.lexsort((part, part_c), axis=1)
        self.best_z[:, :top] = np.take_along_axis(part, order3, axis=1)
        self.best_c[:, :top] = np.take_along_axis(part_c, order3, axis=1)
        self.chain_targets(self.every)
        self.slot = fr[:, self.p_node] + self.p_req

    def improve(self, a: int) -> bool:
        """Make pod ``a``'s best strictly improving move, if any; True if one was made."""
        best_d, kind, best_b, z = self._best_move(a)
        if best_d >= 0:
            return False
        if kind == 0:
            moved, touched = self._relocate(a, z)
        else:
            done = self._exchange(a, best_b, z)
            if done is None:
                return False
            moved, touched = done
        self.chain_targets_of(moved)
        t = np.array(touched, dtype=np.int64)
        self.slot[:, t] = self.fr[:, self.p_node[t]] + self.p_req[:, t]
        return True

    def _best_move(self, a: int) -> tuple[int, int, int, int]:
        """(saving < 0 if any, kind 0 relocate / 1 swap / 2 chain, the pod b displaced,
        where a relocates to, or where a chain sends b; its own node x for a swap)."""
        fr, p_node, p_cost = self.fr, self.p_node, self.p_cost
        ca, here = self.p_cls_l[a], self.pc_l[a]
        x = self.pn_l[a]
        ra0, ra1, ra2 = self.reqs_l[ca]
        dims = self.dims_l[ca]
        crow = self.cost[ca]
        if dims:
            fits = fr[dims[0][0]] >= dims[0][1]
            for r, v in dims[1:]:
                fits &= fr[r] >= v
            row = np.where(fits, crow, _NEVER)
        else:
            row = crow
        y0 = int(row.argmin())
        best_d, kind, best_b, z_out = int(row[y0]) - here, 0, -1, y0
        # candidates b: movable, on a node where a is cheaper, a fits there once b left
        cp = crow.take(p_node)  # take: the same values as crow[p_node], cheaper
        m = cp < here
        if not dims:
            m &= self.p_mov
        for r, v in dims:
            m &= self.slot[r] >= v
        idx = m.nonzero()[0]
        if not idx.size:
            return best_d, kind, best_b, z_out
        cb = self.p_cls.take(idx)
        # what a saves on b's node (< 0), less what b pays now
        g = cp.take(idx) - p_cost.take(idx) - here
        # per class: its cost at x if it fits there once a is gone, else _BIG
        c0, c1, c2 = fr[:, x].tolist()
        key = (x, c0 + ra0, c1 + ra1, c2 + ra2)
        if key != self.cx_key:  # pods of a class on one node often come one after another
            rt = self.reqs_t
            fx = rt[0] <= key[1]
            fx &= rt[1] <= key[2]
            fx &= rt[2] <= key[3]
            self.cx, self.cx_key = np.where(fx, self.cost_tb[x], _BIG), key
        d_sw = g + self.cx.take(cb)
        ez, ec = self.ez, self.ec
        z1 = ez[0].take(idx)
        first = z1 != x
        e1 = ec[0].take(idx)
        if np.count_nonzero(first) < first.size:  # b's first chain target is x: its second
            e1 = np.where(first, e1, ec[1].take(idx))
        d_ch = g + e1
        j1, j2 = int(d_sw.argmin()), int(d_ch.argmin())
        if d_sw[j1] < best_d:
            best_d, kind, best_b, z_out = int(d_sw[j1]), 1, int(idx[j1]), x
        if d_ch[j2] < best_d:
            best_d, kind, best_b = int(d_ch[j2]), 2, int(idx[j2])
            z_out = int(z1[j2]) if first[j2] else int(ez[1][idx[j2]])
        return best_d, kind, best_b, z_out

    def _relocate(self, a: int, y0: int) -> tuple[list[int], list[int]]:
        """Move pod ``a`` to node ``y0``; (pods moved, pods whose room changed)."""
        ca, x = self.p_cls_l[a], self.pn_l[a]
        ra = self.reqs[ca]
        self.fr[:, x] += ra
        self.fr[:, y0] -= ra
        self.p_node[a], self.p_cost[a] = y0, self.cost[ca, y0]
        self.pn_l[a], self.pc_l[a] = y0, int(self.p_cost[a])
        on_node = self.on_node
        on_node[x].remove(a)
        on_node[y0].append(a)
        return [a], on_node[x] + on_node[y0]

    def _exchange(self, a: int, b: int, z: int) -> tuple[list[int], list[int]] | None:
        """Pod ``a`` to ``b``'s node, ``b`` to ``z`` (a's own node: a swap; else a chain);
        None when the chain's target has no room any more (its table refreshed)."""
        fr, p_node, p_cost, cost = self.fr, self.p_node, self.p_cost, self.cost
        ca, x = self.p_cls_l[a], self.pn_l[a]
        ra = self.reqs[ca]
        y, cb1 = int(p_node[b]), int(self.p_cls[b])
        rb = self.reqs[cb1]
        if z != x and not (fr[:, z] >= rb).all():
            self._refresh_class(cb1)
            return None
        fr[:, x] += ra
        fr[:, y] += rb - ra
        fr[:, z] -= rb
        p_node[a], p_cost[a] = y, cost[ca, y]
        p_node[b], p_cost[b] = z, cost[cb1, z]
        self.pn_l[a], self.pc_l[a] = y, int(p_cost[a])
        self.pn_l[b], self.pc_l[b] = z, int(p_cost[b])
        on_node = self.on_node
        on_node[x].remove(a)
        on_node[y].remove(b)
        on_node[y].append(a)
        on_node[z].append(b)
        return [a, b], on_node[x] + on_node[y] + (on_node[z] if z != x else [])

    def _refresh_class(self, cb1: int) -> None:
        """The table is stale for class ``cb1`` (an earlier move of this pass took the
        room): its row is refreshed, the pod is looked at next pass."""
        fr, rb, top = self.fr, self.reqs[cb1], self.top
        ok_z = self.allowed[cb1].copy()
        for r in range(3):
            ok_z &= fr[r] >= rb[r]
        rz = np.where(ok_z, self.cost[cb1], _NEVER)
        # its first three by (cost, node index): a stable sort's first three, sorting only
        # the nodes at or below the third least cost
        kth = np.partition(rz, top - 1)[top - 1]
        low = np.flatnonzero(rz <= kth)
        o3 = low[np.argsort(rz[low], kind="stable")[:top]]
        self.best_z[cb1, :top], self.best_c[cb1, :top] = o3, rz[o3]
        sel = self.by_cls[cb1]
        if len(sel) > 8:  # many pods: the vectorised form (the same targets)
            self.chain_targets(np.array(sel, dtype=np.int64))
        else:
            self.chain_targets_of(sel)
