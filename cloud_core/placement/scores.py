"""Soft costs ($/hour, lower is better). Each term is a small function over node arrays.

The functions are written with numpy broadcasting so the same code scores one node (scalars
or 1-element arrays, for explanations and tests) and all nodes at once (for the solver).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .config import EngineConfig
from .filters import term_matches_pod, tolerates
from .index import ClusterIndex
from .model import PodAffinityTerm, RunningPod, Taint, Toleration, Workload
from .sla import judge

Arr = np.ndarray
TERMS = ("price", "energy", "carbon", "data", "latency", "balance", "affinity", "taint",
         "pod_affinity")
MAX_NODE_SCORE = 100  # kube-scheduler's framework.MaxNodeScore
SOFT_EFFECT = "PreferNoSchedule"


def dominant_share(req: Arr, cap: Arr) -> Arr:
    """Largest fraction of any capacity the request takes (DRF's dominant share)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(cap > 0, req / np.maximum(cap, 1), np.where(req > 0, np.inf, 0.0))
    return np.asarray(s.max(axis=-1))


def price_cost(share: Arr, price_per_hour: Arr) -> Arr:
    """A pod pays the node's hourly price in proportion to its dominant share."""
    result: Arr = share * price_per_hour
    return result


def power_kw(share: Arr, cpu_share: Arr, idle_w: Arr, max_w: Arr) -> Arr:
    """Linear power model: its share of idle power plus its CPU share of the dynamic range."""
    result: Arr = (idle_w * share + np.maximum(max_w - idle_w, 0.0) * cpu_share) / 1000.0
    return result


def energy_cost(kw: Arr, energy_price_per_kwh: Arr) -> Arr:
    result: Arr = kw * energy_price_per_kwh
    return result


def carbon_cost(kw: Arr, carbon_g_per_kwh: Arr, carbon_price_per_g: float) -> Arr:
    result: Arr = kw * carbon_g_per_kwh * carbon_price_per_g
    return result


def data_cost(data_gb: float | Arr, same_zone: Arr, same_region: Arr, cfg: EngineConfig) -> Arr:
    """Data gravity: moving ``data_gb`` to the node, amortised over ``data_amortize_hours``."""
    per_gb = np.where(same_zone, 0.0, np.where(same_region, cfg.intra_region_per_gb,
                                               cfg.inter_region_per_gb))
    return data_gb * per_gb / cfg.data_amortize_hours


def balance_cost(alloc_after: Arr, cap: Arr) -> Arr:
    """Least-allocated: dominant utilisation of the node after placing the pod."""
    result: Arr = np.minimum(dominant_share(alloc_after, cap), 1.0)
    return result


def affinity_cost(matched: Arr, total: float) -> Arr:
    """Soft node affinity: the share of the preferred weight a node misses (0: it matches
    every preferred term, 1: none). Normalised by the total so that a workload with many
    preferences can't outweigh price, latency and the rest merely by having more of them."""
    if total <= 0:
        return np.zeros_like(matched, dtype=np.float64)
    return 1.0 - np.asarray(matched, dtype=np.float64) / total


def preferred_weight(w: Workload, ix: ClusterIndex, sel: Arr | slice = slice(None)
                     ) -> tuple[Arr, float]:
    """Per node of ``sel``, the summed weight of the preferred terms it matches, and the
    total weight. Empty terms are left out of both: Kubernetes makes them no-ops."""
    terms = [(wt, t) for wt, t in w.preferred_node_affinity if t.match_expressions]
    total = float(sum(wt for wt, _ in terms))
    matched = np.zeros(ix.n, dtype=np.float64)[sel]
    for wt, t in terms:
        matched += wt * ix.term_mask(t)[sel]
    return matched, total


# -- InterPodAffinity (kube-scheduler's Score plugin, interpodaffinity/scoring.go) ----------
def interpod_raw(w: Workload, ix: ClusterIndex,
                 matching: Callable[[PodAffinityTerm, str], Iterable[RunningPod]],
                 symmetric: Iterable[tuple[RunningPod, PodAffinityTerm, int]]) -> Arr | None:
    """Per node, InterPodAffinity's raw score of ``w`` (PreScore + Score), or None when
    nothing contributes (kube's Skip: every node scores the same).

    For every running pod, the score of its topology domain changes by:

    * +weight for each of ``w``'s preferred affinity terms it matches, -weight for each of
      ``w``'s preferred anti-affinity terms (``matching(term, w.namespace)``: the pods a
      term selects);
    * its own terms that select ``w`` (``symmetric``: (pod, term, signed weight) triples,
      already filtered to terms that match ``w``): ``hard_pod_affinity_weight`` for its
      required affinity, +/- weight for its preferred affinity / anti-affinity.

    A node's raw score is the sum, over the topology keys, of its domain's score (nodes
    lacking a key take nothing from it). Terminating pods count, as they do upstream."""
    acc: dict[str, dict[int, int]] = {}

    def add(key: str, node: str, weight: int) -> None:
        i = ix.pos.get(node)
        if i is None:
            return
        dom = ix.domain_ids(key)[0]
        d = int(dom[i])
        if d >= 0:
            m = acc.setdefault(key, {})
            m[d] = m.get(d, 0) + weight

    for sign, terms in ((1, w.preferred_pod_affinity), (-1, w.preferred_pod_anti_affinity)):
        for weight, t in terms:
            for p in matching(t, w.namespace):
                add(t.topology_key, p.node, sign * weight)
    for p, t, weight in symmetric:
        add(t.topology_key, p.node, weight)
    if not acc:
        return None
    raw = np.zeros(ix.n, dtype=np.int64)
    for key, m in acc.items():
        dom = ix.domain_ids(key)[0]
        per = np.zeros(int(dom.max()) + 2, dtype=np.int64)  # last entry: lacks the key
        for d, v in m.items():
            per[d] = v
        raw += per[dom]
    return raw


def matches_newcomer(p: RunningPod, t: PodAffinityTerm, w: Workload) -> bool:
    """Does the running pod ``p``'s term ``t`` select ``w`` (namespaces relative to ``p``)."""
    return term_matches_pod(t, p.namespace, w.namespace, w.labels)


def interpod_scores(raw: Arr, sel: Arr | slice = slice(None)) -> Arr:
    """NormalizeScore over the nodes ``sel`` (kube: the nodes that passed the filters):
    ``int64(MaxNodeScore * (float64(s - min) / float64(max - min)))``, 0 when all are
    equal. In float64 as Go computes it, so a ratio such as 0.29 truncates as it does there
    (28, not 29); raw scores stay far below 2^53, where float64 is exact."""
    s = raw[sel]
    if s.size == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = int(s.min()), int(s.max())
    if hi <= lo:
        return np.zeros(s.shape, dtype=np.int64)
    ratio = (s - lo).astype(np.float64) / float(hi - lo)
    return np.trunc(float(MAX_NODE_SCORE) * ratio).astype(np.int64)


def interpod_cost(raw: Arr | None, n: int, sel: Arr | slice = slice(None)) -> Arr | None:
    """Per node (length ``n``): the share of the best normalised score the node misses
    (``(max - score) / 100``: 0 on the best nodes, 1 on the worst when scores differ), with
    the normalisation over ``sel``; None when nothing contributes."""
    if raw is None:
        return None
    out = np.zeros(n, dtype=np.float64)
    sc = interpod_scores(raw, sel)
    if sc.size:
        out[sel] = (int(sc.max()) - sc) / MAX_NODE_SCORE
    return out


def untolerated_soft_taints(tolerations: tuple[Toleration, ...],
                            taints: tuple[Taint, ...]) -> int:
    """How many ``PreferNoSchedule`` taints no toleration covers (same matching as the
    ``taints`` filter applies to ``NoSchedule``/``NoExecute``)."""
    return sum(1 for t in taints if t.effect == SOFT_EFFECT
               and not any(tolerates(tol, t) for tol in tolerations))


def taint_counts(w: Workload, ix: ClusterIndex, sel: Arr | slice = slice(None)) -> Arr:
    """``untolerated_soft_taints`` on every node of ``sel``, once per distinct taint set."""
    ids, distinct = ix.soft_taints()
    sub = ids[sel]
    if len(distinct) == 1:  # no node has a PreferNoSchedule taint
        return np.zeros(sub.shape, dtype=np.float64)
    per_set = np.array([untolerated_soft_taints(w.tolerations, ts) for ts in distinct],
                       dtype=np.float64)
    result: Arr = per_set[sub]
    return result


def components(w: Workload, ix: ClusterIndex, sel: Arr | slice = slice(None),
               pod_cost: Arr | None = None) -> dict[str, Arr]:
    """Weighted cost terms of ``w`` on nodes ``ix.nodes[sel]`` (a dict of arrays).
    ``pod_cost``: ``interpod_cost`` over all nodes (None: no InterPodAffinity score)."""
    return _terms(w, ix, sel, pod_cost, zeros=True)


def _at(a: Arr, sel: Arr | slice) -> Arr:
    """``a[sel]``: by ``take`` when ``sel`` is an index array (the same rows; numpy's
    row gather of an (N, 3) array by fancy indexing is ~5x slower, and it ran once per
    class of every batch)."""
    if isinstance(sel, np.ndarray) and sel.dtype != np.bool_:
        return a.take(sel, axis=0)
    return a[sel]


def _terms(w: Workload, ix: ClusterIndex, sel: Arr | slice, pod_cost: Arr | None,
           zeros: bool) -> dict[str, Arr]:
    """``components``; with ``zeros=False`` the terms that are zero on every node by
    construction (no data, no latency bound, ...) are left out (``total_cost`` adds only
    the others: adding 0.0 changes no sum)."""
    cfg, wt = ix.cfg, ix.cfg.weights
    req = np.array([w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus],
                   dtype=np.float64)
    inv = _at(ix.inv_cap, sel)
    # dominant share column by column: cheaper than a (N, 3) temporary for every class
    cpu_share = np.minimum(req[0] * inv[:, 0], 1.0)
    share = cpu_share.copy()
    for r in (1, 2):
        if req[r]:
            np.maximum(share, np.minimum(req[r] * inv[:, r], 1.0), out=share)
    kw = power_kw(share, cpu_share, _at(ix.idle_w, sel), _at(ix.max_w, sel))
    out: dict[str, Arr] = {
        "price": wt.price * w.cost_weight * price_cost(share, _at(ix.price, sel)),
        "energy": wt.energy * w.cost_weight * energy_cost(kw, _at(ix.energy_price, sel)),
        "carbon": wt.carbon * w.cost_weight * carbon_cost(kw, _at(ix.carbon, sel),
                                                          cfg.carbon_price_per_g),
    }
    if w.data_gb > 0:
        _, zone, region = ix.locate(w.data_location)
        zid = ix.zones.get(zone, -1) if zone else -1
        rid = ix.regions.get(region, -1) if region else -1
        same_region = _at(ix.region_id, sel) == rid
        # data known only down to its region is local to every node of that region
        same_zone = _at(ix.zone_id, sel) == zid if zone else same_region
        out["data"] = wt.data * w.cost_weight * data_cost(w.data_gb, same_zone, same_region,
                                                          cfg)
    elif zeros:
        out["data"] = np.zeros_like(share)
    if w.max_latency_ms is not None and w.latency_to is not None:
        # the share of the SLA used (sla.judge): less margin costs more
        out["latency"] = wt.latency * judge(w.max_latency_ms,
                                            _at(ix.latency_to(w.latency_to), sel)).used
    elif zeros:
        out["latency"] = np.zeros_like(share)
    # the largest share after placing, column by column (no (N, 3) temporaries)
    alloc = _at(ix.alloc, sel)
    after = (alloc[:, 0] + req[0]) * inv[:, 0]
    for r in (1, 2):
        np.maximum(after, (alloc[:, r] + req[r]) * inv[:, r], out=after)
    out["balance"] = wt.balance * np.minimum(after, 1.0)
    if w.preferred_node_affinity:
        matched, total = preferred_weight(w, ix, sel)
        out["affinity"] = wt.affinity * affinity_cost(matched, total)
    elif zeros:
        out["affinity"] = np.zeros_like(share)
    if zeros or len(ix.soft_taints()[1]) > 1:
        out["taint"] = wt.taint * taint_counts(w, ix, sel)
    if pod_cost is not None:
        out["pod_affinity"] = wt.pod_affinity * _at(pod_cost, sel)
    elif zeros:
        out["pod_affinity"] = np.zeros_like(share)
    return out


def total_cost(w: Workload, ix: ClusterIndex, sel: Arr | slice = slice(None),
               pod_cost: Arr | None = None) -> Arr:
    """Sum of the weighted terms: the per-pod cost the solver minimises."""
    c = _terms(w, ix, sel, pod_cost, zeros=False)
    out = c["price"].copy()
    for t in TERMS[1:]:
        if t in c:
            out += c[t]
    return out


def total_costs(ws: list[Workload], ix: ClusterIndex, sels: list[Arr]) -> Arr:
    """``total_cost(ws[i], ix, sels[i])`` for every i, concatenated in that order (``sels``:
    index arrays; no InterPodAffinity term: callers keep those classes on ``total_cost``).

    The same elementwise operations in the same order as ``_terms`` + ``total_cost`` (a
    class's scalars repeated over its nodes; a term a class lacks added as 0.0, which
    changes no sum), so every value is bit for bit the one ``total_cost`` gives: it only
    trades one run of ~20 numpy calls per class for one run over the round's classes
    (1,762 classes of the 3,000-pod tight benchmark: 0.13 s CPU a batch per class)."""
    cfg, wt = ix.cfg, ix.cfg.weights
    sizes = np.array([s.size for s in sels], dtype=np.int64)
    sel = np.concatenate(sels) if sels else np.zeros(0, dtype=np.int64)

    def each(vals: Sequence[float], dtype: type = np.float64) -> Arr:
        return np.repeat(np.array(vals, dtype=dtype), sizes)  # a class's value on its nodes

    req = np.repeat(np.array([[w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus]
                              for w in ws], dtype=np.float64).reshape(-1, 3), sizes, axis=0)
    inv = ix.inv_cap.take(sel, axis=0)
    cpu_share = np.minimum(req[:, 0] * inv[:, 0], 1.0)
    share = cpu_share.copy()
    for r in (1, 2):  # _terms takes a resource only where the class requests it
        np.maximum(share, np.minimum(req[:, r] * inv[:, r], 1.0), out=share,
                   where=req[:, r] != 0)
    kw = power_kw(share, cpu_share, ix.idle_w.take(sel), ix.max_w.take(sel))
    out: Arr = each([wt.price * w.cost_weight for w in ws]) * price_cost(share, ix.price.take(sel))
    out += each([wt.energy * w.cost_weight for w in ws]) * energy_cost(
        kw, ix.energy_price.take(sel))
    out += each([wt.carbon * w.cost_weight for w in ws]) * carbon_cost(
        kw, ix.carbon.take(sel), cfg.carbon_price_per_g)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    if any(w.data_gb > 0 for w in ws):
        gb: list[float] = []
        zid: list[int] = []
        rid: list[int] = []
        has_zone: list[bool] = []
        f: list[float] = []
        for w in ws:
            _, zone, region = ix.locate(w.data_location) if w.data_gb > 0 else (None,) * 3
            gb.append(w.data_gb if w.data_gb > 0 else 0.0)
            zid.append(ix.zones.get(zone, -1) if zone else -1)
            rid.append(ix.regions.get(region, -1) if region else -1)
            has_zone.append(bool(zone))
            f.append(wt.data * w.cost_weight if w.data_gb > 0 else 0.0)
        same_region = ix.region_id.take(sel) == each(rid, np.int64)
        same_zone = np.where(each(has_zone, np.bool_), ix.zone_id.take(sel) == each(zid, np.int64),
                             same_region)
        data = each(f) * data_cost(each(gb), same_zone, same_region, cfg)
        out += np.where(each(f) != 0, data, 0.0)
    if any(w.max_latency_ms is not None and w.latency_to is not None for w in ws):
        p95 = np.zeros(sel.size, dtype=np.float64)
        bound = []  # per class: 0 without a bound (or a bound <= 0): judge's used is 0
        for i, w in enumerate(ws):
            on = w.max_latency_ms is not None and w.latency_to is not None and (
                w.max_latency_ms > 0)
            bound.append(float(w.max_latency_ms) if on and w.max_latency_ms else 0.0)
            if on and w.latency_to is not None:
                p95[starts[i]:ends[i]] = ix.latency_to(w.latency_to).take(sels[i])
        out += wt.latency * judge(each(bound), p95).used
    alloc = ix.alloc.take(sel, axis=0)
    after = (alloc[:, 0] + req[:, 0]) * inv[:, 0]
    for r in (1, 2):
        np.maximum(after, (alloc[:, r] + req[:, r]) * inv[:, r], out=after)
    out += wt.balance * np.minimum(after, 1.0)
    if any(w.preferred_node_affinity for w in ws):
        aff = np.zeros(sel.size, dtype=np.float64)
        for i, w in enumerate(ws):
            if w.preferred_node_affinity:
                matched, total = preferred_weight(w, ix, sels[i])
                aff[starts[i]:ends[i]] = wt.affinity * affinity_cost(matched, total)
        out += aff
    if len(ix.soft_taints()[1]) > 1:
        taint = np.zeros(sel.size, dtype=np.float64)
        for i, w in enumerate(ws):
            taint[starts[i]:ends[i]] = wt.taint * taint_counts(w, ix, sels[i])
        out += taint
    return out


# -- policies of the pod-by-pod path (sequential.py) ------------------------------------------
POLICIES = ("cost", "spread")


def spread_soft_cost(skews: list[tuple[Arr, int]], sel: Arr) -> Arr:
    """``ScheduleAnyway`` spread constraints: per constraint, the skew placing the pod would
    give, over the worst skew among the candidate nodes (0: the emptiest domain, 1: the
    fullest; a node without the topology key counts as the fullest), summed."""
    out = np.zeros(sel.size, dtype=np.float64)
    for skew, _max_skew in skews:
        s = skew[sel].astype(np.float64)
        finite = s < np.iinfo(np.int64).max // 8
        lo = s[finite].min() if finite.any() else 0.0
        hi = s[finite].max() if finite.any() else 0.0
        span = max(hi - lo, 1.0)
        out += np.where(finite, (s - lo) / span, 1.0)
    return out


def kube_default_cost(w: Workload, ix: ClusterIndex, sel: Arr,
                      pod_cost: Arr | None = None) -> Arr:
    """kube-scheduler's default scores as a cost in 0..~4 (lower is better), for the
    ``spread`` policy: NodeResourcesFit LeastAllocated (mean cpu/memory utilisation after
    placing) + NodeResourcesBalancedAllocation (cpu/memory imbalance after placing), each
    weight 1, NodeAffinity's preferred terms and InterPodAffinity (weight 2 each) -- kube's
    relative weights. Price,
    energy and carbon play no part: this policy spreads as kube-scheduler does."""
    req = np.array([w.requests.cpu_milli, w.requests.mem_bytes], dtype=np.float64)
    cap = ix.cap[sel][:, :2].astype(np.float64)
    after = ix.alloc[sel][:, :2] + req
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(cap > 0, np.minimum(after / np.maximum(cap, 1.0), 1.0), 1.0)
    least = frac.mean(axis=1)
    balanced = np.abs(frac[:, 0] - frac[:, 1]) / 2.0
    out = least + balanced
    if w.preferred_node_affinity:
        matched, total = preferred_weight(w, ix, sel)
        out = out + 2.0 * affinity_cost(matched, total)
    if pod_cost is not None:
        out = out + 2.0 * pod_cost[sel]
    return np.asarray(out + taint_counts(w, ix, sel))


def sequential_cost(w: Workload, ix: ClusterIndex, mask: Arr, default_policy: str,
                    soft_spread: list[tuple[Arr, int]], pod_cost: Arr | None = None) -> Arr:
    """Per-node cost for the pod-by-pod path (inf outside ``mask``), by the workload's
    policy (``w.policy``, else ``default_policy``):

    * ``cost``: ``total_cost`` (price, energy, carbon, ...; packs) plus ``ScheduleAnyway``
      spread at ``weights.spread`` $/hour for the fullest domain;
    * ``spread``: ``kube_default_cost`` plus ``ScheduleAnyway`` spread at kube's weight 2.
    """
    out = np.full(ix.n, np.inf)
    sel = np.flatnonzero(mask)
    if sel.size:
        out[sel] = policy_cost(w, ix, sel, default_policy, soft_spread, pod_cost)
    return out


def policy_cost(w: Workload, ix: ClusterIndex, sel: Arr, default_policy: str,
                soft_spread: list[tuple[Arr, int]], pod_cost: Arr | None = None) -> Arr:
    """``sequential_cost`` on the nodes ``sel`` (non-empty) only. Without soft spread every
    term is per node, so a node's cost does not depend on which others are in ``sel``."""
    policy = w.policy or default_policy
    if policy == "spread":
        c = kube_default_cost(w, ix, sel, pod_cost)
        if soft_spread:
            c = c + 2.0 * spread_soft_cost(soft_spread, sel)
    else:
        c = total_cost(w, ix, sel, pod_cost)
        if soft_spread:
            c = c + ix.cfg.weights.spread * spread_soft_cost(soft_spread, sel)
    return c
