"""Independent validator: re-checks every hard constraint of a finished placement.

Written apart from ``filters.py``/``engine.py`` on purpose (plain loops, no numpy, no shared
matching helpers) so that a bug in the fast path cannot hide itself. The core runs it before
acting on a result; the tests run it on every placement they make.

A caller that validates step after step on snapshots of the same nodes (the decision loop)
passes a :class:`NodeFacts` of its own: the nodes by name and their topology domains are then
kept from one call to the next and read again only for the nodes whose ``NodeInfo`` is
another object, instead of for every node at every call (at 5,000 nodes, most of a lone
pod's validation). What is kept is read from those same objects: the answer is the one a
fresh reading gives.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

from .changes import changed_positions
from .config import EngineConfig
from .model import (
    ClusterSnapshot,
    Health,
    LabelSelector,
    NodeInfo,
    NodeSelectorRequirement,
    PodAffinityTerm,
    SpreadConstraint,
    Workload,
)
from .sla import breach

_NAME = attrgetter("name")
_ANTI = attrgetter("anti_affinity")


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken hard constraint."""

    workload_uid: str
    node: str | None
    constraint: str
    detail: str


class _PodLike(Protocol):
    """What the pod (anti-)affinity checks read of a pod: a running pod (``RunningPod``,
    taken as it is: no copy of 10,000 pods per batch) or one the batch assigns (``_Pod``)."""

    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def node(self) -> str: ...
    @property
    def anti_affinity(self) -> tuple[PodAffinityTerm, ...]: ...


@dataclass(frozen=True, slots=True)
class _Pod:
    uid: str
    namespace: str
    labels: Mapping[str, str]
    node: str
    anti_affinity: tuple[PodAffinityTerm, ...]


def _label(node: NodeInfo, key: str) -> str | None:
    # Kubernetes: an absent label is absent (None), never ""; the node's own label wins
    if key == "kubernetes.io/hostname":
        return node.name
    v = node.labels.get(key)  # one lookup (a spread constraint reads every node's)
    if v is not None:
        return v
    fixed = {"topology.kubernetes.io/zone": node.zone or None,
             "topology.kubernetes.io/region": node.region or None,
             "cfnet.io/security-level": str(node.security_level) if node.security_level
             else None}
    return fixed.get(key)


class NodeFacts:
    """The nodes as the validator reads them, kept from one call to the next (one caller's,
    one thread's; see the module docstring): a map by name and, per topology key a spread
    constraint asked for, each node's domain and the nodes per domain.

    ``take`` compares the nodes with the last call's by identity (in C); only the nodes whose
    object changed are read again. Anything else (another count, a renamed node, two nodes
    of one name) is read afresh, as without it."""

    def __init__(self) -> None:
        self._nodes: tuple[NodeInfo, ...] = ()
        self._whole = False  # the last nodes have distinct names: kept entries hold
        self.by_name: dict[str, NodeInfo] = {}
        self._domains: dict[str, dict[str, str]] = {}  # key -> node name -> its domain
        self._sizes: dict[str, dict[str, int]] = {}  # key -> domain -> nodes in it
        self.reread = 0  # nodes read again by the last take (tests read it)

    def take(self, nodes: Sequence[NodeInfo]) -> None:
        """Make these the nodes read (``snapshot.nodes``)."""
        now = tuple(nodes)
        old = self._nodes
        if now is old:
            self.reread = 0
            return
        if not self._whole or len(now) != len(old):
            self._afresh(now)
            return
        changed = changed_positions(now, old)
        if any(now[i].name != old[i].name for i in changed):
            self._afresh(now)
            return
        for i in changed:
            nd = now[i]
            self.by_name[nd.name] = nd
            for key, doms in self._domains.items():
                self._set_domain(key, doms, nd.name, _label(nd, key))
        self._nodes = now
        self.reread = len(changed)

    def _afresh(self, nodes: tuple[NodeInfo, ...]) -> None:
        self._nodes = nodes
        self.by_name = dict(zip(map(_NAME, nodes), nodes, strict=True))  # in C
        self._whole = len(self.by_name) == len(nodes)
        self._domains.clear()
        self._sizes.clear()
        self.reread = len(nodes)

    def _set_domain(self, key: str, doms: dict[str, str], name: str, d: str | None) -> None:
        sizes = self._sizes[key]
        was = doms.pop(name, None)
        if was is not None:
            sizes[was] -= 1
            if not sizes[was]:
                del sizes[was]
        if d is not None:
            doms[name] = d
            sizes[d] = sizes.get(d, 0) + 1

    def domains(self, key: str) -> tuple[dict[str, str], dict[str, int]]:
        """Node name -> its domain under ``key`` (nodes lacking the key left out), and
        domain -> how many nodes it has; read-only."""
        doms = self._domains.get(key)
        if doms is None:
            doms = self._domains[key] = {}
            self._sizes[key] = {}
            for nd in self._nodes:
                self._set_domain(key, doms, nd.name, _label(nd, key))
        return doms, self._sizes[key]


