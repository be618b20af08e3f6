"""Hard-constraint filters. Each is a small pure function; the engine vectorises them.

A *static* filter depends on one projection of the workload and one of the node, so it is
evaluated once per distinct (workload key, node key) pair and broadcast to all nodes by a
table lookup. Dynamic filters (resources, latency, pod (anti-)affinity) read the index.
Every filter returns ``None`` when the node passes, else a short reason used verbatim in
summaries ("residency", "latency > 50 ms", "insufficient GPU").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .model import (
    Health,
    LabelSelector,
    NodeInfo,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Resources,
    Taint,
    Toleration,
    Workload,
    node_label,
)
from .quantity import go_parse_int

REPELLING = ("NoSchedule", "NoExecute")


# -- matching helpers (Kubernetes semantics) ----------------------------------------------
def requirement_matches(req: NodeSelectorRequirement, value: str | None) -> bool:
    """One selector requirement against a label value (None: label absent)."""
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        # labels.Requirement.Matches: both sides through strconv.ParseInt(.., 10, 64); a
        # label that does not parse (or is absent) matches neither Gt nor Lt
        if value is None or len(req.values) != 1:
            return False
        v, ref = go_parse_int(value), go_parse_int(req.values[0])
        if v is None or ref is None:
            return False
        return v > ref if op == "Gt" else v < ref
    return False


def selector_matches(sel: LabelSelector, labels: Mapping[str, str]) -> bool:
    """A pod label selector against a pod's labels."""
    if any(labels.get(k) != v for k, v in sel.match_labels.items()):
        return False
    return all(requirement_matches(r, labels.get(r.key)) for r in sel.match_expressions)


def term_matches_pod(term: PodAffinityTerm, owner_ns: str, ns: str,
                     labels: Mapping[str, str]) -> bool:
    """Does a pod (namespace ``ns``, ``labels``) match ``term`` owned by a pod in ``owner_ns``."""
    namespaces = term.namespaces or (owner_ns,)
    return ns in namespaces and selector_matches(term.selector, labels)


def tolerates(tol: Toleration, taint: Taint) -> bool:
    """``Toleration.ToleratesTaint`` (k8s.io/api/core/v1/toleration.go): an empty effect
    matches every effect, an empty key every key; then Exists matches any value and Equal
    (or an empty operator) the same value."""
    if tol.effect and tol.effect != taint.effect:
        return False
    if tol.key and tol.key != taint.key:
        return False
    if tol.operator == "Exists":
        return True
    if tol.operator in ("", "Equal"):
        return tol.value == taint.value
    return False


def _label_projection(keys: Sequence[str]) -> Callable[[NodeInfo], Hashable]:
    return lambda nd: tuple(node_label(nd, k) for k in keys)


# -- static filters ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StaticFilter:
    """``check(pod_key(w), node_key(node))`` -> reason or None."""

    name: str
    pod_key: Callable[[Workload], Any]
    node_key: Callable[[Workload], Callable[[NodeInfo], Hashable]]
    check: Callable[[Any, Any], str | None]

    def __call__(self, w: Workload, node: NodeInfo) -> str | None:
        return self.check(self.pod_key(w), self.node_key(w)(node))


def check_health(_: None, health: Health) -> str | None:
    """Only online nodes take new work; suspect ones wait until the health tracker decides."""
    return None if health == Health.ONLINE else f"node {health.value}"


def check_residency(residency: frozenset[str], region: str) -> str | None:
    return None if not residency or region in residency else "residency"


def check_security(min_level: int, level: int) -> str | None:
    return None if level >= min_level else f"security level < {min_level}"


def check_node_selector(sel: tuple[tuple[str, str], ...],
                        values: tuple[str | None, ...]) -> str | None:
    ok = all(v == want for (_, want), v in zip(sel, values, strict=True))
    return None if ok else "node selector"


def _term_keys(terms: tuple[NodeSelectorTerm, ...]) -> list[str]:
    return sorted({r.key for t in terms for r in t.match_expressions})


def check_node_affinity(terms: tuple[NodeSelectorTerm, ...],
                        values: tuple[str | None, ...]) -> str | None:
    if not terms:
        return None
    keys = _term_keys(terms)
    labels = dict(zip(keys, values, strict=True))
    for t in terms:  # terms are ORed; an empty term matches nothing (Kubernetes)
        if t.match_expressions and all(requirement_matches(r, labels[r.key])
                                       for r in t.match_expressions):
            return None
    return "node affinity"


def check_taints(tolerations: tuple[Toleration, ...], taints: tuple[Taint, ...]) -> str | None:
    for taint in taints:
        if taint.effect in REPELLING and not any(tolerates(t, taint) for t in tolerations):
            return "untolerated taint"
    return None


STATIC_FILTERS: tuple[StaticFilter, ...] = (
    StaticFilter("health", lambda w: None, lambda w: lambda nd: nd.health, check_health),
    StaticFilter("residency", lambda w: w.residency, lambda w: lambda nd: nd.region,
                 check_residency),
    StaticFilter("security", lambda w: w.min_security_level,
                 lambda w: lambda nd: nd.security_level, check_security),
    StaticFilter("node_selector", lambda w: tuple(sorted(w.node_selector.items())),
                 lambda w: _label_projection(sorted(w.node_selector)), check_node_selector),
    StaticFilter("node_affinity", lambda w: w.node_affinity,
                 lambda w: _label_projection(_term_keys(w.node_affinity)),
                 check_node_affinity),
    StaticFilter("taints", lambda w: w.tolerations, lambda w: lambda nd: nd.taints,
                 check_taints),
)


# -- dynamic filters (scalar forms; the engine has vector forms of the same rules) ----------
def check_resources(req: Resources, free: Resources) -> str | None:
    """Reports the first short resource, GPU first since it is the scarcest."""
    # only what the pod requests is checked (NodeResourcesFit: a zero request fits even an
    # over-committed node)
    if req.gpus > 0 and req.gpus > free.gpus:
        return "insufficient GPU"
    if req.cpu_milli > 0 and req.cpu_milli > free.cpu_milli:
        return "insufficient cpu"
    if req.mem_bytes > 0 and req.mem_bytes > free.mem_bytes:
        return "insufficient memory"
    return None


FILTER_ORDER = ("health", "residency", "security", "node_selector", "node_affinity", "taints",
                "latency", "pod_affinity", "pod_anti_affinity", "resources")
