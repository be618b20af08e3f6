"""The engine's per-pod price of a node, computed again in plain Python for the reference.

``scores.total_cost`` term by term, in the same order of floating-point operations (so the
integer-scaled costs are the engine's): price, energy and carbon by the pod's dominant
share of the node, data gravity, the share of the latency SLA used, the node's dominant
utilisation after the pod (balance), the preferred node-affinity weight missed, untolerated
``PreferNoSchedule`` taints, and InterPodAffinity's normalised score against the running
pods. No batch pod enters a price: the reference's objective is a sum over (pod, node).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cloud_core.placement.config import EngineConfig
from cloud_core.placement.model import ClusterSnapshot, NodeInfo, Workload
from tools.ref_rules import Links, label, node_term, term_hits, tolerated

MAX_SCORE = 100


class Pricer:
    """Prices of pods on nodes of one snapshot."""

    def __init__(self, snap: ClusterSnapshot, links: Links, cfg: EngineConfig) -> None:
        self.snap, self.links, self.cfg = snap, links, cfg
        self.nodes = list(snap.nodes)
        self.names = {n.name: i for i, n in enumerate(self.nodes)}
        self.zone_region: dict[str, str] = {}
        for n in self.nodes:
            self.zone_region.setdefault(n.zone, n.region)

    def locate(self, name: str | None) -> tuple[str | None, str | None]:
        """(zone, region) of a node, zone or region name, looked up in that order."""
        if name is None:
            return None, None
        if name in self.names:
            nd = self.nodes[self.names[name]]
            return nd.zone, nd.region
        if name in self.zone_region:
            return name, self.zone_region[name]
        if any(n.region == name for n in self.nodes):
            return None, name
        return None, None

    def interpod(self, w: Workload, mask: Sequence[int]) -> dict[int, float] | None:
        """InterPodAffinity's cost share per node of ``mask`` (None: nothing scores)."""
        acc: dict[tuple[str, str], int] = {}

        def add(key: str, node: str, weight: int) -> None:
            i = self.names.get(node)
            d = label(self.nodes[i], key) if i is not None else None
            if d is not None:
                acc[key, d] = acc.get((key, d), 0) + weight

        for sign, terms in ((1, w.preferred_pod_affinity), (-1, w.preferred_pod_anti_affinity)):
            for weight, t in terms:
                for p in self.snap.pods:
                    if term_hits(t, w.namespace, p.namespace, p.labels):
                        add(t.topology_key, p.node, sign * weight)
        hard = self.cfg.hard_pod_affinity_weight
        for p in self.snap.pods:
            for t in p.affinity if hard > 0 else ():
                if term_hits(t, p.namespace, w.namespace, w.labels):
                    add(t.topology_key, p.node, hard)
            for sign, pref in ((1, p.preferred_affinity), (-1, p.preferred_anti_affinity)):
                for weight, t in pref:
                    if term_hits(t, p.namespace, w.namespace, w.labels):
                        add(t.topology_key, p.node, sign * weight)
        if not acc:
            return None
        keys = {k for k, _ in acc}
        raw = {i: sum(acc.get((k, d), 0) for k in keys
                      if (d := label(self.nodes[i], k)) is not None) for i in mask}
        if not raw:
            return {}
        lo, hi = min(raw.values()), max(raw.values())
        if hi <= lo:
            return dict.fromkeys(raw, 0.0)
        score = {i: math.trunc(float(MAX_SCORE) * (float(r - lo) / float(hi - lo)))
                 for i, r in raw.items()}
        top = max(score.values())
        return {i: (top - s) / MAX_SCORE for i, s in score.items()}

    def price(self, w: Workload, i: int, pod_share: float | None) -> float:
        """The engine's $/hour for ``w`` on node ``i`` (``pod_share``: InterPodAffinity's)."""
        nd, cfg, wt = self.nodes[i], self.cfg, self.cfg.weights
        req = (float(w.requests.cpu_milli), float(w.requests.mem_bytes), float(w.requests.gpus))
        caps = (nd.capacity.cpu_milli, nd.capacity.mem_bytes, nd.capacity.gpus)
        alloc = (nd.allocated.cpu_milli, nd.allocated.mem_bytes, nd.allocated.gpus)
        inv = [1.0 / max(c, 1) if c > 0 else 0.0 for c in caps]
        cpu_share = min(req[0] * inv[0], 1.0)
        share = cpu_share
        for r in (1, 2):
            if req[r]:
                share = max(share, min(req[r] * inv[r], 1.0))
        kw = (nd.idle_watts * share + max(nd.max_watts - nd.idle_watts, 0.0) * cpu_share
              ) / 1000.0
        total = wt.price * w.cost_weight * (share * nd.price_per_hour)
        total += wt.energy * w.cost_weight * (kw * nd.energy_price_per_kwh)
        total += wt.carbon * w.cost_weight * (kw * nd.carbon_g_per_kwh * cfg.carbon_price_per_g)
        if w.data_gb > 0:
            total += wt.data * w.cost_weight * self._data(w, nd)
        if w.max_latency_ms is not None and w.latency_to is not None:
            total += wt.latency * self._latency(w, nd)
        after = max((alloc[r] + req[r]) * inv[r] for r in range(3))
        total += wt.balance * min(after, 1.0)
        terms = [(weight, t) for weight, t in w.preferred_node_affinity if t.match_expressions]
        if terms:
            whole = float(sum(weight for weight, _ in terms))
            got = 0.0
            for weight, t in terms:
                got += weight * float(node_term(t, nd))
            total += wt.affinity * (1.0 - got / whole)
        soft = sum(1 for t in nd.taints if t.effect == "PreferNoSchedule"
                   and not tolerated(w, t.key, t.value, t.effect))
        total += wt.taint * float(soft)
        if pod_share is not None:
            total += wt.pod_affinity * pod_share
        return total

    def _data(self, w: Workload, nd: NodeInfo) -> float:
        cfg = self.cfg
        zone, region = self.locate(w.data_location)
        same_region = bool(region) and nd.region == region
        same_zone = nd.zone == zone if zone else same_region
        per_gb = (0.0 if same_zone else cfg.intra_region_per_gb if same_region
                  else cfg.inter_region_per_gb)
        return w.data_gb * per_gb / cfg.data_amortize_hours

    def _latency(self, w: Workload, nd: NodeInfo) -> float:
        bound = w.max_latency_ms
        assert bound is not None and w.latency_to is not None
        if bound <= 0:
            return 0.0
        p95 = self.links.p95(nd, w.latency_to)
        return min(p95 / bound, 1.0) if math.isfinite(p95) else 1.0
