"""Pod-by-pod placement for the constraints that depend on the pods placed just before.

The solver places a class of identical pods in one go, with costs fixed for the batch. That is
right for cost-first packing but cannot express kube-scheduler's rules whose answer changes
with every pod placed: ``topologySpreadConstraints`` (skew counts), host ports, extended
resources, pods-per-node capacity, and the ``spread`` scoring policy (least-allocated and
balanced, recomputed after each pod). Classes with any of these are placed here, one pod at a
time, after the solver's classes of the same batch (so their counts include them):

* every filter of the engine (``ClusterView.filter_results``, resources included), then
* pods-per-node (``NodeInfo.max_pods``), extended resources (``NodeInfo.extended``), host
  port conflicts (same protocol and port, overlapping hostIP; ``0.0.0.0`` overlaps all), and
* each ``DoNotSchedule`` spread constraint, as kube-scheduler's PodTopologySpread filter:
  the node must carry the topology key; pods matching the selector in the pod's namespace are
  counted per domain over the *eligible* nodes (those passing the pod's nodeSelector/required
  node affinity unless nodeAffinityPolicy is Ignore; with nodeTaintsPolicy Honor also its
  taints); ``count(domain) + self - min(eligible domains) <= maxSkew``, where the minimum is
  0 while fewer than ``minDomains`` domains are eligible;
* the cheapest node left by the class's policy wins (``scores.sequential_cost``:
  ``ScheduleAnyway`` constraints are a cost there).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import attrgetter

import numpy as np

from . import scores
from .explain import FilterResult
from .filters import selector_matches, term_matches_pod
from .model import EMPTY, HostPort, PodAffinityTerm, RunningPod, SpreadConstraint, Workload
from .prepared import ClusterView, PodIndex, all_ok, as_running, request_vector

BIG = np.iinfo(np.int64).max // 4
_NODE = attrgetter("node")
_EXTENDED = attrgetter("extended")
_PORTS = attrgetter("host_ports")


def needs_sequential(w: Workload, default_policy: str) -> bool:
    """Whether ``w``'s class must be placed pod by pod (see the module docstring)."""
    return bool(w.spread or w.host_ports or w.extended or w.preferred_pod_affinity
                or w.preferred_pod_anti_affinity) or (w.policy or default_policy) == "spread"


def ports_conflict(a: HostPort, b: HostPort) -> bool:
    """Kubernetes' host port rule: same port and protocol on overlapping addresses."""
    return a.port == b.port and a.protocol == b.protocol and (
        a.host_ip == b.host_ip or "0.0.0.0" in (a.host_ip, b.host_ip))