_GO_INT = re.compile(r"[+-]?[0-9]+")


def _go_int(s: str) -> int | None:
    """strconv.ParseInt(s, 10, 64), written out again (ASCII digits, int64 range)."""
    if not _GO_INT.fullmatch(s) or len(s) > 25:
        return None
    v = int(s)
    return v if -(2**63) <= v <= 2**63 - 1 else None


def _req_ok(r: NodeSelectorRequirement, v: str | None) -> bool:
    if r.operator == "In":
        return v is not None and v in r.values
    if r.operator == "NotIn":
        return v not in r.values
    if r.operator == "Exists":
        return v is not None
    if r.operator == "DoesNotExist":
        return v is None
    if r.operator in ("Gt", "Lt") and v is not None and len(r.values) == 1:
        a, b = _go_int(v), _go_int(r.values[0])
        if a is None or b is None:
            return False
        return a > b if r.operator == "Gt" else a < b
    return False


def _sel_ok(sel: LabelSelector, labels: Mapping[str, str]) -> bool:
    for k, v in sel.match_labels.items():
        if labels.get(k) != v:
            return False
    return all(_req_ok(r, labels.get(r.key)) for r in sel.match_expressions)


def _term_hits(t: PodAffinityTerm, owner_ns: str, pod: _PodLike) -> bool:
    return pod.namespace in (t.namespaces or (owner_ns,)) and _sel_ok(t.selector, pod.labels)


class _Ctx:
    def __init__(self, snap: ClusterSnapshot, cfg: EngineConfig,
                 facts: NodeFacts | None = None) -> None:
        self.snap = snap
        self.cfg = cfg
        if facts is None:
            facts = NodeFacts()
        facts.take(snap.nodes)
        self.facts = facts
        self.nodes = facts.by_name
        self._zones: dict[str, list[str]] | None = None  # built when a latency bound asks
        self._regions: dict[str, list[str]] = {}

    @property
    def zones(self) -> dict[str, list[str]]:
        if self._zones is None:
            self._zones = {}
            for n in self.snap.nodes:
                self._zones.setdefault(n.zone, []).append(n.name)
                self._regions.setdefault(n.region, []).append(n.name)
        return self._zones

    @property
    def regions(self) -> dict[str, list[str]]:
        _ = self.zones
        return self._regions

    def p95(self, src: str, dst: str) -> float:
        best = math.inf
        for key in ((src, dst), (dst, src)):
            link = self.snap.links.get(key)
            if link is None or link.age_s > self.cfg.expire_after_s:
                continue
            v = link.rtt_p95_ms
            if link.age_s > self.cfg.stale_after_s:
                v *= self.cfg.stale_factor
            best = min(best, v)
        return best

    def latency(self, node: NodeInfo, target: str) -> float:
        if target in self.nodes:
            members = [target]
        elif target in self.zones:
            if node.zone == target:
                return 0.0
            members = self.zones[target]
        elif target in self.regions:
            if node.region == target:
                return 0.0
            members = self.regions[target]
        else:
            members = [target]
        if node.name in members:
            return 0.0
        return min((self.p95(node.name, m) for m in members), default=math.inf)


