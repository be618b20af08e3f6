"""Count-first packing: rigid-and-large-first tightest fit with a look-ahead on the demand
still to come (``Pack.greedy``), ejection repair (``Pack.insert``, ``Pack.insert_many``),
and the pack stage that repairs a cost-first answer. Every step is counted (``Pack.work``),
never timed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .classes import ClassSpec, Packer, finish, objective, placeable
from .config import EngineConfig


def pack_order(classes: Sequence[ClassSpec], free: np.ndarray, big: float = 0.0
                ) -> list[int]:
    """Pods (as class indices, one entry per pod): GPUs first, then (with ``big``) pods of
    at least that size, then the rigid ones (fewest allowed nodes, in buckets of 2 % of
    the nodes), then the largest. Size is the summed share of the average node's free cpu
    and memory. Measured on the tight benchmark: without the rigidity buckets, pods that
    may go anywhere take the nodes the confined ones need."""
    mean = np.maximum(free.mean(axis=0), 1.0)
    bucket = max(1, free.shape[0] // 50)
    keys = []
    for ci, c in enumerate(classes):
        size = float(c.req[0] / mean[0] + c.req[1] / mean[1])
        keys.append((-int(c.req[2]), -int(big > 0 and size >= big),
                     int(c.mask.sum()) // bucket, -size, ci))
    out: list[int] = []
    for *_, ci in sorted(keys):
        out.extend([ci] * classes[ci].count)
    return out


def first_least(key: np.ndarray, tie: np.ndarray, at: np.ndarray) -> int:
    """``np.lexsort((tie[at], key))[0]`` in linear time: the first position of the least
    ``tie[at]`` among the least ``key`` (one pick per pod placed: no sort needed). ``tie``
    is read only where ``key`` ties, and usually it does not."""
    least = (key == key.min()).nonzero()[0]
    if least.size == 1:
        return int(least[0])
    return int(least[tie[at[least]].argmin()])


def pressure(classes: Sequence[ClassSpec], press: np.ndarray
              ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Add to ``press`` (nodes x 3, zeros) every class's expected demand, its request
    times its count spread evenly over its allowed nodes, class after class; and give per
    class its allowed nodes as indices into the flattened ``press`` with its share tiled to
    match (``greedy`` takes one pod's share off as it places it: one 1-D read-modify-write,
    the same elements and arithmetic as indexing rows by the mask, ~4x cheaper than numpy's
    row gather).

    The sums are those of adding the classes one by one (a reduction along the class
    axis adds row after row, each node's 0.0 where a class may not go changing nothing),
    built in blocks of classes instead of ~5 numpy calls per class (1,762 classes of the
    3,000-pod tight benchmark)."""
    n = press.shape[0]
    where: list[np.ndarray] = []
    tiled: list[np.ndarray] = []
    block = max(1, (1 << 20) // max(3 * n, 1))  # ~8 MB of float64 per block
    for lo in range(0, len(classes), block):
        part = classes[lo:lo + block]
        mask = np.stack([c.mask for c in part])
        k = np.maximum(mask.sum(axis=1), 1)
        share = np.stack([c.req for c in part]).astype(np.float64) / k[:, None]
        add = share * np.array([c.count for c in part], dtype=np.int64)[:, None]
        # the running sum as the first row: the block's rows are added after it in order
        rows_in = np.empty((len(part) + 1, n, 3))
        rows_in[0] = press
        np.multiply(mask[:, :, None], add[:, None, :], out=rows_in[1:])  # x * 1.0 or 0.0
        np.add.reduce(rows_in, axis=0, out=press)
        rows, cols = mask.nonzero()
        ends = np.cumsum(np.bincount(rows, minlength=len(part)) * 3).tolist()
        at = (cols[:, None] * 3 + np.arange(3)).reshape(-1)
        sh = share[rows].reshape(-1)
        for a, b in zip([0, *ends[:-1]], ends, strict=True):
            where.append(at[a:b])
            tiled.append(sh[a:b])
    return where, tiled


class Pack:
    """Count-first packing: best fit by normalised residual, then ejection repair.

    Every step is counted (``work``), never timed: the same input gives the same packing
    whatever the machine's load."""

    def __init__(self, classes: Sequence[ClassSpec], free: np.ndarray,
                 domains: Mapping[str, np.ndarray], icost: list[np.ndarray]) -> None:
        self.classes = classes
        self.pk = Packer(free, domains, classes)
        self.inv = 1.0 / np.maximum(free, 1).astype(np.float64)
        self.icost = icost
        self.got: list[list[int]] = [[] for _ in classes]
        self.on: list[list[int]] = [[] for _ in range(free.shape[0])]  # classes per node
        self.work = 0
        self.sticky = [c.gang is not None for c in classes]
        self.gpu_nodes = free[:, 2] > 0

    def put(self, ci: int, n: int) -> None:
        self.pk.put(ci, n)
        self.got[ci].append(n)
        self.on[n].append(ci)

    def take(self, ci: int, n: int) -> None:
        self.pk.take(ci, n)
        self.got[ci].remove(n)
        self.on[n].remove(ci)

    def best(self, ci: int, cand: np.ndarray) -> int:
        """The tightest fit among ``cand``: least squared normalised residual after placing,
        the cheaper node on ties."""
        idx = np.flatnonzero(cand)
        if idx.size == 0:
            return -1
        self.work += 1
        after = ((self.pk.free.take(idx, axis=0) - self.classes[ci].req)
                 * self.inv.take(idx, axis=0))
        fit = np.einsum("ij,ij->i", after, after)
        return int(idx[first_least(np.round(fit, 6), self.icost[ci], idx)])

    def greedy(self, order: Sequence[int], beta: float = 0.0, gamma: float = 0.0) -> None:
        """Largest first, each pod to the node that fits it most tightly -- discounted by
        the expected demand of the pods still to come that may use that node (each spread
        evenly over its allowed nodes), so a pod that may go anywhere leaves the nodes that
        only others may use."""
        classes = self.classes
        press = np.zeros_like(self.inv)
        flat = press.reshape(-1)  # a view: the per-pod update below writes through it
        # each class's allowed nodes as indices into the flattened (nodes x 3) pressure, and
        # its share tiled to match: the per-pod update is then one 1-D read-modify-write
        # (the same elements and the same arithmetic as indexing rows by the boolean mask:
        # the same sums bit for bit; numpy's 1-D path is ~4x cheaper than its row gather)
        where, tiled = pressure(classes, press)
        free, inv = self.pk.free, self.inv
        for ci in order:
            c = classes[ci]
            np.subtract.at(flat, where[ci], tiled[ci])  # indices unique: plain x - s
            cand = self.pk.candidates(ci)
            idx = np.flatnonzero(cand)
            if idx.size == 0:
                continue
            self.work += 1
            # rows by take(axis=0): the same rows as free[idx], without the slow row gather
            inv_i = inv.take(idx, axis=0)
            left = free.take(idx, axis=0) - c.req
            after = left * inv_i
            score = np.einsum("ij,ij->i", after, after)
            if beta:
                over = np.maximum(press.take(idx, axis=0) - left, 0.0) * inv_i
                # the row maxima column by column: exact, and ~4x cheaper than a
                # reduction along rows of three
                worst = np.maximum(np.maximum(over[:, 0], over[:, 1]), over[:, 2])
                score = score + beta * worst
            if gamma:
                ic = self.icost[ci][idx].astype(np.float64)
                lo = ic.min()
                score = score + gamma * (ic - lo) / max(lo, 1.0)
            n = int(idx[first_least(np.round(score, 6), self.icost[ci], idx)])
            self.put(ci, n)

    def insert(self, ci: int, max_nodes: int) -> bool:
        """Place one pod of ``ci``, moving one pod of another node's to make room if need
        be (an ejection of depth one)."""
        n = self.best(ci, self.pk.candidates(ci))
        if n >= 0:
            self.put(ci, n)
            return True
        req = self.classes[ci].req
        room = self.pk.unblocked(ci)
        idx = np.flatnonzero(room)
        if idx.size == 0:
            return False
        need = np.maximum(req - self.pk.free[idx], 0)
        # nodes whose shortfall is smallest first
        short = (need * self.inv[idx]).sum(axis=1)
        for n in idx[np.argsort(short, kind="stable")][:max_nodes].tolist():
            nd = np.maximum(req - self.pk.free[n], 0)
            tried: set[int] = set()
            for cj in sorted(set(self.on[n]), key=lambda c: int(self.classes[c].req.sum())):
                if self.sticky[cj] or cj in tried or (self.classes[cj].req < nd).any():
                    continue
                tried.add(cj)
                self.work += 1
                self.take(cj, n)
                if not self.pk.ok(ci, n):
                    self.put(cj, n)
                    continue
                self.put(ci, n)
                cand = self.pk.candidates(cj)
                cand[n] = False
                m = self.best(cj, cand)
                if m >= 0:
                    self.put(cj, m)
                    return True
                self.take(ci, n)
                self.put(cj, n)
        return False

    def insert_many(self, ci: int, max_nodes: int) -> bool:
        """Place one pod of ``ci`` by clearing room on one node: take off its pods, largest
        first, until the pod fits, and put each of them elsewhere (tightest fit, else with
        a depth-one ejection). Undone unless every one of them finds a place."""
        req = self.classes[ci].req
        idx = np.flatnonzero(self.pk.unblocked(ci))
        if idx.size == 0:
            return False
        short = (np.maximum(req - self.pk.free[idx], 0) * self.inv[idx]).sum(axis=1)
        for n in idx[np.argsort(short, kind="stable")][:max_nodes].tolist():
            movable = sorted((cj for cj in self.on[n] if not self.sticky[cj]),
                             key=lambda c: (-int(self.classes[c].req.sum()), c))
            log: list[tuple[bool, int, int]] = []  # (put?, class, node) for undo
            taken: list[int] = []
            for cj in movable:
                if (self.pk.free[n] >= req).all():
                    break
                self.take(cj, n)
                log.append((False, cj, n))
                taken.append(cj)
            self.work += 1
            ok = self.pk.ok(ci, n)
            if ok:
                self.put(ci, n)
                log.append((True, ci, n))
                for cj in taken:
                    cand = self.pk.candidates(cj)
                    cand[n] = False
                    m = self.best(cj, cand)
                    if m < 0:
                        ok = False
                        break
                    self.put(cj, m)
                    log.append((True, cj, m))
            if ok:
                return True
            for put, cj, m in reversed(log):
                if put:
                    self.take(cj, m)
                else:
                    self.put(cj, m)
        return False

    def repair(self, order: Sequence[int], max_nodes: int, budget: int) -> None:
        placed = [len(g) for g in self.got]
        seen = [0] * len(self.classes)
        for ci in order:
            seen[ci] += 1
            if seen[ci] <= placed[ci] or self.classes[ci].gang is not None:
                continue
            if self.work > budget:
                break
            if not self.insert(ci, max_nodes):
                self.insert_many(ci, max_nodes)


def pack_stage(classes: Sequence[ClassSpec], free: np.ndarray,
                domains: Mapping[str, np.ndarray], icost: list[np.ndarray], penalty: int,
                got: list[list[int]], best_obj: int, cfg: EngineConfig,
                stats: dict[str, float]) -> tuple[list[list[int]], int, str | None]:
    """Count first: repair the cost-first answer by ejection; if pods that could fit are
    still out, pack from scratch (largest first, tightest fit) and repair that too. The
    lexicographically better answer (more pods, then less cost) wins."""
    order = pack_order(classes, free)
    method = None
    work = 0
    pa = Pack(classes, free, domains, icost)
    for ci, nodes in enumerate(got):
        for n in nodes:
            pa.put(ci, n)
    pa.repair(order, cfg.pack_repair_nodes, cfg.pack_work)
    work += pa.work
    tries = [("flow+pack-repair", pa.got)]
    # packing from scratch only when many pods that could fit are still out: on a loose
    # batch a few leftovers are what the capacity can't hold together (LP-checked on the
    # 10,000-pod benchmark), and re-packing 10,000 pods to learn that costs seconds
    left = placeable(classes, free, pa.got)
    if left and left > cfg.pack_rescue_share * sum(c.count for c in classes):
        pb = Pack(classes, free, domains, icost)
        pb.greedy(order, cfg.pack_lookahead, cfg.pack_cost)
        pb.repair(order, cfg.pack_repair_nodes, cfg.pack_work)
        work += pb.work
        tries.append(("pack", pb.got))
    for name, g in tries:
        g = finish(classes, free, domains, [list(x) for x in g])
        obj = objective(classes, icost, penalty, g)
        if obj < best_obj:
            got, best_obj, method = g, obj, name
    stats["pack_work"] = float(work)
    return got, best_obj, method