class NodeUsage:
    """Per node: pods bound, extended resources used, host ports taken (kept up to date)."""

    def __init__(self, pc: ClusterView, pods: Sequence[RunningPod]) -> None:
        ix = pc.ix
        self.n = ix.n
        self.max_pods = ix.max_pods(BIG)
        self.ext_cap: dict[str, np.ndarray] = {}
        self.ext_used: dict[str, np.ndarray] = {}
        self.ports: dict[int, list[HostPort]] = {}
        self._pos = ix.pos
        self._nodes = ix.nodes
        # counted in C (a batch's pod-by-pod classes count every running pod: 2,000 pods
        # one by one were 6 ms of a lone pod's step); the few with extended resources or
        # host ports are then added one by one
        at = np.fromiter(map(ix.pos.get, map(_NODE, pods), repeat(-1)), dtype=np.int64,
                         count=len(pods))
        self.pods = np.bincount(at[at >= 0], minlength=ix.n).astype(np.int64)
        # which have any: in C (``EMPTY`` by identity; ``bool()`` of a pod's extended
        # resources is a Python ``__len__``, 2,000 calls a step)
        extras = map(operator.or_, map(operator.is_not, map(_EXTENDED, pods), repeat(EMPTY)),
                     map(bool, map(_PORTS, pods)))
        for p in compress(pods, extras):
            i = ix.pos.get(p.node)
            if i is not None:
                self._add_extras(i, p.extended, p.host_ports)

    def extended_use(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.ext_cap:
            self.ext_cap[name] = np.array([nd.extended.get(name, 0) for nd in self._nodes],
                                          dtype=np.int64)
            self.ext_used[name] = np.zeros(self.n, dtype=np.int64)
        return self.ext_cap[name], self.ext_used[name]

    def add(self, i: int, extended: object, host_ports: Sequence[HostPort]) -> None:
        self.pods[i] += 1
        self._add_extras(i, extended, host_ports)

    def _add_extras(self, i: int, extended: object, host_ports: Sequence[HostPort]) -> None:
        for name, v in dict(extended).items():  # type: ignore[call-overload]
            used = self.extended_use(name)[1]  # saturating: a sum past int64 is "full"
            used[i] = min(int(used[i]) + min(int(v), BIG), BIG)
        if host_ports:
            self.ports.setdefault(i, []).extend(host_ports)

    def room(self, w: Workload) -> np.ndarray | None:
        """Per node, the most pods of ``w``'s shape that its free pod slots, extended
        resources and host ports hold (None: nothing of these limits ``w`` anywhere). Pods
        of one shape with a host port clash with each other: one per node."""
        out: np.ndarray | None = None
        if (self.max_pods < BIG).any():
            out = np.maximum(self.max_pods - self.pods, 0)
        for name, v in w.extended.items():
            if int(v) > 0:
                cap, used = self.extended_use(name)
                r = np.maximum(cap - used, 0) // int(v)
                out = r if out is None else np.minimum(out, r)
        if w.host_ports:
            r = np.ones(self.n, dtype=np.int64)
            r[self.port_taken(w)] = 0
            out = r if out is None else np.minimum(out, r)
        return out

    def port_taken(self, w: Workload) -> list[int]:
        """The nodes where a pod already there holds one of ``w``'s host ports."""
        return [i for i, taken in self.ports.items()
                if any(ports_conflict(a, b) for a in w.host_ports for b in taken)]

    def mask(self, w: Workload) -> tuple[np.ndarray, str | None]:
        """Nodes with a pod slot, the extended resources and free host ports for ``w``;
        and the reason when none is left."""
        ok = self.pods < self.max_pods
        if not ok.any():
            return ok, "too many pods"
        for name, v in w.extended.items():
            cap, used = self.extended_use(name)
            ok &= cap - used >= int(v)
            if not ok.any():
                return ok, f"insufficient {name}"
        if w.host_ports:
            ok[self.port_taken(w)] = False
        if w.host_ports and not ok.any():
            return ok, "host port in use"
        return ok, None


class SpreadState:
    """Counts of one spread constraint of one workload class, per topology domain."""

    def __init__(self, pc: ClusterView, w: Workload, c: SpreadConstraint,
                 static_ok: np.ndarray, taints_ok: np.ndarray) -> None:
        self.c = c
        self.dom, names = pc.ix.domain_ids(c.topology_key)
        eligible = self.dom >= 0
        if c.honor_affinity:
            eligible = eligible & static_ok
        if c.honor_taints:
            eligible = eligible & taints_ok
        self.eligible = eligible
        self.counts = np.zeros(len(names), dtype=np.int64)
        self.is_domain = np.zeros(len(names), dtype=bool)
        self.is_domain[np.unique(self.dom[eligible])] = True
        term = PodAffinityTerm(c.selector, c.topology_key, (w.namespace,))
        for p in pc.pods.matching(term, w.namespace):
            i = pc.ix.pos.get(p.node)
            if i is not None and eligible[i] and not p.terminating:  # not counted upstream
                self.counts[self.dom[i]] += 1
        self.self_match = int(selector_matches(c.selector, w.labels))

    def minimum(self) -> int:
        n_dom = int(self.is_domain.sum())
        if n_dom == 0:
            return 0
        if self.c.min_domains is not None and n_dom < self.c.min_domains:
            return 0
        return int(self.counts[self.is_domain].min())

    def skew(self) -> np.ndarray:
        """Per node: the skew placing one more pod there gives (BIG: node lacks the key)."""
        after = np.where(self.dom >= 0, self.counts[np.maximum(self.dom, 0)], BIG)
        return after + self.self_match - self.minimum()

    def ok(self) -> np.ndarray:
        """Nodes where one more pod keeps the skew within ``maxSkew`` (decided per domain,
        then spread over the nodes: nodes without the key, id -1, take the last entry)."""
        fine = self.counts + self.self_match - self.minimum() <= self.c.max_skew
        result: np.ndarray = np.append(fine, False)[self.dom]
        return result

    def placed(self, i: int) -> None:
        if self.eligible[i] and self.self_match:
            self.counts[self.dom[i]] += 1


def place_class(pc: ClusterView, w: Workload, count: int, usage: NodeUsage,
                policy: str) -> tuple[list[int], np.ndarray, np.ndarray, str | None]:
    """Place up to ``count`` pods like ``w`` one by one; accounts each in ``pc`` and ``usage``.

    Returns the node indices, the mask and cost the first pod saw (for explanations), and
    why the rest could not be placed (None: all were).
    """
    frs = pc.filter_results(w, resources=False)
    by_name = {f.name: f.ok for f in frs}
    # kube's node inclusion policy looks at nodeSelector and required node affinity only
    static_ok = by_name["node_selector"] & by_name["node_affinity"]
    taints_ok = by_name["taints"]
    spreads = [SpreadState(pc, w, c, static_ok, taints_ok) for c in w.spread]
    req = request_vector(w)
    dynamic = bool(w.pod_affinity or w.pod_anti_affinity or pc.pods.repelling(w))
    base = all_ok(frs)
    placed: list[int] = []
    first_mask: np.ndarray | None = None
    first_cost: np.ndarray | None = None
    why: str | None = None
    # Placing a pod changes its node only: what fits and, without ScheduleAnyway spread (its
    # cost is relative to the candidates), the cost are computed once and kept per node.
    fits: np.ndarray = np.asarray((pc.free >= req).all(axis=1))
    # InterPodAffinity: each pod placed moves its whole domain's score, and the score is
    # normalised over the candidates: recomputed for every pod, as kube-scheduler does
    # (a class with required affinity may attract its own later pods: hardPodAffinityWeight)
    interpod = bool(w.pod_affinity or w.preferred_pod_affinity
                    or w.preferred_pod_anti_affinity) or pc.interpod_raw(w) is not None
    soft = interpod or any(not c.hard for c in w.spread)
    full = None if soft or not pc.ix.n else scores.policy_cost(w, pc.ix, np.arange(pc.ix.n),
                                                               policy, [])
    for k in range(count):
        if k and dynamic:
            base = all_ok(pc.filter_results(w, resources=False))
        mask = base & fits
        if not mask.any():
            why = "no node satisfies every constraint" if not base.any() else \
                "insufficient resources"
            break
        um, reason = usage.mask(w)
        mask &= um
        if reason is not None or not mask.any():
            why = reason or "pod slots, extended resources or host ports taken"
            break
        for s in spreads:
            if s.c.hard:
                mask &= s.ok()
        if not mask.any():
            why = "topology spread: every node would exceed maxSkew"
            break
        if full is None:
            cost = scores.sequential_cost(w, pc.ix, mask, policy,
                                          [(s.skew(), s.c.max_skew) for s in spreads
                                           if not s.c.hard],
                                          pc.pod_cost(w, mask) if interpod else None)
        else:
            cost = np.where(mask, full, np.inf)
        if first_mask is None:
            first_mask, first_cost = mask.copy(), cost
        i = int(np.argmin(cost))
        placed.append(i)
        pc.free[i] -= req
        pc.ix.alloc[i] += req
        fits[i] = bool((pc.free[i] >= req).all())
        if full is not None:
            full[i] = scores.policy_cost(w, pc.ix, np.array([i]), policy, [])[0]
        pc.pods.add(as_running(w, pc.ix.nodes[i].name))
        usage.add(i, w.extended, w.host_ports)
        for s in spreads:
            s.placed(i)
    if first_mask is None:
        first_mask = np.zeros(pc.ix.n, dtype=bool)
        first_cost = np.full(pc.ix.n, np.inf)
    assert first_cost is not None
    return placed, first_mask, first_cost, why


def _over(pc: ClusterView, placed_nodes: list[list[int]]) -> bool:
    """A node the batch put pods on holds more pods than it takes (what NodeUsage would
    count, without its per-pod bookkeeping: most batches have nothing to trim). A node past
    its count without a pod of the batch has nothing to trim."""
    limit = pc.ix.max_pods(BIG)
    targets = {pc.ix.nodes[i].name: i for nodes in placed_nodes for i in nodes
               if limit[i] < BIG}
    if not targets:
        return False
    counts = Counter(filter(targets.__contains__, map(_NODE, pc.pods.all())))  # in C
    return any(counts[name] > limit[i] for name, i in targets.items())


def place_classes(pc: ClusterView, reps: list[Workload], members: list[list[Workload]],
                  seq: set[int], placed_nodes: list[list[int]],
                  base_mask: dict[int, np.ndarray], batch_cost: dict[int, np.ndarray],
                  deferred: dict[int, str]) -> None:
    """The engine's hook, after the solver's rounds: trim what the solver put on nodes past
    their pod count, then place the ``seq`` classes (and the trimmed pods) pod by pod."""
    if not seq and all(nd.max_pods is None for nd in pc.ix.nodes):
        return
    if not seq and not _over(pc, placed_nodes):  # nothing to trim, nothing pod by pod
        pc.ix.alloc = pc.ix.cap - pc.free
        return
    all_pods = pc.pods.all()
    usage = NodeUsage(pc, all_pods)
    over = np.flatnonzero(usage.pods > usage.max_pods)
    order = set(seq)
    if over.size:
        excess = {int(i): int(usage.pods[i] - usage.max_pods[i]) for i in over}
        trimmed: set[str] = set()
        # pods that others' pod affinity selects are trimmed last: moving one would leave
        # the pods placed beside it for its sake without a match in their domain
        for ci in sorted(range(len(reps)), key=lambda ci: (_anchors(reps, ci), ci)):
            if ci in seq:
                continue
            keep: list[int] = []
            for j, n in enumerate(placed_nodes[ci]):
                if excess.get(n, 0) > 0:
                    excess[n] -= 1
                    trimmed.add(members[ci][j].uid)
                    pc.free[n] += request_vector(reps[ci])
                    order.add(ci)
                else:
                    keep.append(n)
            # members are interchangeable: the first len(keep) keep a node
            placed_nodes[ci][:] = keep
        pc.pods = PodIndex([p for p in all_pods if p.uid not in trimmed])
        usage = NodeUsage(pc, [p for p in all_pods if p.uid not in trimmed])
    pc.ix.alloc = pc.ix.cap - pc.free
    # Classes with a DoNotSchedule spread go last: every other pod of the batch that their
    # selectors match is then counted when they choose (what the validator re-checks on the
    # final state).
    for ci in sorted(order, key=lambda ci: (any(c.hard for c in reps[ci].spread), ci)):
        left = len(members[ci]) - len(placed_nodes[ci])
        if left <= 0:
            continue
        nodes, mask, cost, why = place_class(pc, reps[ci], left, usage, pc.cfg.policy)
        placed_nodes[ci].extend(nodes)
        base_mask.setdefault(ci, mask)
        batch_cost.setdefault(ci, cost)
        if why is not None:
            deferred[ci] = why


def _anchors(reps: list[Workload], ci: int) -> bool:
    """Does another class's pod affinity select the pods of class ``ci``?"""
    w = reps[ci]
    return any(term_matches_pod(t, o.namespace, w.namespace, w.labels)
               for cj, o in enumerate(reps) if cj != ci for t in o.pod_affinity)


def pod_by_pod_results(pc: ClusterView, w: Workload,
                       usage_of: Callable[[], NodeUsage] | None = None) -> list[FilterResult]:
    """The constraints the engine checks pod by pod (``sequential.py``), as filters over
    every node, so that ``explain`` never says "fits" of a node the validator rejects: pod
    slots, extended resources, host ports, and hard (``DoNotSchedule``) topology spread.
    Empty when ``w`` has none of them (the common case costs nothing). ``usage_of``: a
    function giving the ``NodeUsage`` to count against (default: the snapshot's pods); after a
    batch, the engine's, with the batch's placements, built once for all its unplaced pods."""
    n = pc.ix.n
    out: list[FilterResult] = []
    if w.spread or w.host_ports or w.extended or any(
            nd.max_pods is not None for nd in pc.ix.nodes):
        usage = NodeUsage(pc, pc.snapshot.pods) if usage_of is None else usage_of()
        slots = usage.pods < usage.max_pods
        out.append(FilterResult("pods", slots, np.zeros(n, np.int64), ("too many pods",)))
        if w.extended:
            names = tuple(f"insufficient {k}" for k in w.extended)
            ok = np.ones(n, dtype=bool)
            labels = np.zeros(n, dtype=np.int64)
            for j, (k, v) in enumerate(w.extended.items()):
                cap, used = usage.extended_use(k)
                short = ok & (cap - used < int(v))
                labels[short] = j
                ok &= ~short
            out.append(FilterResult("extended_resources", ok, labels, names))
        if w.host_ports:
            ok = np.ones(n, dtype=bool)
            for i, taken in usage.ports.items():
                if any(ports_conflict(a, b) for a in w.host_ports for b in taken):
                    ok[i] = False
            out.append(FilterResult("host_ports", ok, np.zeros(n, np.int64),
                                    ("host port in use",)))
    hard = [c for c in w.spread if c.hard]
    if hard:
        by_name = {f.name: f.ok for f in pc.filter_results(w, resources=False)}
        static_ok = by_name["node_selector"] & by_name["node_affinity"]
        ok = np.ones(n, dtype=bool)
        labels = np.zeros(n, dtype=np.int64)
        names = tuple(f"spread skew > {c.max_skew} ({c.topology_key})" for c in hard)
        for j, c in enumerate(hard):
            bad = ok & ~SpreadState(pc, w, c, static_ok, by_name["taints"]).ok()
            labels[bad] = j
            ok &= ~bad
        out.append(FilterResult("spread", ok, labels, names))
    return out