def _static(ctx: _Ctx, w: Workload, node: NodeInfo) -> list[tuple[str, str]]:
    """Constraints that depend only on the workload and the node."""
    out: list[tuple[str, str]] = []
    if node.health != Health.ONLINE:
        out.append(("health", f"node is {node.health.value}"))
    if w.residency and node.region not in w.residency:
        out.append(("residency", f"region {node.region} not in {sorted(w.residency)}"))
    if node.security_level < w.min_security_level:
        out.append(("security", f"level {node.security_level} < {w.min_security_level}"))
    for k, v in w.node_selector.items():
        if _label(node, k) != v:
            out.append(("node_selector", f"{k}={_label(node, k)!r}, want {v!r}"))
    if w.node_affinity and not any(
            t.match_expressions and all(_req_ok(r, _label(node, r.key))
                                        for r in t.match_expressions)
            for t in w.node_affinity):
        out.append(("node_affinity", "no required term matches"))
    for taint in node.taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        tolerated = False
        for tol in w.tolerations:
            if tol.effect and tol.effect != taint.effect:
                continue
            exists = tol.operator == "Exists" and (not tol.key or tol.key == taint.key)
            equal = (tol.operator in ("", "Equal") and (not tol.key or tol.key == taint.key)
                     and tol.value == taint.value)
            tolerated = tolerated or exists or equal
        if not tolerated:
            out.append(("taints", f"untolerated {taint.key}={taint.value}:{taint.effect}"))
    if w.max_latency_ms is not None:
        lat = math.inf if w.latency_to is None else ctx.latency(node, w.latency_to)
        why = breach(w.max_latency_ms, lat, w.latency_to)
        if why is not None:
            out.append(("latency", why))
    return out


class _Pods:
    """All pods (running and newly assigned) bucketed by topology domain."""

    def __init__(self, ctx: _Ctx, pods: Sequence[_PodLike]) -> None:
        self.ctx = ctx
        self.pods = pods
        self._by_dom: dict[str, dict[str, list[_PodLike]]] = {}
        self.repellers: dict[tuple[str, str], list[tuple[_PodLike, PodAffinityTerm]]] = {}
        for p in filter(_ANTI, pods):  # (in C: most pods have none)
            node = ctx.nodes.get(p.node)
            for t in p.anti_affinity:
                d = _label(node, t.topology_key) if node is not None else None
                if d is not None:
                    self.repellers.setdefault((t.topology_key, d), []).append((p, t))

    def in_domain(self, key: str, dom: str) -> list[_PodLike]:
        idx = self._by_dom.get(key)
        if idx is None:
            idx = {}
            for p in self.pods:
                node = self.ctx.nodes.get(p.node)
                d = _label(node, key) if node is not None else None
                if d is not None:
                    idx.setdefault(d, []).append(p)
            self._by_dom[key] = idx
        return idx.get(dom, [])


