"""Per-snapshot indexes: node attributes as numpy arrays, and best-link latency per target.

Built once per snapshot (``PreparedCluster``) so that every workload class is evaluated
against all nodes with a few vector operations instead of a Python loop per (pod, node).
"""

from __future__ import annotations

import math

import numpy as np

from cloud_core.errors import PlacementError

from .changes import changed_positions
from .config import EngineConfig
from .filters import requirement_matches
from .model import (
    COUNT_MAX,
    ClusterSnapshot,
    LinkInfo,
    NodeInfo,
    NodeSelectorTerm,
    Resources,
    Taint,
    bounded,
    topology_domain,
)

INF = math.inf


def effective_p95(link: LinkInfo, cfg: EngineConfig) -> float:
    """p95 RTT with staleness counted against the link (inf: no usable measurement)."""
    if link.age_s > cfg.expire_after_s or not math.isfinite(link.rtt_p95_ms):
        return INF
    if link.age_s > cfg.stale_after_s:
        return link.rtt_p95_ms * cfg.stale_factor
    return link.rtt_p95_ms


def _resource_array(rs: list[Resources]) -> np.ndarray:
    """(n, 3) int64 of cpu, memory, GPUs; a figure past ``COUNT_MAX`` (a snapshot not built
    by the core's own sources, which clamp already) is clamped, never an OverflowError."""
    n = len(rs)
    try:
        a = np.fromiter((x for r in rs for x in (r.cpu_milli, r.mem_bytes, r.gpus)),
                        np.int64, 3 * n)
        if n and (np.abs(a) <= COUNT_MAX).all():
            return a.reshape(n, 3)
    except OverflowError:
        pass
    return np.fromiter((bounded(x) for r in rs for x in (r.cpu_milli, r.mem_bytes, r.gpus)),
                       np.int64, 3 * n).reshape(n, 3)


