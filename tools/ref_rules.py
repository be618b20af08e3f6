"""The placement rules as ``cloud_core.placement.validate`` states them, per pod and node.

The pieces of the reference model (``tools.ref_model``) that need no solver: label lookup
with the registry's topology facts, selector and toleration matching, the best measured
latency to a target, and the checks that depend on one pod and one node only. Written apart
from the engine's filters, on purpose: the reference must not share their mistakes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from cloud_core.placement.config import EngineConfig
from cloud_core.placement.model import (
    ClusterSnapshot,
    Health,
    LabelSelector,
    NodeInfo,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Workload,
)

HOST = "kubernetes.io/hostname"
FIXED = {"topology.kubernetes.io/zone": "zone", "topology.kubernetes.io/region": "region"}
SECURITY = "cfnet.io/security-level"
_INT = re.compile(r"[+-]?[0-9]+")


def label(node: NodeInfo, key: str) -> str | None:
    """A node's label under ``key`` (None: absent), the registry's topology facts filled in."""
    if key == HOST:
        return node.name
    if key in node.labels:
        return str(node.labels[key])
    if key in FIXED:
        return getattr(node, FIXED[key]) or None
    if key == SECURITY:
        return str(node.security_level) if node.security_level else None
    return None


def _int(s: str) -> int | None:
    if not _INT.fullmatch(s) or len(s) > 25:
        return None
    v = int(s)
    return v if -(2**63) <= v < 2**63 else None


def requirement(r: NodeSelectorRequirement, v: str | None) -> bool:
    """One matchExpressions entry against a label value."""
    if r.operator == "In":
        return v is not None and v in r.values
    if r.operator == "NotIn":
        return v is None or v not in r.values
    if r.operator == "Exists":
        return v is not None
    if r.operator == "DoesNotExist":
        return v is None
    if r.operator in ("Gt", "Lt") and v is not None and len(r.values) == 1:
        a, b = _int(v), _int(r.values[0])
        if a is None or b is None:
            return False
        return a > b if r.operator == "Gt" else a < b
    return False


def selects(sel: LabelSelector, labels: Mapping[str, str]) -> bool:
    return (all(labels.get(k) == v for k, v in sel.match_labels.items())
            and all(requirement(r, labels.get(r.key)) for r in sel.match_expressions))


def term_hits(t: PodAffinityTerm, owner_ns: str, ns: str, labels: Mapping[str, str]) -> bool:
    return ns in (t.namespaces or (owner_ns,)) and selects(t.selector, labels)


def node_term(t: NodeSelectorTerm, node: NodeInfo) -> bool:
    return bool(t.match_expressions) and all(requirement(r, label(node, r.key))
                                             for r in t.match_expressions)


def tolerated(w: Workload, key: str, value: str, effect: str) -> bool:
    for tol in w.tolerations:
        if tol.effect and tol.effect != effect:
            continue
        if tol.key and tol.key != key:
            continue
        if tol.operator == "Exists" or (tol.operator in ("", "Equal") and tol.value == value):
            return True
    return False


class Links:
    """Best usable p95 between a node and a target (node, zone, region or measured peer)."""

    def __init__(self, snap: ClusterSnapshot, cfg: EngineConfig) -> None:
        self.snap, self.cfg = snap, cfg
        self.names = {n.name for n in snap.nodes}
        self.zones: dict[str, list[str]] = {}
        self.regions: dict[str, list[str]] = {}
        for n in snap.nodes:
            self.zones.setdefault(n.zone, []).append(n.name)
            self.regions.setdefault(n.region, []).append(n.name)
        self.best: dict[tuple[str, str], float] = {}
        for (a, b), lk in snap.links.items():
            if lk.age_s > cfg.expire_after_s or not math.isfinite(lk.rtt_p95_ms):
                continue
            v = lk.rtt_p95_ms * (cfg.stale_factor if lk.age_s > cfg.stale_after_s else 1.0)
            for k in ((a, b), (b, a)):
                self.best[k] = min(self.best.get(k, math.inf), v)

    def p95(self, node: NodeInfo, target: str) -> float:
        if target in self.names:
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
        return min((self.best.get((node.name, m), math.inf) for m in members), default=math.inf)


def static_ok(w: Workload, node: NodeInfo, links: Links) -> bool:
    """What depends on the pod and the node alone (health, residency, ..., latency)."""
    if node.health != Health.ONLINE:
        return False
    if w.residency and node.region not in w.residency:
        return False
    if node.security_level < w.min_security_level:
        return False
    if any(label(node, k) != v for k, v in w.node_selector.items()):
        return False
    if w.node_affinity and not any(node_term(t, node) for t in w.node_affinity):
        return False
    if not selector_and_taints(w, node)[1]:
        return False
    if w.max_latency_ms is not None:
        lat = math.inf if w.latency_to is None else links.p95(node, w.latency_to)
        if not lat <= w.max_latency_ms:
            return False
    return True


def selector_and_taints(w: Workload, node: NodeInfo) -> tuple[bool, bool]:
    """(nodeSelector and required node affinity pass, every repelling taint tolerated)."""
    aff = (all(label(node, k) == v for k, v in w.node_selector.items())
           and (not w.node_affinity or any(node_term(t, node) for t in w.node_affinity)))
    taints = all(tolerated(w, t.key, t.value, t.effect) for t in node.taints
                 if t.effect in ("NoSchedule", "NoExecute"))
    return aff, taints