def _pod_terms(w: Workload, node: NodeInfo, pods: _Pods) -> list[tuple[str, str]]:
    """Pod affinity / anti-affinity of ``w`` on ``node`` against every other pod."""
    out: list[tuple[str, str]] = []
    me = _Pod(w.uid, w.namespace, w.labels, node.name, w.pod_anti_affinity)
    for t in w.pod_anti_affinity:
        d = _label(node, t.topology_key)
        if d is None:
            continue
        for p in pods.in_domain(t.topology_key, d):
            if p.uid != w.uid and _term_hits(t, w.namespace, p):
                out.append(("pod_anti_affinity", f"shares {t.topology_key} with {p.uid}"))
    for (key, d), lst in pods.repellers.items():
        if _label(node, key) != d:
            continue
        for p, t in lst:
            if p.uid != w.uid and _term_hits(t, p.namespace, me):
                out.append(("pod_anti_affinity", f"{p.uid}'s anti-affinity repels it"))
    if not w.pod_affinity:
        return out
    # InterPodAffinity: only a pod matching EVERY term counts; with none anywhere, a pod
    # matching all its own terms is the first of its group (the exception is for the pod as
    # a whole), and it still needs a node carrying every term's topology key
    terms = w.pod_affinity

    def all_terms(p: _PodLike) -> bool:
        return all(_term_hits(t, w.namespace, p) for t in terms)

    first = all_terms(me) and not any(p.uid != w.uid and all_terms(p) for p in pods.pods)
    for t in terms:
        d = _label(node, t.topology_key)
        if d is None:
            out.append(("pod_affinity", f"node has no {t.topology_key} label"))
        elif not first and not any(p.uid != w.uid and all_terms(p)
                                   for p in pods.in_domain(t.topology_key, d)):
            out.append(("pod_affinity", f"no pod matching every term in its {t.topology_key}"))
    return out


def validate(snapshot: ClusterSnapshot, workloads: Sequence[Workload],
             assignments: Mapping[str, str], config: EngineConfig | None = None, *,
             facts: NodeFacts | None = None) -> list[Violation]:
    """Every hard-constraint violation of ``assignments`` (uid -> node); empty when sound.
    ``facts``: the caller's :class:`NodeFacts`, kept for its next call."""
    ctx = _Ctx(snapshot, config or EngineConfig(), facts)
    out: list[Violation] = []
    by_uid = {w.uid: w for w in workloads}
    for uid, name in assignments.items():
        if uid not in by_uid:
            out.append(Violation(uid, name, "unknown_workload", "not in the batch"))
        elif name not in ctx.nodes:
            out.append(Violation(uid, name, "unknown_node", "no such node"))
    placed = [w for w in workloads if assignments.get(w.uid) in ctx.nodes]
    pods: list[_PodLike] = [*snapshot.pods]
    pods += [_Pod(w.uid, w.namespace, w.labels, assignments[w.uid], w.pod_anti_affinity)
             for w in placed]
    used: dict[str, list[int]] = {}
    index = _Pods(ctx, pods)
    for w in placed:
        node = ctx.nodes[assignments[w.uid]]
        for c, d in _static(ctx, w, node):
            out.append(Violation(w.uid, node.name, c, d))
        for c, d in _pod_terms(w, node, index):
            out.append(Violation(w.uid, node.name, c, d))
        u = used.setdefault(node.name, [0, 0, 0])
        u[0] += w.requests.cpu_milli
        u[1] += w.requests.mem_bytes
        u[2] += w.requests.gpus
    for name, u in used.items():
        n = ctx.nodes[name]
        free = (n.capacity.cpu_milli - n.allocated.cpu_milli,
                n.capacity.mem_bytes - n.allocated.mem_bytes, n.capacity.gpus - n.allocated.gpus)
        for res, want, have in zip(("cpu", "memory", "gpu"), u, free, strict=True):
            if want > 0 and want > have:  # a zero request fits an over-committed node
                uids = [w.uid for w in placed if assignments[w.uid] == name]
                out.append(Violation(uids[-1], name, "resources",
                                     f"{res}: {want} requested > {have} free"))
    out.extend(_node_limits(ctx, snapshot, placed, assignments))
    out.extend(_spread(ctx, snapshot, placed, assignments))
    gangs: dict[str, list[Workload]] = {}
    for w in workloads:
        if w.gang is not None:
            gangs.setdefault(w.gang, []).append(w)
    for g, ws in gangs.items():
        n_placed = sum(1 for w in ws if w.uid in assignments)
        if 0 < n_placed < len(ws):
            out.append(Violation(ws[0].uid, None, "gang",
                                 f"gang {g}: {n_placed} of {len(ws)} placed"))
    return out


