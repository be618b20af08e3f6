"""The engine: groups workloads into classes, vectorises filters and scores, calls the solver,
and turns its answer into explained decisions. Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from cloud_core.errors import PlacementError

from . import scores
from .config import EngineConfig
from .explain import (
    Explanation,
    FilterResult,
    first_failure_counts,
    first_failure_examples,
    pod_by_pod_results,
    summary,
)
from .filters import (
    STATIC_FILTERS,
    StaticFilter,
    check_latency,
    selector_matches,
    term_matches_pod,
)
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
from .sequential import NodeUsage, needs_sequential, place_classes
from .solver import ClassSpec, solve

_KEY_FIELDS = tuple(f.name for f in fields(Workload) if f.name not in ("uid", "name"))
RESOURCE_NAMES = ("insufficient cpu", "insufficient memory", "insufficient GPU")


_KEY_GETTER = operator.attrgetter(*_KEY_FIELDS)


COST_RUN_CELLS = 1 << 20  # PreparedCluster.costs: ~100 MB of temporaries at the peak


def class_key(w: Workload) -> tuple[Hashable, ...]:
    """Workloads with equal keys are interchangeable for placement.

    Every field but uid and name is in the key -- soft ones too (``preferred_node_affinity``,
    tolerations of ``PreferNoSchedule``): two pods that differ only in what they prefer have
    different costs, so one class (one cost vector) would send both where the first prefers.
    Taking all fields by construction means a new field can't be forgotten here.
    """
    return _KEY_GETTER(w)


@dataclass(frozen=True, slots=True)
class Decision:
    """Where one workload goes (``node`` None: not now), the runner-up and why."""

    workload_uid: str
    node: str | None
    runner_up: str | None
    reasons: tuple[str, ...]
    summary: str
    cost: float | None


@dataclass(frozen=True, slots=True)
class PlacementResult:
    """Decisions in input order, the uid -> node map, total $/hour of the placed workloads."""

    decisions: tuple[Decision, ...]
    assignments: Mapping[str, str]
    total_cost: float
    solver: str
    stats: Mapping[str, float] = field(default_factory=dict)

    def decision(self, uid: str) -> Decision:
        for d in self.decisions:
            if d.workload_uid == uid:
                return d
        raise KeyError(uid)

    @property
    def unplaced(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.node is None)


SymTerm = tuple[RunningPod, PodAffinityTerm, int, bool]


def _scores_others(p: RunningPod) -> bool:
    return bool(p.affinity or p.preferred_affinity or p.preferred_anti_affinity)


def _as_running(w: Workload, node: str) -> RunningPod:
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
        # without indexing anything (every cost asks it)
        self.n_sym = sum(1 for p in self._todo if _scores_others(p))

    def add(self, p: RunningPod) -> None:
        # indexed on first use: a batch adds thousands, most calls never look
        self._todo.append(p)
        if _scores_others(p):
            self.n_sym += 1

    def _flush(self) -> None:
        todo, self._todo = self._todo, []
        for p in todo:
            self._index(p)

    def all(self) -> list[RunningPod]:
        """Every pod, indexed or still to be (the snapshot's and those a batch added); indexes
        nothing (most batches never look up a label)."""
        return [*(p for pods in self.by_ns.values() for p in pods), *self._todo]

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
        if self._todo:
            self._flush()
        out: list[RunningPod] = []
        for ns in term.namespaces or (owner_ns,):
            if term.selector.match_labels:
                k, v = next(iter(term.selector.match_labels.items()))
                cands = self.by_label.get((ns, k, v), [])
            else:
                cands = self.by_ns.get(ns, [])
            out.extend(p for p in cands if selector_matches(term.selector, p.labels))
        return out

    def repelling(self, w: Workload) -> list[tuple[RunningPod, PodAffinityTerm]]:
        """Running pods whose anti-affinity terms select ``w``."""
        if self._todo:
            self._flush()
        cands = list(self.anti_other)
        for k, v in w.labels.items():
            cands.extend(self.anti_by_label.get((w.namespace, k, v), []))
        return [(p, t) for p, t in cands
                if term_matches_pod(t, p.namespace, w.namespace, w.labels)]


class PreparedCluster:
    """A snapshot with its indexes built, reusable for many ``place`` calls.

    ``bind`` accounts a binding so that one-pod-at-a-time callers keep an exact view without
    rebuilding the indexes (the state lives in this object, never in the module).
    """

    def __init__(self, snapshot: ClusterSnapshot, config: EngineConfig | None = None, *,
                 eager: bool = True) -> None:
        self.cfg = config or EngineConfig()
        self.snapshot = snapshot
        self.ix = ClusterIndex(snapshot, self.cfg)
        # an over-committed node has no room (0), not "less than none": a pod requesting
        # none of a resource still fits there (NodeResourcesFit checks only requests > 0)
        self.free = np.maximum(self.ix.cap - self.ix.alloc, 0)
        self.pods = PodIndex(snapshot.pods)
        self._node_keys: dict[tuple[str, Hashable], tuple[np.ndarray, list[Hashable]]] = {}
        self._static: dict[tuple[str, Hashable, Hashable], FilterResult] = {}
        self._cost: dict[tuple[Hashable, ...], np.ndarray] = {}
        self._labels: dict[str, tuple[np.ndarray, list[str | None]]] = {}
        # Indexes that don't depend on the workload are built here, once, so that a
        # one-pod-at-a-time caller doesn't pay for them on its first decisions. A caller
        # that places one batch and drops the object (``place``) builds only what the batch
        # asks for (``eager=False``): at 5,000 nodes, most of these are never looked at
        # (a label projection per label key, the hostname domains) and cost 20-40 ms a batch.
        if not eager:
            return
        probe = Workload("", "")
        for f in STATIC_FILTERS:
            if _node_spec(f, probe) is None:
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
        spec = _node_spec(f, w)
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
        ok = lat <= w.max_latency_ms
        labels = np.where(np.isfinite(lat), 1, 0)
        names = (check_latency(w.max_latency_ms, np.inf) or "",
                 check_latency(w.max_latency_ms, w.max_latency_ms + 1.0) or "")
        return FilterResult("latency", ok, labels, names)

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
        req = _req(w)
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

    # -- placement -----------------------------------------------------------------------
    def place(self, workloads: Sequence[Workload]) -> PlacementResult:
        """Place a batch together; every workload gets a node or the reason it has none."""
        seen: set[str] = set()
        groups: dict[tuple[Hashable, ...], list[Workload]] = {}
        for w in workloads:
            if w.uid in seen:
                raise PlacementError(f"duplicate workload uid {w.uid!r} in one batch")
            seen.add(w.uid)
            groups.setdefault(class_key(w), []).append(w)
        reps = [g[0] for g in groups.values()]
        members = list(groups.values())
        nclass = len(reps)
        deps = _affinity_deps(reps)
        placed_nodes: list[list[int]] = [[] for _ in reps]
        # spread, host ports, extended resources, the spread policy: pod by pod, after
        seq = {ci for ci in range(nclass) if needs_sequential(reps[ci], self.cfg.policy)}
        pending = set(range(nclass)) - seq
        rounds = 0
        method: list[str] = []
        stats: dict[str, float] = {}
        deferred_reason: dict[int, str] = {}
        base_mask: dict[int, np.ndarray] = {}
        batch_cost: dict[int, np.ndarray] = {}
        free0 = self.free.copy()
        def run_round(order: list[int], first_only: set[int]) -> int:
            specs: list[ClassSpec] = []
            masks = [_all_ok(self.filter_results(reps[ci], resources=False)) for ci in order]
            # costs only where the class may go: most classes are confined to a few
            # regions, so this skips most of the arithmetic; the round's new ones at once
            todo = [j for j, ci in enumerate(order) if ci not in batch_cost
                    or not np.isfinite(batch_cost[ci][masks[j]]).all()]
            for j, c in zip(todo, self.costs([reps[order[j]] for j in todo],
                                             [masks[j] for j in todo]), strict=True):
                batch_cost[order[j]] = c
            for ci, mask in zip(order, masks, strict=True):
                w = reps[ci]
                base_mask.setdefault(ci, mask)
                cost = batch_cost[ci]
                count = len(members[ci]) - len(placed_nodes[ci])
                specs.append(ClassSpec(count=1 if ci in first_only else count, req=_req(w),
                                       mask=mask, cost=cost, gang=w.gang))
            _set_conflicts([reps[ci] for ci in order], specs)
            domains = {k: self.ix.domain_ids(k)[0] for s in specs for k in s.conflicts}
            out = solve(specs, self.free, domains, self.cfg)
            method.append(out.method)
            for k, v in out.stats.items():
                stats[k] = stats.get(k, 0.0) + v
            placed = 0
            for j, ci in enumerate(order):
                for n in out.nodes[j]:
                    w = members[ci][len(placed_nodes[ci])]
                    placed_nodes[ci].append(n)
                    self.free[n] -= specs[j].req
                    self.pods.add(_as_running(w, self.ix.nodes[n].name))
                    placed += 1
                if ci not in first_only or not out.nodes[j]:
                    pending.discard(ci)
            return placed

        while pending:
            ready, first_pod_only = _ready(reps, pending, deps, self.pods)
            if not ready:
                for ci in pending:
                    deferred_reason[ci] = (
                        f"gang {reps[ci].gang}: its members wait on pod affinity, which is "
                        "placed in rounds and cannot be all-or-nothing"
                        if reps[ci].gang is not None
                        else "pod affinity: no matching pod can be placed")
                break
            rounds += 1
            run_round(sorted(ready), first_pod_only)
        # Pods placed in later rounds may open domains for the pod affinity of classes
        # placed earlier: give their leftovers another go until nothing changes.
        for _ in range(3):
            again = [ci for ci in range(nclass) if deps.get(ci) and reps[ci].gang is None
                     and ci not in deferred_reason and ci not in seq
                     and len(placed_nodes[ci]) < len(members[ci])]
            if not again:
                break
            rounds += 1
            if run_round(again, set()) == 0:
                break
        place_classes(self, reps, members, seq, placed_nodes, base_mask, batch_cost,
                      deferred_reason)
        stats["rounds"] = float(rounds)
        stats["classes"] = float(nclass)
        result = self._decide(reps, members, placed_nodes, base_mask, batch_cost, free0,
                              deferred_reason, workloads)
        # the prepared view keeps the batch's placements accounted (like bind())
        self._cost.clear()
        self.ix.alloc = self.ix.cap - self.free
        return PlacementResult(result[0], result[1], result[2],
                               "+".join(dict.fromkeys(method)) or "none", stats)

    def _decide(self, reps: list[Workload], members: list[list[Workload]],
                placed_nodes: list[list[int]], base: dict[int, np.ndarray],
                costs: dict[int, np.ndarray], free0: np.ndarray, deferred: dict[int, str],
                workloads: Sequence[Workload]
                ) -> tuple[tuple[Decision, ...], dict[str, str], float]:
        names = [nd.name for nd in self.ix.nodes]
        total = self.ix.n
        usage: list[NodeUsage] = []  # the state after the batch, counted once if needed

        def usage_of() -> NodeUsage:
            if not usage:
                usage.append(NodeUsage(self, self.pods.all()))
            return usage[0]

        by_uid: dict[str, Decision] = {}
        assignments: dict[str, str] = {}
        total_cost = 0.0
        # what fitted before the batch, and the two cheapest nodes there (the runner-up
        # comes from them), for the classes the rounds priced: in blocks of classes
        fits = _runners_up([ci for ci in range(len(reps)) if ci in costs and ci in base],
                           [_req(w) for w in reps], base, costs, free0)
        for ci, w in enumerate(reps):
            if ci in fits:
                fit0, top = fits[ci]
                cost = costs[ci]
            else:
                cost = costs[ci] if ci in costs else self.cost(w)
                static_ok = base[ci] if ci in base else _all_ok(self.filter_results(w, free0))
                req = _req(w)
                for r in range(3):
                    if req[r]:
                        static_ok = static_ok & (free0[:, r] >= req[r])
                fit0 = int(static_ok.sum())
                cand = np.where(static_ok, cost, np.inf)
                two = np.argpartition(cand, 1)[:2] if cand.size > 2 else np.arange(cand.size)
                top = [int(i) for i in sorted(two.tolist(), key=lambda i: cand[i])
                       if np.isfinite(cand[i])]
            nodes = placed_nodes[ci]
            unplaced: Decision | None = None
            for j, m in enumerate(members[ci]):
                if j < len(nodes):
                    n = nodes[j]
                    c = float(cost[n])
                    total_cost += c
                    ru = next((t for t in top if t != n), None)
                    if ru is None:
                        why = "no other node fits"
                    elif cost[ru] < c:
                        why = (f"runner-up {names[ru]} is cheaper ({cost[ru]:.5f} $/h) but was "
                               "taken by the batch")
                    else:
                        why = f"runner-up {names[ru]} costs +{cost[ru] - c:.5f} $/h"
                    assignments[m.uid] = names[n]
                    by_uid[m.uid] = Decision(
                        m.uid, names[n], names[ru] if ru is not None else None, (why,),
                        f"placed on {names[n]} ({c:.5f} $/h); {fit0}/{total} nodes fit", c)
                else:
                    if unplaced is None:  # identical for every member of the class
                        unplaced = self._unplaced(m, ci, deferred, top, names, usage_of)
                    by_uid[m.uid] = dataclasses.replace(unplaced, workload_uid=m.uid)
        decisions = tuple(by_uid[w.uid] for w in workloads)
        return decisions, assignments, total_cost

    def _unplaced(self, w: Workload, ci: int, deferred: dict[int, str],
                  top: list[int], names: list[str],
                  usage_of: Callable[[], NodeUsage]) -> Decision:
        # reasons are counted against the state after the batch: what is left now, the
        # constraints checked pod by pod included, each node under its first refusal, as
        # kube-scheduler's "0/5 nodes are available: 3 Insufficient cpu, 2 node(s) didn't
        # have free ports" (the same tally as explain())
        frs = self.filter_results(w)
        fit, counts = first_failure_counts(frs, self.ix.n)
        if fit:  # else every node is refused already: the pod-by-pod checks change nothing
            frs = [*frs, *pod_by_pod_results(self, w, usage_of)]
            fit, counts = first_failure_counts(frs, self.ix.n)
        reasons: list[str] = []
        if ci in deferred:
            reasons.append(deferred[ci])
        if w.gang is not None and fit > 0:
            reasons.append(f"gang {w.gang}: not every member fits at once")
        if not reasons:
            reasons.append("no node satisfies every constraint" if not top
                           else "capacity taken by other workloads of the batch")
        ru = names[top[0]] if top else None
        text = summary(fit, self.ix.n, counts)
        if ci in deferred and fit:  # the nodes fit one by one; the rule that stopped it
            text += f"; {deferred[ci]}"
        return Decision(w.uid, None, ru, tuple(reasons), text, None)

    def bind(self, w: Workload, node: str) -> None:
        """Account a binding made outside ``place`` (or confirm one): resources and pod."""
        i = self.ix.pos.get(node)
        if i is None:
            raise PlacementError(f"bind: unknown node {node!r}")
        self.free[i] -= _req(w)
        self.ix.alloc[i] += _req(w)
        self.pods.add(_as_running(w, node))
        self._cost.clear()

    def explain(self, w: Workload, node: str | None = None, top: int = 3) -> Explanation:
        # the pod-by-pod constraints too: "fits" is never said of a node the validator rejects
        frs = [*self.filter_results(w), *pod_by_pod_results(self, w)]
        fit, counts = first_failure_counts(frs, self.ix.n)
        cost = self.cost(w)
        ok = _all_ok(frs)
        cand = np.where(ok, cost, np.inf)
        best = tuple((self.ix.nodes[int(i)].name, float(cand[i]))
                     for i in np.argsort(cand)[:top] if np.isfinite(cand[i]))
        node_reasons: tuple[str, ...] = ()
        breakdown: dict[str, float] = {}
        if node is not None:
            i = self.ix.pos.get(node)
            if i is None:
                raise PlacementError(f"explain: unknown node {node!r}")
            node_reasons = tuple(r for fr in frs if (r := fr.reason(i)) is not None)
            breakdown = self._terms(w, i)
        # Runner-up: the cheapest fitting node that is not the one chosen (or,
        # with none chosen, not the cheapest), with its cost terms to compare.
        first = node if node is not None else (best[0][0] if best else None)
        runner_up = next((self.ix.nodes[int(i)].name for i in np.argsort(cand)[:top + 1]
                          if np.isfinite(cand[i]) and self.ix.nodes[int(i)].name != first), None)
        runner_terms = self._terms(w, self.ix.pos[runner_up]) if runner_up is not None else {}
        examples = first_failure_examples(frs, self.ix.n, [nd.name for nd in self.ix.nodes]) \
            if fit < self.ix.n else ()
        return Explanation(w.uid, self.ix.n, fit, dict(counts), summary(fit, self.ix.n, counts),
                           node, node_reasons, breakdown, best, runner_up, runner_terms,
                           examples)

    def _terms(self, w: Workload, i: int) -> dict[str, float]:
        comp = scores.components(w, self.ix, np.array([i]), self.pod_cost(w))
        return {k: float(v[0]) for k, v in comp.items()}


def _node_spec(f: StaticFilter, w: Workload) -> Hashable:
    """What the node projection of ``f`` depends on (label filters: the keys they read)."""
    if f.name == "node_selector":
        return tuple(sorted(w.node_selector))
    if f.name == "node_affinity":
        return tuple(sorted({r.key for t in w.node_affinity for r in t.match_expressions}))
    return None


def _runners_up(cis: list[int], reqs: list[np.ndarray], base: Mapping[int, np.ndarray],
                costs: Mapping[int, np.ndarray], free0: np.ndarray
                ) -> dict[int, tuple[int, list[int]]]:
    """Per class ``ci`` of ``cis``: how many nodes fit it before the batch (``base[ci]``
    and room in ``free0``) and its two cheapest of them by ``costs[ci]``, the cheaper
    first -- the same as ``_decide``'s per-class arithmetic (the same row partition and
    sort), over blocks of classes at once (1,762 classes of the 3,000-pod tight benchmark:
    ~8 numpy calls each)."""
    out: dict[int, tuple[int, list[int]]] = {}
    n = free0.shape[0]
    if n <= 2:
        return out  # the per-class path: no partition there
    block = max(1, (1 << 20) // n)
    for lo in range(0, len(cis), block):
        part = cis[lo:lo + block]
        ok = np.stack([base[ci] for ci in part])
        req = np.stack([reqs[ci] for ci in part])
        for r in range(3):
            ok &= (free0[None, :, r] >= req[:, r, None]) | (req[:, r, None] == 0)
        fit0 = ok.sum(axis=1).tolist()
        cand = np.where(ok, np.stack([costs[ci] for ci in part]), np.inf)
        two = np.argpartition(cand, 1, axis=1)[:, :2]
        vals = np.take_along_axis(cand, two, axis=1)
        for j, ci in enumerate(part):
            t, v = two[j].tolist(), vals[j].tolist()
            order = sorted(range(2), key=lambda i: v[i])
            out[ci] = (fit0[j], [t[i] for i in order if math.isfinite(v[i])])
    return out


def _all_ok(frs: Sequence[FilterResult]) -> np.ndarray:
    out = frs[0].ok.copy()
    for fr in frs[1:]:
        out &= fr.ok
    return out


def _req(w: Workload) -> np.ndarray:
    # clamped one past what a node can have (model.COUNT_MAX): a request that cannot be
    # counted fits nowhere, and is never an OverflowError
    return np.array([min(max(v, 0), COUNT_MAX + 1) for v in (
        w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus)], dtype=np.int64)


def _set_conflicts(reps: list[Workload], specs: list[ClassSpec]) -> None:
    """Anti-affinity between classes of one round, symmetric, per topology key."""
    by_label: dict[tuple[str, str, str], list[int]] = {}
    for b, wb in enumerate(reps):
        for k, v in wb.labels.items():
            by_label.setdefault((wb.namespace, k, v), []).append(b)
    for a, wa in enumerate(reps):
        for t in wa.pod_anti_affinity:
            if t.selector.match_labels:
                k, v = next(iter(t.selector.match_labels.items()))
                cands = [b for ns in t.namespaces or (wa.namespace,)
                         for b in by_label.get((ns, k, v), [])]
            else:
                cands = list(range(len(reps)))
            for b in cands:
                wb = reps[b]
                if term_matches_pod(t, wa.namespace, wb.namespace, wb.labels):
                    for x, y in ((a, b), (b, a)):
                        lst = specs[x].conflicts.setdefault(t.topology_key, [])
                        if y not in lst:
                            lst.append(y)


def _affinity_deps(reps: list[Workload]) -> dict[int, list[tuple[PodAffinityTerm, set[int]]]]:
    """For each class, its affinity terms and the batch classes that could satisfy them."""
    deps: dict[int, list[tuple[PodAffinityTerm, set[int]]]] = {}
    for a, wa in enumerate(reps):
        for t in wa.pod_affinity:
            ms = {b for b, wb in enumerate(reps)
                  if term_matches_pod(t, wa.namespace, wb.namespace, wb.labels)}
            deps.setdefault(a, []).append((t, ms))
    return deps


def _ready(reps: list[Workload], pending: set[int],
           deps: dict[int, list[tuple[PodAffinityTerm, set[int]]]],
           pods: PodIndex) -> tuple[set[int], set[int]]:
    """Classes placeable in the current round, and those that may only place their first pod.

    A class waits while another pending class could satisfy its pod affinity (its pods may
    open domains that running pods don't). When everything waits, a class that can go on
    its own -- each waiting term has running matches or selects the class itself -- goes
    first; if a term has no match at all, only its first pod is placed (the Kubernetes rule
    for the first pod of a self-affine group), which breaks the cycle.
    Gangs move together: all their classes in one round, never first-pod-only.
    """
    ready: set[int] = set()
    first: set[int] = set()
    breakers: list[tuple[int, bool]] = []  # (class, first pod only)
    for ci in sorted(pending):
        w = reps[ci]
        ok, only_first, can_break = True, False, True
        for t, ms in deps.get(ci, []):
            running = bool(pods.matching(t, w.namespace))
            others = (ms - {ci}) & pending
            if others:
                ok = False
                if not running:
                    if ci in ms:
                        only_first = True
                    else:
                        can_break = False
            elif not running:
                if ci in ms:
                    only_first = True
                else:
                    ok = can_break = False  # nothing can ever satisfy it
        if ok:
            ready.add(ci)
            if only_first:
                first.add(ci)
        elif can_break:
            breakers.append((ci, only_first))
    gangs: dict[str, set[int]] = {}
    for ci in pending:
        if reps[ci].gang is not None:
            gangs.setdefault(reps[ci].gang, set()).add(ci)  # type: ignore[arg-type]
    for members in gangs.values():
        if not members <= ready or members & first:
            ready -= members
            first -= members
    breakers = [(ci, f) for ci, f in breakers if reps[ci].gang is None]
    if not ready and breakers:
        ci, only_first = breakers[0]
        ready = {ci}
        first = {ci} if only_first else set()
    return ready, first
