"""A snapshot prepared for placement: indexes, every filter as arrays over the nodes, and
per-node costs (``ClusterView``); running pods indexed by label (``PodIndex``); and the
small helpers the batch engine (``engine.py``) and the pod-by-pod placement
(``sequential.py``) share. Pure: no I/O, no clock.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence
from dataclasses import fields
from itertools import compress

import numpy as np

from cloud_core.errors import PlacementError

from . import scores
from .config import EngineConfig
from .explain import FilterResult
from .filters import STATIC_FILTERS, StaticFilter, selector_matches, term_matches_pod
from .index import ClusterIndex
from .model import (
    COUNT_MAX,
    HOSTNAME,
    REGION,
    ZONE,
    ClusterSnapshot,
    PodAffinityTerm,
    RunningPod,
    Workload,
    node_label,
)
from .sla import NO_DATA, judge, over_bound

# priority decides nothing about where a pod goes: pods differing only in it share a class
_KEY_FIELDS = tuple(f.name for f in fields(Workload)
                    if f.name not in ("uid", "name", "priority"))
RESOURCE_NAMES = ("insufficient cpu", "insufficient memory", "insufficient GPU")
_KEY_GETTER = operator.attrgetter(*_KEY_FIELDS)
COST_RUN_CELLS = 1 << 20  # ClusterView.costs: ~100 MB of temporaries at the peak
# filter results a view takes from its base (ClusterView(base=)), at most: each is two arrays
# over the nodes (5,000 nodes: 45 kB), one per distinct workload spec and filter (23 MB)
STATIC_CARRIED = 512

def class_key(w: Workload) -> tuple[Hashable, ...]:
    """Workloads with equal keys are interchangeable for placement.

    Every field but uid and name is in the key -- soft ones too (``preferred_node_affinity``,
    tolerations of ``PreferNoSchedule``): two pods that differ only in what they prefer have
    different costs, so one class (one cost vector) would send both where the first prefers.
    Taking all fields by construction means a new field can't be forgotten here.
    """
    return _KEY_GETTER(w)



SymTerm = tuple[RunningPod, PodAffinityTerm, int, bool]


def _scores_others(p: RunningPod) -> bool:
    return bool(p.affinity or p.preferred_affinity or p.preferred_anti_affinity)


_SCORING = tuple(operator.attrgetter(a) for a in ("affinity", "preferred_affinity",
                                                  "preferred_anti_affinity"))
_SCORING_TERMS = operator.attrgetter("affinity", "preferred_affinity", "preferred_anti_affinity")
_ANTI = operator.attrgetter("anti_affinity")
_NAMESPACE = operator.attrgetter("namespace")


def as_running(w: Workload, node: str) -> RunningPod:
    """``w`` as a pod running on ``node`` (what later filters and scores see)."""
    return RunningPod.of(w, node)


class PodIndex:
    """Running pods indexed by (namespace, label) so selectors don't scan every pod."""

    def __init__(self, pods: Sequence[RunningPod] = ()) -> None:
        self.by_ns: dict[str, list[RunningPod]] = {}
        self.by_label: dict[tuple[str, str, str], list[RunningPod]] = {}
        # anti-affinity terms of running pods, by (namespace, first matchLabel) they select
        self.anti_by_label: dict[tuple[str, str, str], list[tuple[RunningPod,
                                                                  PodAffinityTerm]]] = {}
        self.anti_other: list[tuple[RunningPod, PodAffinityTerm]] = []
        # terms of running pods that score newcomers they select (InterPodAffinity's
        # symmetry): (pod, term, signed weight, required?), by (namespace, first matchLabel)
        self.sym_by_label: dict[tuple[str, str, str], list[SymTerm]] = {}
        self.sym_other: list[SymTerm] = []
        self._todo: list[RunningPod] = list(pods)
        # how many pods carry terms that score newcomers: while none does, symmetric() answers
        # without indexing anything (every cost asks it). Looked for in C first (every step
        # looks at every running pod, and most clusters have none)
        todo = self._todo
        self.n_sym = sum(map(any, map(_SCORING_TERMS, todo))) if any(
            any(map(get, todo)) for get in _SCORING) else 0
        # ... and how many carry anti-affinity: while none does, repelling() answers without
        # indexing anything (every workload's filters ask it)
        self.n_anti = sum(map(bool, map(_ANTI, todo))) if any(map(_ANTI, todo)) else 0

    def add(self, p: RunningPod) -> None:
        # indexed on first use: a batch adds thousands, most calls never look
        self._todo.append(p)
        if _scores_others(p):
            self.n_sym += 1
        if p.anti_affinity:
            self.n_anti += 1

    def _flush(self, spaces: Sequence[str] | None = None) -> None:
        """Index the pods not yet indexed; with ``spaces``, only those of these namespaces
        (a selector reads its own namespaces only: a lone pod's spread in a namespace of 400
        pods indexes those, not the 2,000 of the others)."""
        todo = self._todo
        if spaces is None:
            self._todo = []
            for p in todo:
                self._index(p)
            return
        want = set(spaces)
        flags = list(map(want.__contains__, map(_NAMESPACE, todo)))
        if not any(flags):
            return
        self._todo = list(compress(todo, map(operator.not_, flags)))
        for p in compress(todo, flags):
            self._index(p)

    def all(self) -> list[RunningPod]:
        """Every pod, indexed or still to be (the snapshot's and those a batch added); indexes
        nothing (most batches never look up a label)."""
        return [*(p for pods in self.by_ns.values() for p in pods), *self._todo]

    def indexed(self) -> list[RunningPod]:
        """Every pod, indexed now, namespace by namespace (the order the selectors see)."""
        if self._todo:
            self._flush()
        return [p for pods in self.by_ns.values() for p in pods]

    def _index(self, p: RunningPod) -> None:
        self.by_ns.setdefault(p.namespace, []).append(p)
        for k, v in p.labels.items():
            self.by_label.setdefault((p.namespace, k, v), []).append(p)
        for t in p.anti_affinity:
            if t.selector.match_labels:
                k, v = next(iter(t.selector.match_labels.items()))
                for ns in t.namespaces or (p.namespace,):
                    self.anti_by_label.setdefault((ns, k, v), []).append((p, t))
            else:
                self.anti_other.append((p, t))
        sym: list[SymTerm] = [(p, t, 0, True) for t in p.affinity]
        sym += [(p, t, wt, False) for wt, t in p.preferred_affinity]
        sym += [(p, t, -wt, False) for wt, t in p.preferred_anti_affinity]
        for e in sym:
            t = e[1]
            if t.selector.match_labels:
                k, v = next(iter(t.selector.match_labels.items()))
                for ns in t.namespaces or (p.namespace,):
                    self.sym_by_label.setdefault((ns, k, v), []).append(e)
            else:
                self.sym_other.append(e)

    def symmetric(self, w: Workload, hard_weight: int
                  ) -> list[tuple[RunningPod, PodAffinityTerm, int]]:
        """Running pods' terms that select ``w``, with the weight each adds to its domain's
        InterPodAffinity score (required affinity: ``hard_weight``; 0 leaves them out)."""
        if not self.n_sym:
            return []
        if self._todo:
            self._flush()
        cands = list(self.sym_other)
        for k, v in w.labels.items():
            cands.extend(self.sym_by_label.get((w.namespace, k, v), []))
        return [(p, t, hard_weight if hard else wt) for p, t, wt, hard in cands
                if (not hard or hard_weight > 0) and scores.matches_newcomer(p, t, w)]

    def matching(self, term: PodAffinityTerm, owner_ns: str) -> list[RunningPod]:
        spaces = term.namespaces or (owner_ns,)
        if self._todo:
            self._flush(spaces)
        out: list[RunningPod] = []
        for ns in spaces:
            if term.selector.match_labels:
                k, v = next(iter(term.selector.match_labels.items()))
                cands = self.by_label.get((ns, k, v), [])
            else:
                cands = self.by_ns.get(ns, [])
            out.extend(p for p in cands if selector_matches(term.selector, p.labels))
        return out

    def repelling(self, w: Workload) -> list[tuple[RunningPod, PodAffinityTerm]]:
        """Running pods whose anti-affinity terms select ``w``."""
        if not self.n_anti:
            return []
        if self._todo:
            self._flush()
        cands = list(self.anti_other)
        for k, v in w.labels.items():
            cands.extend(self.anti_by_label.get((w.namespace, k, v), []))
        return [(p, t) for p, t in cands
                if term_matches_pod(t, p.namespace, w.namespace, w.labels)]