def _node_limits(ctx: _Ctx, snap: ClusterSnapshot, placed: Sequence[Workload],
                 assignments: Mapping[str, str]) -> list[Violation]:
    """Pods per node, extended resources and host ports, running pods included."""
    out: list[Violation] = []
    count: dict[str, int] = {}
    ext: dict[tuple[str, str], int] = {}
    ports: dict[str, list[tuple[str, int, str, str]]] = {}  # node -> (proto, port, ip, uid)
    # only the nodes this batch puts pods on are checked: a lone pod's step need not sum
    # the running pods of 5,000 nodes
    targets = {assignments[w.uid] for w in placed}
    for p in [p for p in snap.pods if p.node in targets]:  # (faster than compress+map)
        count[p.node] = count.get(p.node, 0) + 1
        for k, v in p.extended.items():
            ext[p.node, k] = ext.get((p.node, k), 0) + int(v)
        for hp in p.host_ports:
            ports.setdefault(p.node, []).append((hp.protocol, hp.port, hp.host_ip, p.uid))
    for w in placed:
        name = assignments[w.uid]
        node = ctx.nodes[name]
        count[name] = count.get(name, 0) + 1
        if node.max_pods is not None and count[name] > node.max_pods:
            out.append(Violation(w.uid, name, "pods", f"{count[name]} pods > {node.max_pods}"))
        for k, v in w.extended.items():
            ext[name, k] = ext.get((name, k), 0) + int(v)
            if ext[name, k] > node.extended.get(k, 0):
                out.append(Violation(w.uid, name, "extended_resources",
                                     f"{k}: {ext[name, k]} > {node.extended.get(k, 0)}"))
        for hp in w.host_ports:
            for proto, port, ip, uid in ports.get(name, []):
                if proto == hp.protocol and port == hp.port and (
                        ip == hp.host_ip or "0.0.0.0" in (ip, hp.host_ip)):
                    out.append(Violation(w.uid, name, "host_ports",
                                         f"{hp.protocol}/{hp.port} taken by {uid}"))
            ports.setdefault(name, []).append((hp.protocol, hp.port, hp.host_ip, w.uid))
    return out


