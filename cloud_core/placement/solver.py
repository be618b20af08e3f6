"""The global solver -- the only module that imports OR-Tools.

Works on *classes* of identical workloads (``ClassSpec``) against node arrays, and
minimises ``penalty x unplaced + cost`` (most pods first, then least cost; see
docs/placement.md, "Objective"). Two routes:

* **Flow route** (loose batches): min-cost flow over class -> node arcs
  (``ortools.graph.python.min_cost_flow``), exact when the constraints decompose; an exact
  packer (``Packer``) replays it and the flow is re-solved on the residual capacity for what
  over-packs or clashes; a cheapest-feasible fill; gangs all-or-nothing. If pods that fit
  an allowed node are left out, ejection repair (and, when many are out, packing) may win.
* **Pack route** (tight batches, ``_tight``): rigid-and-large-first tightest-fit packing
  with a look-ahead on the demand still to come, ejection repair, CP-SAT large
  neighbourhood search for the pods still out, then cost among the pods that fit
  (CP-SAT cost neighbourhoods for small batches, slot-exchange min-cost flow always).

**CP-SAT** then polishes coupled batches small enough (``cpsat_max_arcs``), with the best
answer as hint. Every step is bounded by work, never by the clock: CP-SAT by its
deterministic time, one worker and a fixed seed, so the same input gives the same answer on
any load (a wall-clock cap is only a safety net, reported in the stats when hit).

``solve_exact_pods`` is a pod-level CP-SAT model used as the reference optimum by tests
and the benchmark.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from ortools.graph.python import min_cost_flow

from .config import EngineConfig

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

HOST = "kubernetes.io/hostname"


def warm_up() -> None:
    """Import CP-SAT now, off the decision path. It is imported lazily (it pulls in pandas:
    0.8 s of CPU with compiled files, far more without), so a scheduler's first bindings do
    not wait for it; but the first batch that needs it then stalled the loop for that long
    mid-step (the starvation benchmark's canary p99). A long-running core calls this once its
    first decisions are out (``k8s/wiring.py``)."""
    from ortools.sat.python import cp_model  # noqa: F401


@dataclass
class ClassSpec:
    """One equivalence class of workloads in a round: identical requests and constraints."""

    count: int
    req: np.ndarray  # (3,) int64: cpu_milli, mem_bytes, gpus
    mask: np.ndarray  # (N,) bool: passes every filter except batch resources/conflicts
    cost: np.ndarray  # (N,) float64 $/hour per pod
    # classes this one may not share a domain with, per topology key (self included if so)
    conflicts: dict[str, list[int]] = field(default_factory=dict)
    gang: str | None = None


@dataclass
class SolveOutput:
    """Per class, the node index of each placed pod (with repetition); how it was found."""

    nodes: list[list[int]]
    method: str
    stats: dict[str, float]


def capacity_per_node(req: np.ndarray, free: np.ndarray) -> np.ndarray:
    """How many pods of shape ``req`` fit on each node's free resources (int64)."""
    pos = req > 0
    if not pos.any():
        return np.full(free.shape[0], 1 << 40, dtype=np.int64)
    result: np.ndarray = np.maximum((free[:, pos] // req[pos]).min(axis=1), 0).astype(np.int64)
    return result


def _has_room(req: np.ndarray, free: np.ndarray) -> np.ndarray:
    """``capacity_per_node(req, free) > 0`` without its divisions: for integers with
    ``r > 0``, ``f // r >= 1`` exactly when ``f >= r`` (a request of 0 fits everywhere)."""
    if req.dtype.kind not in "iu" or free.dtype.kind not in "iu":
        return capacity_per_node(req, free) > 0
    out = np.ones(free.shape[0], dtype=bool)
    for r in range(req.shape[0]):
        if req[r] > 0:
            out &= free[:, r] >= req[r]
    return out


class Packer:
    """Exact incremental state: free resources and, per anti-affinity domain, how many pods
    that repel each class are there (counts, so that a pod can be taken out again)."""

    def __init__(self, free: np.ndarray, domains: Mapping[str, np.ndarray],
                 classes: Sequence[ClassSpec]) -> None:
        self.free = free.copy()
        self.domains = domains
        self.classes = classes
        self.blocked: list[dict[str, np.ndarray]] = []
        for c in classes:
            self.blocked.append({k: np.zeros(int(domains[k].max(initial=-1)) + 2,
                                             dtype=np.int32) for k in c.conflicts})
        # who must be told when a pod of class s lands: (class c, key) with s in c's conflicts
        self.watchers: list[list[tuple[int, str]]] = [[] for _ in classes]
        for ci, c in enumerate(classes):
            for k, others in c.conflicts.items():
                for s in others:
                    self.watchers[s].append((ci, k))

    def ok(self, ci: int, n: int) -> bool:
        c = self.classes[ci]
        if not c.mask[n]:
            return False
        f = self.free[n]
        r = c.req
        if r[0] > f[0] or r[1] > f[1] or r[2] > f[2]:
            return False
        for k, bl in self.blocked[ci].items():
            d = self.domains[k][n]
            if d >= 0 and bl[d]:
                return False
        return True

    def put(self, ci: int, n: int) -> None:
        self.free[n] -= self.classes[ci].req
        for c2, k in self.watchers[ci]:
            d = self.domains[k][n]
            if d >= 0:
                self.blocked[c2][k][d] += 1

    def take(self, ci: int, n: int) -> None:
        """Undo ``put(ci, n)``."""
        self.free[n] += self.classes[ci].req
        for c2, k in self.watchers[ci]:
            d = self.domains[k][n]
            if d >= 0:
                self.blocked[c2][k][d] -= 1

    def unblocked(self, ci: int) -> np.ndarray:
        """Nodes where no pod that repels class ``ci`` sits in the same domain."""
        cand = self.classes[ci].mask.copy()
        for k, bl in self.blocked[ci].items():
            d = self.domains[k]
            cand &= ~((bl[d] > 0) & (d >= 0))
        return cand

    def candidates(self, ci: int) -> np.ndarray:
        c = self.classes[ci]
        cand = self.unblocked(ci)
        for r in range(3):  # column by column: no (N, 3) temporary, skip zero requests
            if c.req[r]:
                cand &= self.free[:, r] >= c.req[r]
        return cand


def _penalty(classes: Sequence[ClassSpec], scale: float) -> tuple[list[np.ndarray], int]:
    """Integer costs and an unplaced penalty larger than any total cost (placing first)."""
    icost: list[np.ndarray] = []
    mx = 0
    n = classes[0].cost.size if classes else 0
    block = max(1, (1 << 20) // max(n, 1))  # rows of ~8 MB: the same elementwise arithmetic
    for lo in range(0, len(classes), block):  # as class by class, in a few numpy calls
        part = classes[lo:lo + block]
        cost = np.stack([c.cost for c in part])
        ic = np.round(np.where(np.isfinite(cost), cost, 0.0) * scale).astype(np.int64)
        icost.extend(ic)  # its rows
        mx = max(mx, int(np.where(np.stack([c.mask for c in part]), ic, 0).max(initial=0)))
    total = sum(c.count for c in classes)
    return icost, (mx + 1) * (total + 1)


def _flow(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
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


def _rigidity_order(classes: Sequence[ClassSpec]) -> list[int]:
    """Most constrained classes first: they have the fewest alternatives."""
    return sorted(range(len(classes)), key=lambda ci: int(classes[ci].mask.sum()))


def _replay(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
            got: list[list[int]]) -> Packer:
    pk = Packer(free, domains, classes)
    for ci, nodes in enumerate(got):
        for n in nodes:
            pk.put(ci, n)
    return pk


def _fill(pk: Packer, got: list[list[int]], skip_gangs: bool) -> None:
    """Cheapest-feasible placement of whatever is still unplaced (exact checks)."""
    classes = pk.classes
    for ci in _rigidity_order(classes):
        c = classes[ci]
        if skip_gangs and c.gang is not None:
            continue
        left = c.count - len(got[ci])
        while left > 0:
            cand = pk.candidates(ci)
            if not cand.any():
                break
            costs = np.where(cand, c.cost, np.inf)
            if not c.conflicts:
                # no anti-affinity: fill the cheapest nodes to capacity in one sweep
                k = capacity_per_node(c.req, pk.free)
                for n in np.argsort(costs, kind="stable"):
                    if left == 0 or not np.isfinite(costs[n]):
                        break
                    take = int(min(k[n], left))
                    for _ in range(take):
                        pk.put(ci, int(n))
                        got[ci].append(int(n))
                    left -= take
                break
            n = int(np.argmin(costs))
            pk.put(ci, n)
            got[ci].append(n)
            left -= 1


def _gangs(classes: Sequence[ClassSpec], got: list[list[int]]) -> bool:
    """Drop partially placed gangs (all or nothing); True if anything was dropped."""
    members: dict[str, list[int]] = {}
    for ci, c in enumerate(classes):
        if c.gang is not None:
            members.setdefault(c.gang, []).append(ci)
    dropped = False
    for cis in members.values():
        if any(len(got[ci]) < classes[ci].count for ci in cis):
            for ci in cis:
                if got[ci]:
                    dropped = True
                got[ci] = []
    return dropped


def _objective(classes: Sequence[ClassSpec], icost: list[np.ndarray], penalty: int,
               got: list[list[int]]) -> int:
    tot = 0
    for ci, c in enumerate(classes):
        if got[ci]:
            tot += int(icost[ci][np.asarray(got[ci])].sum())
        tot += penalty * (c.count - len(got[ci]))
    return tot


def _placeable(classes: Sequence[ClassSpec], free: np.ndarray, got: list[list[int]]) -> int:
    """Unplaced pods of classes that fit some allowed node's free capacity before the batch:
    the ones a better packing could still place (the others have no node at all)."""
    out = 0
    for ci, c in enumerate(classes):
        left = c.count - len(got[ci])
        if left and (c.mask & _has_room(c.req, free)).any():
            out += left
    return out


def _pack_order(classes: Sequence[ClassSpec], free: np.ndarray, big: float = 0.0
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


def _first_least(key: np.ndarray, tie: np.ndarray, at: np.ndarray) -> int:
    """``np.lexsort((tie[at], key))[0]`` in linear time: the first position of the least
    ``tie[at]`` among the least ``key`` (one pick per pod placed: no sort needed). ``tie``
    is read only where ``key`` ties, and usually it does not."""
    least = (key == key.min()).nonzero()[0]
    if least.size == 1:
        return int(least[0])
    return int(least[tie[at[least]].argmin()])


def _pressure(classes: Sequence[ClassSpec], press: np.ndarray
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


class _Pack:
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
        return int(idx[_first_least(np.round(fit, 6), self.icost[ci], idx)])

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
        where, tiled = _pressure(classes, press)
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
            n = int(idx[_first_least(np.round(score, 6), self.icost[ci], idx)])
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

    def lns(self, free: np.ndarray, domains: Mapping[str, np.ndarray], penalty: int,
            cfg: EngineConfig, wall_cap_hits: list[int]) -> int:
        """Large neighbourhood search for count: take a left-out pod, the ``lns_near`` nodes
        it may use that are closest to fitting it, and ``lns_slack`` nodes with the most
        room among those the pods already there may move to; every pod on them and the
        left-out pods that could go there are re-placed exactly by CP-SAT (most pods, then
        least cost), kept only when strictly better. A pod that fails ``lns_tries`` times is
        given up. Seeded and bounded by counts, never by the clock: deterministic."""
        classes = self.classes
        rng = random.Random(cfg.cpsat_seed)
        solved = 0
        fails: dict[int, int] = {}
        for _ in range(cfg.lns_iterations):
            out = [ci for ci, c in enumerate(classes)
                   if len(self.got[ci]) < c.count and c.gang is None
                   and fails.get(ci, 0) < cfg.lns_tries]
            if not out:
                break
            ci0 = out[rng.randrange(len(out))]
            room = np.flatnonzero(self.pk.unblocked(ci0))
            if room.size == 0:
                fails[ci0] = cfg.lns_tries
                continue
            req = classes[ci0].req
            short = (np.maximum(req - self.pk.free[room], 0) * self.inv[room]).sum(axis=1)
            near = room[np.argsort(short, kind="stable")[:2 * cfg.lns_near]].tolist()
            pick = rng.sample(near, min(cfg.lns_near, len(near)))
            # where the pods on those nodes could go instead
            may, dims = self._reach(pick, req > 0)
            others = np.flatnonzero(may)
            if others.size and dims.any():
                # a pod that failed gets a wider neighbourhood: a large pod needs the
                # scattered room of many nodes
                k = cfg.lns_slack + cfg.lns_grow * fails.get(ci0, 0)
                # room in the resources these pods ask for (a GPU pod's GPUs, not a
                # cpu-only pod's zero GPUs)
                slack = (self.pk.free[others][:, dims] * self.inv[others][:, dims]).min(axis=1)
                top = others[np.argsort(-slack, kind="stable")[:2 * k]].tolist()
                pick += rng.sample(top, min(k, len(top)))
            det = cfg.lns_deterministic_time
            if fails.get(ci0, 0) and dims[2] and cfg.lns_gpu_ring:
                pick += self._gpu_ring(pick, may, cfg, rng)
                det = cfg.lns_gpu_deterministic_time
            before = len(self.got[ci0])
            self._solve_sub(np.array(sorted(pick), dtype=np.int64), domains, penalty, cfg,
                            wall_cap_hits, det_time=det)
            solved += 1
            if len(self.got[ci0]) == before:
                fails[ci0] = fails.get(ci0, 0) + 1
        return solved

    def _gpu_ring(self, pick: list[int], may: np.ndarray, cfg: EngineConfig,
                  rng: random.Random) -> list[int]:
        """For a GPU pod that failed once: up to ``lns_gpu_ring`` nodes with GPUs that the
        pods of the neighbourhood may use (most free GPUs first), and ``lns_slack`` nodes
        with the most room for the pods on *those*. GPUs are packed to the last one, so
        freeing a large GPU node moves its GPU pods across many GPU nodes, and each of
        those takes them only if cpu pods there that tolerate the taint move on to cpu
        nodes: a chain the first ring leaves out (measured: the 8-GPU pod of the 300 x 60
        tight instance, seed 2, placed only with this ring)."""
        classes = self.classes
        gpus = may & self.gpu_nodes
        gpus[pick] = False
        idx = np.flatnonzero(gpus)
        ring: list[int] = idx[np.lexsort((idx, -self.pk.free[idx, 2]))[:cfg.lns_gpu_ring]].tolist()
        may2 = np.zeros_like(may)
        dims = np.zeros(3, dtype=bool)
        for n in ring:
            for cj in set(self.on[n]):
                may2 |= classes[cj].mask
                dims |= classes[cj].req > 0
        may2[pick + ring] = False
        others = np.flatnonzero(may2)
        if not ring or not others.size or not dims.any():
            return ring
        slack = (self.pk.free[others][:, dims] * self.inv[others][:, dims]).min(axis=1)
        top: list[int] = others[np.argsort(-slack, kind="stable")[:2 * cfg.lns_slack]].tolist()
        return ring + rng.sample(top, min(cfg.lns_slack, len(top)))

    def cost_lns(self, domains: Mapping[str, np.ndarray], penalty: int, cfg: EngineConfig,
                 wall_cap_hits: list[int]) -> int:
        """Cost among the pods that fit: for the pods that pay most above their cheapest
        allowed node (largest regret first), a neighbourhood of their node, their
        ``lns_near`` cheapest allowed nodes and the ``cost_lns_slack`` nodes with the most
        room for the pods on those (``_roomy``: on nearly full nodes a cheaper place opens
        only if its pods move on), re-placed by CP-SAT with the full objective (count
        first, then cost), ``cost_lns_deterministic_time`` each -- never fewer pods. Up to
        ``cost_lns_passes`` passes (regrets recomputed), while a pass lowers the cost;
        ``cost_lns_iterations`` neighbourhoods in all."""
        classes = self.classes
        done = 0
        for _pass in range(max(cfg.cost_lns_passes, 1)):
            regret: list[tuple[int, int, int]] = []
            total = 0
            for ci, nodes in enumerate(self.got):
                c = classes[ci]
                if not nodes or c.gang is not None:
                    continue
                ic = self.icost[ci]
                total += int(ic[np.asarray(nodes)].sum())
                lo = int(ic[c.mask].min())
                for n in set(nodes):
                    if int(ic[n]) > lo:
                        regret.append((lo - int(ic[n]), ci, n))
            regret.sort()
            seen: set[int] = set()
            start = done
            for _, ci, n in regret:
                if done >= cfg.cost_lns_iterations:
                    break
                if n in seen or n not in self.got[ci]:
                    continue
                c = classes[ci]
                cand = np.flatnonzero(c.mask)
                cheap = cand[np.argsort(self.icost[ci][cand], kind="stable")[:cfg.lns_near]]
                pick = {n, *cheap.tolist()}
                if cfg.cost_lns_slack:
                    pick.update(self._roomy(sorted(pick), cfg.cost_lns_slack))
                seen.update(pick)
                self._solve_sub(np.array(sorted(pick), dtype=np.int64), domains, penalty,
                                cfg, wall_cap_hits, count_only=False,
                                det_time=cfg.cost_lns_deterministic_time)
                done += 1
            after = sum(int(self.icost[ci][np.asarray(g)].sum())
                        for ci, g in enumerate(self.got) if g and classes[ci].gang is None)
            if done == start or after >= total or done >= cfg.cost_lns_iterations:
                break
        return done

    def _reach(self, nodes: list[int], dims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where the pods on ``nodes`` may go instead (a mask without ``nodes``), and the
        resources asked for: ``dims`` and those the pods ask for."""
        may = np.zeros(self.pk.free.shape[0], dtype=bool)
        dims = dims.copy()
        for n in nodes:
            for cj in set(self.on[n]):
                may |= self.classes[cj].mask
                dims |= self.classes[cj].req > 0
        may[nodes] = False
        return may, dims

    def _roomy(self, nodes: list[int], k: int) -> list[int]:
        """The ``k`` nodes with the most room (least normalised free resource among those
        asked for) where the pods on ``nodes`` may go instead; ties by index."""
        may, dims = self._reach(nodes, np.zeros(3, dtype=bool))
        others = np.flatnonzero(may)
        if not others.size or not dims.any():
            return []
        slack = (self.pk.free[others][:, dims] * self.inv[others][:, dims]).min(axis=1)
        result: list[int] = others[np.argsort(-slack, kind="stable")[:k]].tolist()
        return result

    def _solve_sub(self, nodes: np.ndarray, domains: Mapping[str, np.ndarray], penalty: int,
                   cfg: EngineConfig, wall_cap_hits: list[int], count_only: bool = True,
                   det_time: float | None = None) -> None:
        classes = self.classes
        removed: list[tuple[int, int]] = [(cj, int(n)) for n in nodes.tolist()
                                          for cj in self.on[n]
                                          if classes[cj].gang is None]
        for cj, n in removed:
            self.take(cj, n)
        inside = {cj for cj, _ in removed}
        extra = [ci for ci, c in enumerate(classes)
                 if ci not in inside and c.gang is None and len(self.got[ci]) < c.count
                 and c.mask[nodes].any()][:cfg.lns_extra_classes]
        members = sorted(inside | set(extra))
        pos = {ci: j for j, ci in enumerate(members)}
        sub: list[ClassSpec] = []
        hint: list[list[int]] = [[] for _ in members]
        local = {int(n): j for j, n in enumerate(nodes.tolist())}
        before = 0
        for cj, n in removed:
            hint[pos[cj]].append(local[n])
            before += int(self.icost[cj][n])
        for ci in members:
            c = classes[ci]
            conf = {k: [pos[o] for o in others if o in pos]
                    for k, others in c.conflicts.items()}
            sub.append(ClassSpec(
                count=c.count - len(self.got[ci]), req=c.req,
                mask=self.pk.unblocked(ci)[nodes], cost=c.cost[nodes],
                conflicts={k: v for k, v in conf.items() if v}))
        before += penalty * sum(sc.count - len(h) for sc, h in zip(sub, hint, strict=True))
        sub_free = self.pk.free[nodes]
        sub_dom = {k: domains[k][nodes] for k in domains}
        sub_cost = [self.icost[ci][nodes] for ci in members]
        res = _cpsat(sub, sub_free, sub_dom, sub_cost, penalty, hint, cfg,
                     det_time=det_time or cfg.lns_deterministic_time,
                     wall_cap_hits=wall_cap_hits,
                     count_only=count_only, presolve=False)
        self.work += 1
        better = res is not None and res[1] < before
        new = res[0] if better and res is not None else hint
        for j, ci in enumerate(members):
            for ln in new[j]:
                self.put(ci, int(nodes[ln]))

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


def _slot_flow(classes: Sequence[ClassSpec], free: np.ndarray, icost: list[np.ndarray],
               penalty: int, got: list[list[int]], cfg: EngineConfig) -> list[list[int]]:
    """Cost among the pods that fit, without losing any: a min-cost flow of pods into
    *slots* -- each placed pod's requests on its node, and each node's free rest -- where a
    pod may take a slot only if the slot holds it in every resource and the node is
    allowed. Whatever goes where, no node holds more than before, so the count is kept
    (every pod may stay in its own slot) and left-out pods may still take a free rest
    (at the penalty, so count still comes first). Classes with anti-affinity or gangs stay
    where they are. Exact, and fast: the flow has one arc per (class, slot shape) kept."""
    n_nodes = free.shape[0]
    fixed = [bool(c.conflicts) or c.gang is not None for c in classes]
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
        return got
    sn = np.asarray(slot_n, dtype=np.int64)
    sr = np.asarray(slot_r, dtype=np.int64)
    key = np.concatenate([sn[:, None], sr], axis=1)
    uniq, inv, mult = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    s_node = uniq[:, 0]
    s_req = uniq[:, 1:]
    movable = [ci for ci in range(len(classes)) if not fixed[ci]]
    nc = len(movable)
    ns = uniq.shape[0]
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
    _ = n_nodes
    return out


def _finish(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
            got: list[list[int]]) -> list[list[int]]:
    """Gangs all-or-nothing, then a cheapest-feasible fill of what is left (no gangs)."""
    if _gangs(classes, got):
        pk = _replay(classes, free, domains, got)
        _fill(pk, got, skip_gangs=True)
    return got


def _pack_stage(classes: Sequence[ClassSpec], free: np.ndarray,
                domains: Mapping[str, np.ndarray], icost: list[np.ndarray], penalty: int,
                got: list[list[int]], best_obj: int, cfg: EngineConfig,
                stats: dict[str, float]) -> tuple[list[list[int]], int, str | None]:
    """Count first: repair the cost-first answer by ejection; if pods that could fit are
    still out, pack from scratch (largest first, tightest fit) and repair that too. The
    lexicographically better answer (more pods, then less cost) wins."""
    order = _pack_order(classes, free)
    method = None
    work = 0
    pa = _Pack(classes, free, domains, icost)
    for ci, nodes in enumerate(got):
        for n in nodes:
            pa.put(ci, n)
    pa.repair(order, cfg.pack_repair_nodes, cfg.pack_work)
    work += pa.work
    tries = [("flow+pack-repair", pa.got)]
    # packing from scratch only when many pods that could fit are still out: on a loose
    # batch a few leftovers are what the capacity can't hold together (LP-checked on the
    # 10,000-pod benchmark), and re-packing 10,000 pods to learn that costs seconds
    left = _placeable(classes, free, pa.got)
    if left and left > cfg.pack_rescue_share * sum(c.count for c in classes):
        pb = _Pack(classes, free, domains, icost)
        pb.greedy(order, cfg.pack_lookahead, cfg.pack_cost)
        pb.repair(order, cfg.pack_repair_nodes, cfg.pack_work)
        work += pb.work
        tries.append(("pack", pb.got))
    for name, g in tries:
        g = _finish(classes, free, domains, [list(x) for x in g])
        obj = _objective(classes, icost, penalty, g)
        if obj < best_obj:
            got, best_obj, method = g, obj, name
    stats["pack_work"] = float(work)
    return got, best_obj, method


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


def _flow_route(classes: Sequence[ClassSpec], free: np.ndarray,
                domains: Mapping[str, np.ndarray], icost: list[np.ndarray], penalty: int,
                cfg: EngineConfig, stats: dict[str, float]
                ) -> tuple[list[list[int]], str, int]:
    """Cost first: flow rounds on the residual capacity with exact packing, a
    cheapest-feasible fill, gangs all-or-nothing. Returns (placement, method, arcs)."""
    pk = Packer(free, domains, classes)
    got: list[list[int]] = [[] for _ in classes]
    order = _rigidity_order(classes)
    method = "flow"
    arcs_total = 0
    for rnd in range(max(cfg.flow_rounds, 1)):
        active = [ci for ci in range(len(classes)) if len(got[ci]) < classes[ci].count]
        if not active:
            break
        sub = [dataclasses.replace(classes[ci], count=classes[ci].count - len(got[ci]),
                                   mask=pk.candidates(ci)) for ci in active]
        wanted, arcs, pruned = _flow(sub, pk.free, domains, [icost[ci] for ci in active],
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
    _fill(pk, got, skip_gangs=False)
    if _gangs(classes, got):
        pk = _replay(classes, free, domains, got)
        _fill(pk, got, skip_gangs=True)
    return got, method, arcs_total


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
    return sum(int((c.mask & _has_room(c.req, free)).sum()) for c in classes)


def _pack_route(classes: Sequence[ClassSpec], free: np.ndarray,
                domains: Mapping[str, np.ndarray], icost: list[np.ndarray], penalty: int,
                cfg: EngineConfig, stats: dict[str, float], wall_cap_hits: list[int]
                ) -> list[list[int]]:
    """Count first: rigid-and-large-first tightest-fit packing with demand look-ahead,
    ejection repair, CP-SAT neighbourhoods for what is still out, then cheaper moves."""
    pa: _Pack | None = None
    best: tuple[int, int] | None = None
    for big in (0.0, cfg.pack_big):  # the second order only if the first leaves pods out
        pb = _Pack(classes, free, domains, icost)
        order = _pack_order(classes, free, big)
        pb.greedy(order, cfg.pack_lookahead, cfg.pack_cost)
        pb.repair(order, cfg.pack_repair_nodes, cfg.pack_work)
        key = (-sum(map(len, pb.got)), _objective(classes, icost, 0, pb.got))
        if best is None or key < best:
            pa, best = pb, key
        if not _placeable(classes, free, pb.got):
            break
    assert pa is not None
    if cfg.use_cpsat and _placeable(classes, free, pa.got):
        stats["lns_solved"] = float(pa.lns(free, domains, penalty, cfg, wall_cap_hits))
    if cfg.use_cpsat and cfg.cost_lns_iterations and (
            sum(c.count for c in classes) <= cfg.pack_flow_max_pods):
        stats["cost_lns_solved"] = float(pa.cost_lns(domains, penalty, cfg, wall_cap_hits))
    got = _finish(classes, free, domains, [list(g) for g in pa.got])
    stats["pack_work"] = float(pa.work)
    return _improve_cost(classes, free, domains, icost, penalty, got, cfg, stats)


def _valid(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
           got: list[list[int]]) -> bool:
    """Replay through the exact packer: every pod allowed, fits, repels nothing."""
    pk = Packer(free, domains, classes)
    for ci, nodes in enumerate(got):
        for n in nodes:
            if not pk.ok(ci, n):
                return False
            pk.put(ci, n)
    return True


def _improve_cost(classes: Sequence[ClassSpec], free: np.ndarray,
                  domains: Mapping[str, np.ndarray], icost: list[np.ndarray], penalty: int,
                  got: list[list[int]], cfg: EngineConfig, stats: dict[str, float]
                  ) -> list[list[int]]:
    """Cost among the pods that fit, the count kept: cost descent (``_descend``), then for
    batches up to ``pack_flow_max_pods`` slot-flow rounds (``_slot_flow``) while they lower
    the objective and a second descent (and for any batch whose descent is skipped for its
    size, ``descent_max_cells``). Each answer is replayed through the exact packer
    and kept only if valid and better. Measured on the tight benchmark: at 3,289 pods the
    slot flow costs 0.5 s CPU and, run before the descent, leaves it a worse start (2,422
    vs 2,402 $/h); at 339 pods it is cheap and takes off another 0.3-0.7 %."""
    obj = _objective(classes, icost, penalty, got)

    def descend() -> None:
        nonlocal got, obj
        new = _descend(classes, free, icost, got, cfg, stats)
        new_obj = _objective(classes, icost, penalty, new)
        if new_obj < obj and _valid(classes, free, domains, new):
            got, obj = new, new_obj

    descend()
    if sum(c.count for c in classes) > cfg.pack_flow_max_pods and (
            "descent_skipped" not in stats):
        return got
    slot_obj = obj
    for _ in range(cfg.slot_rounds):
        new = _slot_flow(classes, free, icost, penalty, got, cfg)
        valid = _valid(classes, free, domains, new)
        new_obj = _objective(classes, icost, penalty, new)
        if not valid or new_obj >= obj:
            break
        got, obj = new, new_obj
        stats["slot_rounds"] = stats.get("slot_rounds", 0.0) + 1
    if obj < slot_obj:
        descend()
    return got


_NEVER = np.int64(1) << 60  # integer cost of a node a class may not use
# a move that cannot be made, in the descent's per-candidate sums: any saving added to it
# (> -2^60) stays above every cost that can win, so no mask has to be applied after the sum
_BIG = np.int64(1) << 61


def _descend(classes: Sequence[ClassSpec], free: np.ndarray, icost: list[np.ndarray],
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
    ``descent_rounds`` passes and ``descent_work`` pods looked at: deterministic.

    Per pod looked at, the work is a few numpy operations over all pods: what does not
    depend on that pod is kept per pod between moves (``slot``: the room at a pod's node
    once it leaves; ``ez``/``ec``: the two nodes a chain may send it to), so that only the
    candidates that pass every check are gathered (3,289 pods: 5x fewer operations than
    gathering and filtering them resource by resource)."""
    pods = [(ci, n) for ci, ns in enumerate(got) for n in ns]
    if not pods or not cfg.descent_rounds:
        return got
    n_cls = len(classes)
    if n_cls * free.shape[0] > cfg.descent_max_cells:
        # its tables are (classes x nodes), about 20 bytes a cell at the peak: bounded
        stats["descent_skipped"] = 1.0
        return got
    movable = np.array([not c.conflicts and c.gang is None for c in classes])
    reqs = np.stack([c.req for c in classes]).astype(np.int64)
    allowed = np.stack([c.mask for c in classes])
    cost = np.where(allowed, np.stack(icost), _NEVER)
    # per node, every class's cost there, _BIG where it may not go (one contiguous row per
    # node): the swap check then compares requests only
    cost_tb = np.ascontiguousarray(np.where(allowed, cost, _BIG).T)
    p_cls = np.array([ci for ci, _ in pods], dtype=np.int64)
    p_node = np.array([n for _, n in pods], dtype=np.int64)
    p_mov = movable[p_cls]
    used = np.zeros_like(free)
    np.add.at(used, p_node, reqs[p_cls])
    # resources as rows (one contiguous array per resource): the checks below compare
    # column by column, much cheaper than ``(k, 3)`` comparisons reduced along an axis
    fr = np.ascontiguousarray((free - used).T)
    p_req = np.ascontiguousarray(reqs[p_cls].T)
    # a pod that may not move never has room for another (its room below any request): a
    # class with a request needs no separate mask of the movable pods
    p_req[:, ~p_mov] = -_NEVER
    p_cost = cost[p_cls, p_node]
    lo = cost.min(axis=1)
    lo_l = lo.tolist()
    mov_l = p_mov.tolist()
    by_cls: list[list[int]] = [[] for _ in classes]
    on_node: list[list[int]] = [[] for _ in range(free.shape[0])]
    for i, (ci, n) in enumerate(pods):
        by_cls[ci].append(i)
        on_node[n].append(i)
    n_nodes = fr.shape[1]
    top = min(3, n_nodes)
    best_z = np.full((n_cls, 3), -1, dtype=np.int64)  # padded: -1 never has room
    best_c = np.full((n_cls, 3), _NEVER, dtype=np.int64)
    ez = np.full((2, p_cls.size), -1, dtype=np.int64)
    ec = np.full((2, p_cls.size), _BIG, dtype=np.int64)  # _BIG: no target
    reqs_l = reqs.tolist()
    # per class, its requests above zero as (resource, amount): what a room check compares
    dims_l = [[(r, v) for r, v in enumerate(rq) if v] for rq in reqs_l]
    p_cls_l = p_cls.tolist()
    # the same as p_node and p_cost, as lists for the per-pod reads (kept in step)
    pn_l, pc_l = p_node.tolist(), p_cost.tolist()
    reqs_t = np.ascontiguousarray(reqs.T)

    def chain_targets(sel: np.ndarray) -> None:
        # the first two of its class's cheapest nodes with room that are not its own node
        zs, cs = best_z[p_cls[sel]], best_c[p_cls[sel]]
        other = zs != p_node[sel][:, None]
        o = np.argsort(~other, axis=1, kind="stable")[:, :2]
        ok = np.take_along_axis(other, o, axis=1)
        ez[:, sel] = np.where(ok, np.take_along_axis(zs, o, axis=1), -1).T
        ok &= np.take_along_axis(cs, o, axis=1) < _NEVER
        ec[:, sel] = np.where(ok, np.take_along_axis(cs, o, axis=1), _BIG).T

    def chain_targets_of(sel: list[int]) -> None:
        # the same for a few pods (a move's, a refreshed class's): plain Python is cheaper
        rows: dict[int, list[tuple[int, int]]] = {}  # per class, read once a call
        for p in sel:
            c, own = p_cls_l[p], int(p_node[p])
            zc = rows.get(c)
            if zc is None:
                zc = rows[c] = list(zip(best_z[c].tolist(), best_c[c].tolist(), strict=True))
            picks = [(z, v) for z, v in zc if z != own]
            picks += [(-1, int(_NEVER))] * (2 - len(picks))
            (ez[0, p], c0), (ez[1, p], c1) = picks[0], picks[1]
            ec[0, p] = c0 if c0 < _NEVER else _BIG
            ec[1, p] = c1 if c1 < _NEVER else _BIG

    every = np.arange(p_cls.size)
    cx_key: tuple[int, int, int, int] | None = None
    cx = cost_tb[0]
    work = 0
    moves = 0
    for _ in range(cfg.descent_rounds):
        improved = 0
        # per class, the three cheapest nodes with room now: where a chain sends the pod
        # it displaces -- the first that is neither its own node nor the one the moving
        # pod leaves (refreshed each pass; checked again before a chain is made)
        # (``cost`` is _NEVER already where a class may not go: no permission mask here)
        room = fr[0][None, :] >= reqs[:, 0][:, None]
        for r in (1, 2):
            room &= fr[r][None, :] >= reqs[:, r][:, None]
        cz = np.where(room, cost, _NEVER)
        part = np.argpartition(cz, top - 1, axis=1)[:, :top] if cz.shape[1] > top else \
            np.broadcast_to(np.arange(top), (n_cls, top))
        part_c = np.take_along_axis(cz, part, axis=1)
        # ties broken by node index, so the answer never depends on the partition's order
        order3 = np.lexsort((part, part_c), axis=1)
        best_z[:, :top] = np.take_along_axis(part, order3, axis=1)
        best_c[:, :top] = np.take_along_axis(part_c, order3, axis=1)
        chain_targets(every)
        # room at each pod's node once it leaves, per resource
        slot = fr[:, p_node] + p_req
        regret = p_cost - lo[p_cls]
        for a in np.lexsort((every, -regret)).tolist():
            ca, here = p_cls_l[a], pc_l[a]
            if not mov_l[a] or (here - lo_l[ca]) <= cfg.descent_regret * here:
                continue
            x = pn_l[a]
            if work >= cfg.descent_work:
                break
            work += 1
            ra = reqs[ca]
            ra0, ra1, ra2 = reqs_l[ca]
            dims = dims_l[ca]
            crow = cost[ca]
            if dims:
                fits = fr[dims[0][0]] >= dims[0][1]
                for r, v in dims[1:]:
                    fits &= fr[r] >= v
                row = np.where(fits, crow, _NEVER)
            else:
                row = crow
            y0 = int(row.argmin())
            best_d, kind, best_b, z_chain = int(row[y0]) - here, 0, -1, -1
            # candidates b: movable, on a node where a is cheaper, a fits there once b left
            cp = crow.take(p_node)  # take: the same values as crow[p_node], cheaper
            m = cp < here
            if not dims:
                m &= p_mov
            for r, v in dims:
                m &= slot[r] >= v
            idx = m.nonzero()[0]
            if idx.size:
                cb = p_cls.take(idx)
                # what a saves on b's node (< 0), less what b pays now
                g = cp.take(idx) - p_cost.take(idx) - here
                # per class: its cost at x if it fits there once a is gone, else _BIG
                c0, c1, c2 = fr[:, x].tolist()
                key = (x, c0 + ra0, c1 + ra1, c2 + ra2)
                if key != cx_key:  # pods of a class on one node often come one after another
                    fx = reqs_t[0] <= key[1]
                    fx &= reqs_t[1] <= key[2]
                    fx &= reqs_t[2] <= key[3]
                    cx, cx_key = np.where(fx, cost_tb[x], _BIG), key
                d_sw = g + cx.take(cb)
                z1 = ez[0].take(idx)
                first = z1 != x
                e1 = ec[0].take(idx)
                if np.count_nonzero(first) < first.size:  # b's first chain target is x:
                    # its second
                    e1 = np.where(first, e1, ec[1].take(idx))
                d_ch = g + e1
                j1, j2 = int(d_sw.argmin()), int(d_ch.argmin())
                if d_sw[j1] < best_d:
                    best_d, kind, best_b = int(d_sw[j1]), 1, int(idx[j1])
                if d_ch[j2] < best_d:
                    best_d, kind, best_b = int(d_ch[j2]), 2, int(idx[j2])
                    z_chain = int(z1[j2]) if first[j2] else int(ez[1][idx[j2]])
            if best_d >= 0:
                continue
            if kind == 0:
                fr[:, x] += ra
                fr[:, y0] -= ra
                p_node[a], p_cost[a] = y0, cost[ca, y0]
                pn_l[a], pc_l[a] = y0, int(p_cost[a])
                on_node[x].remove(a)
                on_node[y0].append(a)
                moved, touched = [a], on_node[x] + on_node[y0]
            else:
                b = best_b
                y, cb1 = int(p_node[b]), int(p_cls[b])
                rb = reqs[cb1]
                z = x if kind == 1 else z_chain
                if kind == 2 and not (fr[:, z] >= rb).all():
                    # the table is stale there (an earlier move of this pass took the
                    # room): that class's row is refreshed, the pod is looked at next pass
                    ok_z = allowed[cb1].copy()
                    for r in range(3):
                        ok_z &= fr[r] >= rb[r]
                    rz = np.where(ok_z, cost[cb1], _NEVER)
                    # its first three by (cost, node index): a stable sort's first three,
                    # sorting only the nodes at or below the third least cost
                    kth = np.partition(rz, top - 1)[top - 1]
                    low = np.flatnonzero(rz <= kth)
                    o3 = low[np.argsort(rz[low], kind="stable")[:top]]
                    best_z[cb1, :top], best_c[cb1, :top] = o3, rz[o3]
                    sel = by_cls[cb1]
                    if len(sel) > 8:  # many pods: the vectorised form (the same targets)
                        chain_targets(np.array(sel, dtype=np.int64))
                    else:
                        chain_targets_of(sel)
                    continue
                fr[:, x] += ra
                fr[:, y] += rb - ra
                fr[:, z] -= rb
                p_node[a], p_cost[a] = y, cost[ca, y]
                p_node[b], p_cost[b] = z, cost[cb1, z]
                pn_l[a], pc_l[a], pn_l[b], pc_l[b] = y, int(p_cost[a]), z, int(p_cost[b])
                on_node[x].remove(a)
                on_node[y].remove(b)
                on_node[y].append(a)
                on_node[z].append(b)
                moved = [a, b]
                touched = on_node[x] + on_node[y] + (on_node[z] if z != x else [])
            chain_targets_of(moved)
            t = np.array(touched, dtype=np.int64)
            slot[:, t] = fr[:, p_node[t]] + p_req[:, t]
            improved += 1
        moves += improved
        if not improved or work >= cfg.descent_work:
            break
    stats["descent_moves"] = stats.get("descent_moves", 0.0) + moves
    stats["descent_work"] = stats.get("descent_work", 0.0) + work
    out: list[list[int]] = [[] for _ in classes]
    for ci, n in zip(p_cls.tolist(), p_node.tolist(), strict=True):
        out[ci].append(n)
    return out


def solve(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
          cfg: EngineConfig) -> SolveOutput:
    """Place every class's pods on node indices, most pods first, then least cost.

    A loose batch takes the flow route (cost-optimal flow, exact packing, repair); if pods
    that fit an allowed node are left out, the pack stage tries to place them. A tight
    batch (``_tight``) takes the pack route first, and the flow route too when small. The
    lexicographically better answer wins; CP-SAT then polishes coupled batches that are
    small enough. Bounded by work throughout: the same input, the same answer."""
    stats: dict[str, float] = {}
    if not classes:
        return SolveOutput([], "none", stats)
    if free.shape[0] == 0:
        return SolveOutput([[] for _ in classes], "none", stats)
    if len(classes) == 1 and classes[0].count == 1:
        return SolveOutput(_single(classes, free, domains), "single", stats)
    icost, penalty = _penalty(classes, cfg.cost_scale)
    hits = [0]
    total = sum(c.count for c in classes)
    if cfg.pack and _tight(classes, free, cfg):
        got = _pack_route(classes, free, domains, icost, penalty, cfg, stats, hits)
        best_obj = _objective(classes, icost, penalty, got)
        method = "pack"
        arcs_total: int | None = None  # counted only if the CP-SAT polish may run
        if total <= cfg.pack_flow_max_pods:
            got_f, m_f, _ = _flow_route(classes, free, domains, icost, penalty, cfg, stats)
            obj_f = _objective(classes, icost, penalty, got_f)
            if obj_f < best_obj:
                got, best_obj, method = got_f, obj_f, m_f
    else:
        got, method, arcs_total = _flow_route(classes, free, domains, icost, penalty, cfg,
                                              stats)
        best_obj = _objective(classes, icost, penalty, got)
        if cfg.pack and _placeable(classes, free, got):
            got, best_obj, m = _pack_stage(classes, free, domains, icost, penalty, got,
                                           best_obj, cfg, stats)
            method = m or method
        if cfg.flow_descent and total <= cfg.pack_flow_max_pods and method != "flow":
            # the flow over-promised (shapes mixed, anti-affinity across classes): the
            # exact packer's rejections went to the cheapest node with room, not the
            # cheapest overall. The count-keeping cost steps of the pack route fix that.
            if cfg.use_cpsat and cfg.cost_lns_iterations:
                pa = _Pack(classes, free, domains, icost)
                for ci, nodes in enumerate(got):
                    for n in nodes:
                        pa.put(ci, n)
                stats["cost_lns_solved"] = float(pa.cost_lns(domains, penalty, cfg, hits))
                got = [list(g) for g in pa.got]
            got = _improve_cost(classes, free, domains, icost, penalty, got, cfg, stats)
            best_obj = _objective(classes, icost, penalty, got)
    if (cfg.use_cpsat and cfg.cpsat_polish and _coupled(classes)
            and (_arcs(classes, free) if arcs_total is None else arcs_total)
            <= cfg.cpsat_max_arcs):
        res = _cpsat(classes, free, domains, icost, penalty, got, cfg, wall_cap_hits=hits)
        if res is not None:
            got2, obj2, status = res
            stats["cpsat_objective"] = float(obj2)
            if obj2 <= best_obj:
                # an answer stopped by the work limit may leave room: fill it (no gangs)
                pk2 = _replay(classes, free, domains, got2)
                _fill(pk2, got2, skip_gangs=True)
                got, best_obj = got2, _objective(classes, icost, penalty, got2)
                method = f"cpsat-{status}"
    # The last step of every route: whatever a pod left out still fits goes in. The cost
    # steps (descent, slot flow, CP-SAT neighbourhoods) move pods and may free room that
    # none of them fills again (measured: 1,000-1,500-pod tight batches left pods out with
    # nodes still fitting them); count first, so a fill that places one more always wins.
    if _placeable(classes, free, got):
        pk = _replay(classes, free, domains, got)
        before = sum(map(len, got))
        _fill(pk, got, skip_gangs=True)
        if sum(map(len, got)) > before:
            stats["refilled"] = float(sum(map(len, got)) - before)
            best_obj = _objective(classes, icost, penalty, got)
    if hits[0]:
        stats["cpsat_wall_cap_hits"] = float(hits[0])
    stats["objective"] = float(best_obj)
    return SolveOutput(got, method, stats)


def _cp_solver(cfg: EngineConfig, det_time: float) -> cp_model.CpSolver:
    """A CP-SAT solver bounded by work, not by the clock: a deterministic time limit, one
    worker, a fixed seed -- the same model gives the same answer on a busy machine. The
    wall-clock limit is only a safety net (far above what the work limit takes); a caller
    that sees it hit reports it (``stats["cpsat_wall_cap_hits"]``), since that answer may
    depend on load."""
    from ortools.sat.python import cp_model  # lazily, as in _cpsat

    s = cp_model.CpSolver()
    p = s.parameters
    p.max_deterministic_time = det_time
    p.max_time_in_seconds = cfg.cpsat_wall_cap_s
    p.num_workers = 1
    p.random_seed = cfg.cpsat_seed
    return s


def _cpsat(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
           icost: list[np.ndarray], penalty: int, hint: list[list[int]], cfg: EngineConfig,
           det_time: float | None = None, wall_cap_hits: list[int] | None = None,
           count_only: bool = False, presolve: bool = True,
           bound: list[float] | None = None, cpu_limit_s: float | None = None,
           trace: list[tuple[float, int]] | None = None
           ) -> tuple[list[list[int]], int, str] | None:
    """Class-level CP-SAT: integer counts per (class, node), resources per node,
    anti-affinity per domain, gangs; minimise cost + penalty x unplaced from ``hint``.
    ``bound``, if given, receives CP-SAT's proven lower bound on that objective.
    ``cpu_limit_s`` (references only, never a scheduling path: it reads the clock) stops the
    search after that much CPU time of this process, so a reference on a loaded machine
    gets the work it is credited with; ``trace`` receives (CPU s, objective) per solution."""
    # imported here: cp_model pulls in pandas (~0.5 s), which a scheduler's start-up (time to
    # its first binding) should not pay before it needs CP-SAT
    from ortools.sat.python import cp_model

    if wall_cap_hits is None:
        wall_cap_hits = [0]
    m = cp_model.CpModel()
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    per_node: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
    placed = []
    obj = []
    for ci, c in enumerate(classes):
        k = capacity_per_node(c.req, free)
        hint_counts: dict[int, int] = {}
        for n in hint[ci]:
            hint_counts[n] = hint_counts.get(n, 0) + 1
        vs = []
        for n in np.flatnonzero(c.mask & (k > 0)).tolist():
            v = m.new_int_var(0, int(min(k[n], c.count)), f"x{ci}_{n}")
            m.add_hint(v, hint_counts.get(n, 0))
            x[ci, n] = v
            per_node.setdefault(n, []).append((ci, v))
            vs.append(v)
            if not count_only:
                obj.append(int(icost[ci][n]) * v)
        p = m.new_int_var(0, c.count, f"p{ci}")
        m.add(p == sum(vs))
        m.add_hint(p, len(hint[ci]))
        placed.append(p)
        obj.append((1 if count_only else penalty) * (c.count - p))
    for n, lst in per_node.items():
        for r in range(3):
            if any(classes[ci].req[r] for ci, _ in lst):
                m.add(sum(int(classes[ci].req[r]) * v for ci, v in lst) <= int(free[n, r]))
    # anti-affinity: u[ci,key,d] says "class ci has a pod in domain d"
    used: dict[tuple[int, str, int], cp_model.IntVar] = {}

    def u(ci: int, key: str, d: int) -> cp_model.IntVar:
        if (ci, key, d) not in used:
            b = m.new_bool_var(f"u{ci}_{key}_{d}")
            dom = domains[key]
            vs = [v for (cj, n), v in x.items() if cj == ci and dom[n] == d]
            m.add(sum(vs) <= classes[ci].count * b)
            used[ci, key, d] = b
        return used[ci, key, d]

    for ci, c in enumerate(classes):
        for key, others in c.conflicts.items():
            dom = domains[key]
            ds = {int(dom[n]) for (cj, n) in x if cj == ci and dom[n] >= 0}
            for d in ds:
                if ci in others:
                    m.add(sum(v for (cj, n), v in x.items() if cj == ci and dom[n] == d) <= 1)
                for o in others:
                    if o > ci or (o < ci and ci not in classes[o].conflicts.get(key, [])):
                        m.add(u(ci, key, d) + u(o, key, d) <= 1)
    gangs: dict[str, list[int]] = {}
    for ci, c in enumerate(classes):
        if c.gang is not None:
            gangs.setdefault(c.gang, []).append(ci)
    for cis in gangs.values():
        y = m.new_bool_var("gang")
        for ci in cis:
            m.add(placed[ci] == classes[ci].count * y)
    m.minimize(sum(obj))
    s = _cp_solver(cfg, det_time if det_time is not None else cfg.cpsat_deterministic_time)
    # small neighbourhoods: presolve costs more than it saves (measured: 10 ms vs 45 ms)
    s.parameters.cp_model_presolve = presolve
    cb = None
    if cpu_limit_s is not None or trace is not None:
        cb = _Watch(s, cpu_limit_s, trace)
    st = s.solve(m, cb.cb if cb is not None else None)
    if cb is not None:
        cb.done.set()
    if s.wall_time >= s.parameters.max_time_in_seconds * 0.98:
        wall_cap_hits[0] += 1
    if bound is not None:
        bound.append(float(s.best_objective_bound))
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    got: list[list[int]] = [[] for _ in classes]
    for (ci, n), v in x.items():
        got[ci].extend([n] * int(s.value(v)))
    value = _objective(classes, icost, penalty, got) if count_only else round(s.objective_value)
    return got, value, "optimal" if st == cp_model.OPTIMAL else "feasible"


class _Watch:
    """For references: stops a CP-SAT search after ``cpu_limit_s`` of process CPU time (a
    watcher thread; the solve releases the GIL) and records each solution's CPU time and
    objective. It reads the clock, so only the benchmark's references use it."""

    def __init__(self, solver: Any, cpu_limit_s: float | None,
                 trace: list[tuple[float, int]] | None) -> None:
        import threading
        import time

        from ortools.sat.python import cp_model

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


# -- references for tests and the benchmark -------------------------------------------------
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
    from ortools.sat.python import cp_model

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
    """The engine's own CP-SAT model (``_cpsat``: count first, then cost; every resource,
    all anti-affinity, gangs), solved from ``hint`` for up to ``time_limit_s`` of wall
    time -- a reference for the benchmark, not a scheduling path. When the hint places
    every pod, CP-SAT's bound on its objective is a lower bound on the cost of any
    placement of every pod, one that integrality makes tighter than the LP's."""
    icost, penalty = _penalty(classes, cfg.cost_scale)
    cpu = max(cpu_checkpoints) if cpu_checkpoints else None
    # with CPU checkpoints the wall clock is only a safety net (a loaded machine)
    ref = dataclasses.replace(cfg, cpsat_wall_cap_s=time_limit_s if cpu is None
                              else max(time_limit_s, 20 * cpu))
    bound: list[float] = []
    trace: list[tuple[float, int]] = []
    res = _cpsat(classes, free, domains, icost, penalty, hint, ref, det_time=1e9,
                 bound=bound, cpu_limit_s=cpu, trace=trace)
    hint_obj = _objective(classes, icost, penalty, hint)
    at: dict[float, float] = {}
    for t in cpu_checkpoints:
        best = min([o for ts, o in trace if ts <= t] + [hint_obj])
        at[t] = (best % penalty) / cfg.cost_scale  # cost < penalty: the rest is the count
    got = res[0] if res is not None else hint
    if _objective(classes, icost, penalty, got) > _objective(classes, icost, penalty, hint):
        got = hint
    placed = sum(map(len, got))
    unplaced = sum(c.count for c in classes) - placed
    lo = (bound[0] - penalty * unplaced) if bound else 0.0
    return CostReference(placed, _objective(classes, icost, 0, got) / cfg.cost_scale,
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
    from ortools.linear_solver import pywraplp

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