class ClusterIndex:
    """Numpy views of a snapshot plus lazily built latency-to-target arrays."""

    def __init__(self, snap: ClusterSnapshot, cfg: EngineConfig,
                 base: ClusterIndex | None = None) -> None:
        self.snap = snap
        self.cfg = cfg
        nodes = snap.nodes
        self.nodes: tuple[NodeInfo, ...] = nodes
        self.n = len(nodes)
        if base is not None and base.n == self.n and self._carry(base):
            return
        self.pos: dict[str, int] = {nd.name: i for i, nd in enumerate(nodes)}
        if len(self.pos) != self.n:
            names = [nd.name for nd in nodes]
            dup = next(x for x in names if names.count(x) > 1)
            raise PlacementError(f"node {dup!r} appears twice in the snapshot")
        # flat iterators: a nested list per node cost twice as much (one snapshot per step)
        self.cap = _resource_array([nd.capacity for nd in nodes])
        self.alloc = _resource_array([nd.allocated for nd in nodes])
        # 1/capacity, 0 where a node has none (a request for it is filtered out anyway)
        self.inv_cap = np.where(self.cap > 0, 1.0 / np.maximum(self.cap, 1), 0.0)
        f = np.array([[nd.price_per_hour, nd.energy_price_per_kwh, nd.carbon_g_per_kwh,
                       nd.idle_watts, nd.max_watts] for nd in nodes],
                     dtype=np.float64).reshape(self.n, 5)
        self.price, self.energy_price, self.carbon, self.idle_w, self.max_w = f.T
        self.regions: dict[str, int] = {}
        self.zones: dict[str, int] = {}
        self.zone_region: dict[str, str] = {}
        for nd in nodes:
            self.regions.setdefault(nd.region, len(self.regions))
            self.zones.setdefault(nd.zone, len(self.zones))
            self.zone_region.setdefault(nd.zone, nd.region)
        self.region_id = np.array([self.regions[nd.region] for nd in nodes], dtype=np.int64)
        self.zone_id = np.array([self.zones[nd.zone] for nd in nodes], dtype=np.int64)
        self._domain_ids: dict[str, tuple[np.ndarray, dict[str, int]]] = {}
        self._term_mask: dict[NodeSelectorTerm, np.ndarray] = {}
        self._soft_taints: tuple[np.ndarray, list[tuple[Taint, ...]]] | None = None
        self._lat: dict[str, np.ndarray] = {}
        self._peers: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        self._l_src = self._l_dst = np.zeros(0, dtype=np.int64)
        self._l_val = np.zeros(0, dtype=np.float64)
        self._names: list[str] | None = None
        self._max_pods: tuple[int, np.ndarray] | None = None
        self._alloc0 = self.alloc.copy()  # as the snapshot says (``alloc`` follows a batch)

    def _carry(self, base: ClusterIndex) -> bool:
        """Take ``base``'s indexes of the node facts, for a snapshot whose nodes are
        ``base``'s, in the same order, with the same facts and links, and only their
        ``allocated`` changed (the caller's word: ``carry.Carry``; the links may differ: what
        reads them is built afresh, lazily, from this snapshot): the per-node Python
        of ``__init__`` is then done only for the nodes whose ``NodeInfo`` is a new object.
        False (nothing taken): a changed node has another name."""
        # a step carries 5,000 nodes of which one or two changed
        changed = changed_positions(self.nodes, base.nodes)
        if any(self.nodes[i].name != base.nodes[i].name for i in changed):
            return False
        alloc = base._alloc0.copy()
        if changed:
            alloc[changed] = _resource_array([self.nodes[i].allocated for i in changed])
        self.alloc = alloc
        self._alloc0 = alloc.copy()
        self.pos, self.cap, self.inv_cap = base.pos, base.cap, base.inv_cap
        self.price, self.energy_price, self.carbon = base.price, base.energy_price, base.carbon
        self.idle_w, self.max_w = base.idle_w, base.max_w
        self.regions, self.zones, self.zone_region = base.regions, base.zones, base.zone_region
        self.region_id, self.zone_id = base.region_id, base.zone_id
        # the lazily built ones are shared: what either view adds holds for both
        self._domain_ids, self._term_mask = base._domain_ids, base._term_mask
        self._soft_taints = base._soft_taints
        self._names, self._max_pods = base._names, base._max_pods
        self._lat = {}
        self._peers = None
        self._l_src = self._l_dst = np.zeros(0, dtype=np.int64)
        self._l_val = np.zeros(0, dtype=np.float64)
        return True

    def names(self) -> list[str]:
        """The nodes' names, in order (built once; read-only)."""
        if self._names is None:
            self._names = [nd.name for nd in self.nodes]
        return self._names

    def max_pods(self, unbounded: int) -> np.ndarray:
        """Per node, how many pods it takes (``unbounded`` where it says nothing); read-only."""
        if self._max_pods is None or self._max_pods[0] != unbounded:
            got = np.array([unbounded if nd.max_pods is None else nd.max_pods
                            for nd in self.nodes], dtype=np.int64)
            got.flags.writeable = False
            self._max_pods = (unbounded, got)
        return self._max_pods[1]

    # -- topology ------------------------------------------------------------------------
    def domain_ids(self, key: str) -> tuple[np.ndarray, dict[str, int]]:
        """Per node, the id of its domain under a topology key (-1: node lacks the key)."""
        got = self._domain_ids.get(key)
        if got is None:
            ids: dict[str, int] = {}
            arr = np.full(self.n, -1, dtype=np.int64)
            for i, nd in enumerate(self.nodes):
                d = topology_domain(nd, key)
                if d is not None:
                    arr[i] = ids.setdefault(d, len(ids))
            got = (arr, ids)
            self._domain_ids[key] = got
        return got

    # -- labels and taints (soft costs) --------------------------------------------------
    def term_mask(self, term: NodeSelectorTerm) -> np.ndarray:
        """Nodes matching a node selector term (expressions ANDed; an empty term matches
        nothing, as in Kubernetes). Each requirement is evaluated once per distinct value of
        its label, not once per node, and the mask is kept: labels don't change within a
        snapshot and many workload classes share their preferred terms."""
        got = self._term_mask.get(term)
        if got is None:
            got = np.zeros(self.n, dtype=bool) if not term.match_expressions \
                else np.ones(self.n, dtype=bool)
            for req in term.match_expressions:
                ids, values = self.domain_ids(req.key)  # -1: label absent
                lut = np.empty(len(values) + 1, dtype=bool)
                for v, i in values.items():
                    lut[i] = requirement_matches(req, v)
                lut[-1] = requirement_matches(req, None)
                got &= lut[ids]
            got.flags.writeable = False  # shared by every class that prefers this term
            self._term_mask[term] = got
        return got

    def soft_taints(self) -> tuple[np.ndarray, list[tuple[Taint, ...]]]:
        """Per node, the id of its set of ``PreferNoSchedule`` taints, and the distinct sets
        (id 0 is the empty set when some node has none): tolerations are then matched once
        per distinct set, not once per node."""
        if self._soft_taints is None:
            seen: dict[tuple[Taint, ...], int] = {(): 0}
            ids = np.fromiter(
                (seen.setdefault(tuple(t for t in nd.taints if t.effect == "PreferNoSchedule"),
                                 len(seen)) for nd in self.nodes),
                dtype=np.int64, count=self.n)
            self._soft_taints = (ids, list(seen))
        return self._soft_taints

    def locate(self, name: str | None) -> tuple[str | None, str | None, str | None]:
        """(node, zone, region) of a node, zone or region name -- in that lookup order."""
        if name is None:
            return None, None, None
        if name in self.pos:
            nd = self.nodes[self.pos[name]]
            return nd.name, nd.zone, nd.region
        if name in self.zones:
            return None, name, self.zone_region[name]
        if name in self.regions:
            return None, None, name
        return None, None, None

    # -- latency -------------------------------------------------------------------------
    def _build_links(self) -> None:
        """Every link as arrays (both directions: RTT is a round trip, a link measured from
        either end tells the same story), plus per-peer arrays for peers that aren't nodes."""
        pos = self.pos
        src: list[int] = []
        dst: list[int] = []
        val: list[float] = []
        peers: dict[str, tuple[list[int], list[float]]] = {}
        for (a, b), link in self.snap.links.items():
            v = effective_p95(link, self.cfg)
            i, j = pos.get(a), pos.get(b)
            for x, y, yname in ((i, j, b), (j, i, a)):
                if x is None:
                    continue
                if y is None:
                    lst = peers.setdefault(yname, ([], []))
                    lst[0].append(x)
                    lst[1].append(v)
                else:
                    src.append(x)
                    dst.append(y)
                    val.append(v)
        self._l_src = np.array(src, dtype=np.int64)
        self._l_dst = np.array(dst, dtype=np.int64)
        self._l_val = np.array(val, dtype=np.float64)
        self._peers = {k: (np.array(a, dtype=np.int64), np.array(b, dtype=np.float64))
                       for k, (a, b) in peers.items()}

    def latency_to(self, target: str) -> np.ndarray:
        """Effective p95 (ms) from every node to ``target``; inf where nothing is measured.

        A zone or region target means the best link from the candidate to any node in it
        (an ingress routes users through the nearest member), and 0 for candidates inside it.
        """
        got = self._lat.get(target)
        if got is not None:
            return got
        if self._peers is None:
            self._build_links()
        assert self._peers is not None
        node, zone, region = self.locate(target)
        out = np.full(self.n, INF)
        if node is not None:
            sel = self._l_dst == self.pos[node]
        elif zone is not None:
            sel = self.zone_id[self._l_dst] == self.zones[zone]
        elif region is not None:
            sel = self.region_id[self._l_dst] == self.regions[region]
        else:
            sel = None  # a measured peer that is not a node (a user gateway)
        if sel is not None:
            np.minimum.at(out, self._l_src[sel], self._l_val[sel])
        elif target in self._peers:
            idx, val = self._peers[target]
            np.minimum.at(out, idx, val)
        if node is not None:
            out[self.pos[node]] = 0.0
        elif zone is not None:
            out[self.zone_id == self.zones[zone]] = 0.0
        elif region is not None:
            out[self.region_id == self.regions[region]] = 0.0
        self._lat[target] = out
        return out