def _spread(ctx: _Ctx, snap: ClusterSnapshot, placed: Sequence[Workload],
            assignments: Mapping[str, str]) -> list[Violation]:
    """``DoNotSchedule`` topology spread on the final state: for every placed pod with such
    a constraint, the pods matching its selector (its namespace) in its domain, minus the
    fewest in any eligible domain, stay within maxSkew. Eligible: nodes with the key that
    pass the pod's nodeSelector/required node affinity (nodeAffinityPolicy Honor) and, with
    nodeTaintsPolicy Honor, its taints; the minimum is 0 below minDomains domains."""
    out: list[Violation] = []
    # a selector matches pods of its own pod's namespace only: the running pods of other
    # namespaces (and of every namespace, for a batch without a hard constraint) are not
    # looked at
    spread_ns = {w.namespace for w in placed if any(c.hard for c in w.spread)}
    if not spread_ns:
        return out
    # namespace -> labels -> nodes of the pods with them: a selector is matched once per
    # label set (a controller's replicas share theirs), and only matching pods are counted
    every: dict[str, dict[Mapping[str, str], list[str]]] = {}
    # the pods of those namespaces picked first (a lone pod's namespace holds a few of the
    # cluster's pods)
    for p in [p for p in snap.pods if p.namespace in spread_ns]:
        # PodTopologySpread does not count terminating pods
        if not p.terminating:
            every.setdefault(p.namespace, {}).setdefault(p.labels, []).append(p.node)
    for w in placed:
        every.setdefault(w.namespace, {}).setdefault(w.labels, []).append(assignments[w.uid])
    # per (what decides eligibility, namespace, constraint): domain -> matching pods
    memo: dict[tuple[object, ...], dict[str, int]] = {}
    # per (what decides eligibility): eligible node -> its domain, and the eligible domains
    # (shared by the selectors)
    domains_memo: dict[tuple[object, ...], tuple[Mapping[str, str], Sequence[str]]] = {}
    for w in placed:
        for c in w.spread:
            if not c.hard:
                continue
            key = (w.node_selector, w.node_affinity, w.tolerations, w.namespace, c)
            counts = memo.get(key)
            if counts is None:
                ekey = (w.node_selector, w.node_affinity, w.tolerations, c.topology_key,
                        c.honor_affinity, c.honor_taints)
                domain_of = domains_memo.get(ekey)
                if domain_of is None:
                    domain_of = _eligible(ctx, w, c)
                    domains_memo[ekey] = domain_of
                counts = dict.fromkeys(domain_of[1], 0)
                for labels, nodes in every.get(w.namespace, {}).items():
                    if not _sel_ok(c.selector, labels):
                        continue
                    for node in nodes:
                        d = domain_of[0].get(node)
                        if d is not None:
                            counts[d] += 1
                memo[key] = counts
            here = _label(ctx.nodes[assignments[w.uid]], c.topology_key)
            if here is None:
                out.append(Violation(w.uid, assignments[w.uid], "topology_spread",
                                     f"node has no {c.topology_key} label"))
                continue
            low = min(counts.values()) if counts else 0
            if c.min_domains is not None and len(counts) < c.min_domains:
                low = 0
            if counts.get(here, 0) - low > c.max_skew:
                out.append(Violation(w.uid, assignments[w.uid], "topology_spread",
                                     f"{c.topology_key}={here}: {counts.get(here, 0)} - "
                                     f"{low} > maxSkew {c.max_skew}"))
    return out


def _eligible(ctx: _Ctx, w: Workload, c: SpreadConstraint
              ) -> tuple[Mapping[str, str], Sequence[str]]:
    """For ``w``'s spread constraint ``c``: eligible node -> its domain, and the domains of
    the eligible nodes (see ``_spread``)."""
    check = (c.honor_affinity and bool(w.node_selector or w.node_affinity)) or c.honor_taints
    if not check:
        # no node selector/affinity to honour, no taints: every node with the key, as the
        # caller's NodeFacts keeps them (read again only where a node changed)
        doms, sizes = ctx.facts.domains(c.topology_key)
        return doms, list(sizes)
    domain_of: dict[str, str] = {}
    for n in ctx.snap.nodes:
        d = _label(n, c.topology_key)
        if d is None:
            continue
        # (no set per node without a check: 5,000 nodes per spread pod)
        broken = {k for k, _ in _static(ctx, w, n)}
        if c.honor_affinity and broken & {"node_selector", "node_affinity"}:
            continue
        if c.honor_taints and "taints" in broken:
            continue
        domain_of[n.name] = d
    return domain_of, list(dict.fromkeys(domain_of.values()))


def nodes_that_fit(snapshot: ClusterSnapshot, workloads: Sequence[Workload],
                   assignments: Mapping[str, str], w: Workload,
                   config: EngineConfig | None = None) -> list[str]:
    """Nodes where ``w`` could still go on top of ``assignments`` without any violation.

    Tests use it to prove an unplaced workload's reason: if this is empty, it truly has none.
    """
    out = []
    rest = [x for x in workloads if x.uid != w.uid and x.uid in assignments]
    for n in snapshot.nodes:
        trial = dict(assignments)
        trial[w.uid] = n.name
        probe = Workload(**{**{f: getattr(w, f) for f in w.__dataclass_fields__},
                            "gang": None})
        if not validate(snapshot, [*rest, probe], trial, config):
            out.append(n.name)
    return out
