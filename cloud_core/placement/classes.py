"""The solver's shared vocabulary: a class of identical pods (``ClassSpec``), the exact
incremental packer (``Packer``), the objective on integer costs (most pods first, then least
cost), and the steps every route ends with (a cheapest-feasible fill, gangs all-or-nothing,
a replay that checks an answer). Pure numpy: no OR-Tools here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

HOST = "kubernetes.io/hostname"


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


def has_room(req: np.ndarray, free: np.ndarray) -> np.ndarray:
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


def integer_costs(classes: Sequence[ClassSpec], scale: float) -> tuple[list[np.ndarray], int]:
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


def rigidity_order(classes: Sequence[ClassSpec]) -> list[int]:
    """Most constrained classes first: they have the fewest alternatives."""
    return sorted(range(len(classes)), key=lambda ci: int(classes[ci].mask.sum()))


def replay(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
            got: list[list[int]]) -> Packer:
    pk = Packer(free, domains, classes)
    for ci, nodes in enumerate(got):
        for n in nodes:
            pk.put(ci, n)
    return pk


def fill(pk: Packer, got: list[list[int]], skip_gangs: bool) -> None:
    """Cheapest-feasible placement of whatever is still unplaced (exact checks)."""
    classes = pk.classes
    for ci in rigidity_order(classes):
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


def drop_partial_gangs(classes: Sequence[ClassSpec], got: list[list[int]]) -> bool:
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


def objective(classes: Sequence[ClassSpec], icost: list[np.ndarray], penalty: int,
               got: list[list[int]]) -> int:
    tot = 0
    for ci, c in enumerate(classes):
        if got[ci]:
            tot += int(icost[ci][np.asarray(got[ci])].sum())
        tot += penalty * (c.count - len(got[ci]))
    return tot


def most(ci: int, c: ClassSpec, free: np.ndarray,
         domains: Mapping[str, np.ndarray] | None = None) -> int:
    """At most how many pods of class ``ci`` fit: none without an allowed node with room
    before the batch; with required anti-affinity to itself over a topology key (and
    ``domains``), one per domain holding such a node (the SLA family's replicas confined to
    a few nodes by residency and latency: more than that is never placed, and the count
    neighbourhoods and the exact step need not try)."""
    ok = c.mask & has_room(c.req, free)
    if not ok.any():
        return 0
    top = c.count
    for key, others in c.conflicts.items():
        if ci in others and domains is not None and key in domains:
            dom = domains[key][ok]
            if (dom >= 0).all():
                top = min(top, int(np.unique(dom).size))
    return top


def placeable(classes: Sequence[ClassSpec], free: np.ndarray, got: list[list[int]],
              domains: Mapping[str, np.ndarray] | None = None) -> int:
    """Unplaced pods of classes that fit some allowed node's free capacity before the batch
    (within ``most``): the ones a better packing could still place (the others have no node
    at all, or no domain their anti-affinity leaves free)."""
    out = 0
    for ci, c in enumerate(classes):
        left = c.count - len(got[ci])
        if left > 0:
            out += max(min(left, most(ci, c, free, domains) - len(got[ci])), 0)
    return out


def finish(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
            got: list[list[int]]) -> list[list[int]]:
    """Gangs all-or-nothing, then a cheapest-feasible fill of what is left (no gangs)."""
    if drop_partial_gangs(classes, got):
        pk = replay(classes, free, domains, got)
        fill(pk, got, skip_gangs=True)
    return got


def valid(classes: Sequence[ClassSpec], free: np.ndarray, domains: Mapping[str, np.ndarray],
           got: list[list[int]]) -> bool:
    """Replay through the exact packer: every pod allowed, fits, repels nothing."""
    pk = Packer(free, domains, classes)
    for ci, nodes in enumerate(got):
        for n in nodes:
            if not pk.ok(ci, n):
                return False
            pk.put(ci, n)
    return True