class ClusterView:
    """A snapshot with its indexes built: every filter and the cost of a workload over all
    nodes, and the free resources, kept up to date as pods are placed.

    ``bind`` accounts a binding so that one-pod-at-a-time callers keep an exact view without
    rebuilding the indexes (the state lives in this object, never in the module).
    ``engine.PreparedCluster`` adds batch placement and explanations on top.
    """

    def __init__(self, snapshot: ClusterSnapshot, config: EngineConfig | None = None, *,
                 eager: bool = True, base: ClusterView | None = None) -> None:
        self.cfg = config or EngineConfig()
        self.snapshot = snapshot
        # ``base``: a view of an earlier snapshot with the same nodes and facts (the
        # allocation, the pods and the links may differ: carry.Carry): its indexes of the node
        # facts and its filter results are taken, not built again (they read no allocation,
        # no pod, no link)
        self.ix: ClusterIndex = ClusterIndex(snapshot, self.cfg,
                                             base.ix if base is not None else None)
        # an over-committed node has no room (0), not "less than none": a pod requesting
        # none of a resource still fits there (NodeResourcesFit checks only requests > 0)
        self.free = np.maximum(self.ix.cap - self.ix.alloc, 0)
        self.pods = PodIndex(snapshot.pods)
        self._node_keys: dict[tuple[str, Hashable], tuple[np.ndarray, list[Hashable]]] = {}
        self._static: dict[tuple[str, Hashable, Hashable], FilterResult] = {}
        self._cost: dict[tuple[Hashable, ...], np.ndarray] = {}
        self._labels: dict[str, tuple[np.ndarray, list[str | None]]] = {}
        if base is not None and base.ix.pos is self.ix.pos:  # taken: the facts are base's
            self._node_keys, self._labels = base._node_keys, base._labels
            if len(base._static) < STATIC_CARRIED:
                self._static = base._static
            return
        # Indexes that don't depend on the workload are built here, once, so that a
        # one-pod-at-a-time caller doesn't pay for them on its first decisions. A caller
        # that places one batch and drops the object (``place``) builds only what the batch
        # asks for (``eager=False``): at 5,000 nodes, most of these are never looked at
        # (a label projection per label key, the hostname domains) and cost 20-40 ms a batch.
        if not eager:
            return
        probe = Workload("", "")
        for f in STATIC_FILTERS:
            if node_spec(f, probe) is None:
                self._static_result(f, probe)
        for key in sorted({k for nd in self.ix.nodes for k in nd.labels}):
            self._label_ids(key)
        for key in (HOSTNAME, ZONE, REGION):
            self.ix.domain_ids(key)
        self.ix.soft_taints()
        self.ix.latency_to(self.ix.nodes[0].name if self.ix.nodes else "")

    # -- filters -------------------------------------------------------------------------
    def _static_result(self, f: StaticFilter, w: Workload) -> FilterResult:
        nk = f.node_key(w)
        spec = node_spec(f, w)
        pk = f.pod_key(w)
        key = (f.name, spec, pk)
        got = self._static.get(key)
        if got is not None:
            return got
        ids_distinct = self._node_keys.get((f.name, spec))
        if ids_distinct is None:
            if isinstance(spec, tuple):
                ids_distinct = self._label_projection(spec)
            else:
                seen: dict[Hashable, int] = {}
                ids = np.fromiter((seen.setdefault(nk(nd), len(seen))
                                   for nd in self.ix.nodes), dtype=np.int64, count=self.ix.n)
                ids_distinct = (ids, list(seen))
            self._node_keys[f.name, spec] = ids_distinct
        ids, distinct = ids_distinct
        reasons = [f.check(pk, d) for d in distinct]
        names = tuple(sorted({r for r in reasons if r is not None})) or ("",)
        lab = np.array([names.index(r) if r is not None else 0 for r in reasons],
                       dtype=np.int64)
        okt = np.array([r is None for r in reasons], dtype=bool)
        got = FilterResult(f.name, okt[ids], lab[ids], names)
        self._static[key] = got
        return got

    def _label_ids(self, key: str) -> tuple[np.ndarray, list[str | None]]:
        got = self._labels.get(key)
        if got is None:
            seen: dict[str | None, int] = {}
            ids = np.fromiter((seen.setdefault(node_label(nd, key), len(seen))
                               for nd in self.ix.nodes), dtype=np.int64, count=self.ix.n)
            got = (ids, list(seen))
            self._labels[key] = got
        return got

    def _label_projection(self, keys: tuple[str, ...]) -> tuple[np.ndarray, list[Hashable]]:
        """Node ids by their values of ``keys``, combined from per-key ids (numpy, no loop
        over nodes once each key has been seen)."""
        if not keys:
            return np.zeros(self.ix.n, dtype=np.int64), [()]
        cols = [self._label_ids(k) for k in keys]
        stacked = np.stack([c[0] for c in cols], axis=1)
        uniq, inv = np.unique(stacked, axis=0, return_inverse=True)
        distinct: list[Hashable] = [tuple(cols[j][1][int(v)] for j, v in enumerate(row))
                                    for row in uniq]
        return inv.reshape(-1).astype(np.int64), distinct

    def _latency_result(self, w: Workload) -> FilterResult:
        n = self.ix.n
        if w.max_latency_ms is None:
            return FilterResult("latency", np.ones(n, bool), np.zeros(n, np.int64), ("",))
        lat = (self.ix.latency_to(w.latency_to) if w.latency_to is not None
               else np.full(n, np.inf))
        # where refused: label 0 without a usable measurement, 1 measured above the bound
        labels = np.where(np.isfinite(lat), 1, 0)
        return FilterResult("latency", judge(w.max_latency_ms, lat).met, labels,
                            (NO_DATA, over_bound(w.max_latency_ms)))

    def _domains_with(self, term: PodAffinityTerm, owner_ns: str) -> tuple[np.ndarray, bool]:
        """Mask of nodes sharing a ``term.topology_key`` domain with a matching pod."""
        dom, names = self.ix.domain_ids(term.topology_key)
        hit = np.zeros(len(names) + 1, dtype=bool)
        found = False
        for p in self.pods.matching(term, owner_ns):
            i = self.ix.pos.get(p.node)
            if i is not None and dom[i] >= 0:
                hit[dom[i]] = True
                found = True
        return hit[dom] & (dom >= 0), found

    def _affinity_results(self, w: Workload) -> list[FilterResult]:
        n = self.ix.n
        ok_aff = np.ones(n, dtype=bool)
        if w.pod_affinity:
            # InterPodAffinity: the pods that count are those matching EVERY term; with none
            # anywhere, a pod matching all its own terms is the first of its group and may go
            # to any node carrying every term's topology key (validate.py: the same rule)
            terms = w.pod_affinity
            both = [p for p in self.pods.matching(terms[0], w.namespace)
                    if all(term_matches_pod(t, w.namespace, p.namespace, p.labels)
                           for t in terms[1:])]
            first = not both and all(term_matches_pod(t, w.namespace, w.namespace, w.labels)
                                     for t in terms)
            for t in terms:
                dom, names = self.ix.domain_ids(t.topology_key)
                if first:
                    ok_aff &= dom >= 0
                    continue
                hit = np.zeros(len(names) + 1, dtype=bool)
                for p in both:
                    i = self.ix.pos.get(p.node)
                    if i is not None and dom[i] >= 0:
                        hit[dom[i]] = True
                ok_aff &= hit[dom] & (dom >= 0)
        ok_anti = np.ones(n, dtype=bool)
        for t in w.pod_anti_affinity:
            m, _ = self._domains_with(t, w.namespace)
            ok_anti &= ~m
        for p, t in self.pods.repelling(w):  # symmetry: their anti-affinity repels us too
            dom, _ = self.ix.domain_ids(t.topology_key)
            i = self.ix.pos.get(p.node)
            if i is not None and dom[i] >= 0:
                ok_anti &= dom != dom[i]
        z = np.zeros(n, dtype=np.int64)
        return [FilterResult("pod_affinity", ok_aff, z, ("pod affinity",)),
                FilterResult("pod_anti_affinity", ok_anti, z, ("pod anti-affinity",))]

    def resources_result(self, w: Workload, free: np.ndarray | None = None) -> FilterResult:
        free = self.free if free is None else free
        req = request_vector(w)
        short = (free < req) & (req > 0)
        # GPU first: the scarcest resource is the most useful reason
        labels = np.where(short[:, 2], 2, np.where(short[:, 0], 0, 1))
        return FilterResult("resources", np.asarray(~short.any(axis=1)), labels,
                            RESOURCE_NAMES)

    def filter_results(self, w: Workload, free: np.ndarray | None = None,
                       resources: bool = True) -> list[FilterResult]:
        """Every filter for ``w`` over all nodes, in the order of ``FILTER_ORDER``
        (``resources=False`` leaves out the last one, which the solver does itself)."""
        res = [self._static_result(f, w) for f in STATIC_FILTERS]
        res.append(self._latency_result(w))
        res.extend(self._affinity_results(w))
        if resources:
            res.append(self.resources_result(w, free))
        return res

    def interpod_raw(self, w: Workload) -> np.ndarray | None:
        """InterPodAffinity's raw score of ``w`` per node on the current pods (None: no term
        of ``w`` or of a running pod is involved, the score is the same everywhere)."""
        own = bool(w.preferred_pod_affinity or w.preferred_pod_anti_affinity)
        sym = self.pods.symmetric(w, self.cfg.hard_pod_affinity_weight)
        if not own and not sym:
            return None
        return scores.interpod_raw(w, self.ix, self.pods.matching, sym)

    def pod_cost(self, w: Workload, mask: np.ndarray | None = None) -> np.ndarray | None:
        """``scores.interpod_cost`` of ``w``, normalised over ``mask`` (kube: the nodes that
        passed the filters; None: all nodes)."""
        sel = slice(None) if mask is None else np.flatnonzero(mask)
        return scores.interpod_cost(self.interpod_raw(w), self.ix.n, sel)

    def cost(self, w: Workload, mask: np.ndarray | None = None) -> np.ndarray:
        """Per-node cost of ``w``; with ``mask``, only there (inf elsewhere, not cached)."""
        if mask is not None:
            return self._masked_cost(w, mask, self.interpod_raw(w))
        key = class_key(w)
        c = self._cost.get(key)
        if c is None:
            c = scores.total_cost(w, self.ix, slice(None), self.pod_cost(w))
            self._cost[key] = c
        return c

    def _masked_cost(self, w: Workload, mask: np.ndarray, raw: np.ndarray | None
                     ) -> np.ndarray:
        """``cost(w, mask)`` given ``interpod_raw(w)`` (``raw``), normalised over ``mask``
        as ``pod_cost`` does."""
        out = np.full(self.ix.n, np.inf)
        sel = np.flatnonzero(mask)
        if sel.size:
            out[sel] = scores.total_cost(w, self.ix, sel,
                                         scores.interpod_cost(raw, self.ix.n, sel))
        return out

    def costs(self, ws: Sequence[Workload], masks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``[self.cost(w, mask) for w, mask in zip(ws, masks)]``, the same values: classes
        without an InterPodAffinity score are priced together (``scores.total_costs``)."""
        out: list[np.ndarray | None] = [None] * len(ws)
        batch: list[int] = []
        for i, w in enumerate(ws):
            raw = self.interpod_raw(w)  # once: it walks the running pods' terms
            if raw is None:
                batch.append(i)
            else:
                out[i] = self._masked_cost(w, masks[i], raw)
        # in runs of at most COST_RUN_CELLS (class, node) pairs (a class with more alone):
        # a dozen float64 temporaries each, bounded whatever the numbers of classes and nodes
        every = [np.flatnonzero(masks[i]) for i in batch]
        lo = 0
        while lo < len(batch):
            hi, cells = lo + 1, every[lo].size
            while hi < len(batch) and cells + every[hi].size <= COST_RUN_CELLS:
                cells += every[hi].size
                hi += 1
            run, sels = batch[lo:hi], every[lo:hi]
            lo = hi
            flat = scores.total_costs([ws[i] for i in run], self.ix, sels)
            at = 0
            for i, sel in zip(run, sels, strict=True):
                c = out[i] = np.full(self.ix.n, np.inf)
                c[sel] = flat[at:at + sel.size]
                at += sel.size
        return [c for c in out if c is not None]

    def forget_costs(self) -> None:
        """Drop the cached per-class costs (they read the allocation, which moved)."""
        self._cost.clear()

    def bind(self, w: Workload, node: str) -> None:
        """Account a binding made outside ``place`` (or confirm one): resources and pod."""
        i = self.ix.pos.get(node)
        if i is None:
            raise PlacementError(f"bind: unknown node {node!r}")
        self.free[i] -= request_vector(w)
        self.ix.alloc[i] += request_vector(w)
        self.pods.add(as_running(w, node))
        self._cost.clear()

def node_spec(f: StaticFilter, w: Workload) -> Hashable:
    """What the node projection of ``f`` depends on (label filters: the keys they read)."""
    if f.name == "node_selector":
        return tuple(sorted(w.node_selector))
    if f.name == "node_affinity":
        return tuple(sorted({r.key for t in w.node_affinity for r in t.match_expressions}))
    return None


def all_ok(frs: Sequence[FilterResult]) -> np.ndarray:
    """The nodes every filter of ``frs`` passes."""
    out = frs[0].ok.copy()
    for fr in frs[1:]:
        out &= fr.ok
    return out


def request_vector(w: Workload) -> np.ndarray:
    """``w``'s requests as (cpu_milli, mem_bytes, gpus), int64."""
    # clamped one past what a node can have (model.COUNT_MAX): a request that cannot be
    # counted fits nowhere, and is never an OverflowError
    return np.array([min(max(v, 0), COUNT_MAX + 1) for v in (
        w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus)], dtype=np.int64)


