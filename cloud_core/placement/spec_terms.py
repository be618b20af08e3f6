"""Selector terms of a workload spec, refused where the API server (or the component-helpers
node affinity) would refuse them: node affinity (required and preferred), label selectors,
pod (anti-)affinity terms (required and weighted), tolerations and topology spread
constraints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cloud_core.errors import SpecError

from . import quantity
from .model import (
    HOSTNAME,
    LabelSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    SpreadConstraint,
    Toleration,
)
from .names import label_key_problem, label_value_problem
from .spec_values import as_list, as_map, clip, str_map

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
LABEL_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")  # metav1.LabelSelector


def _weight(tm: Mapping[str, Any], f: str) -> int:
    """A preferred term's ``weight``: required, an integer from 1 to 100 (no strings or
    floats: Kubernetes' weight is an int32, and "50" is a typo to report)."""
    w = tm.get("weight")
    if w is None:
        raise SpecError(f"{f}.weight", "is required")
    if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 100:
        raise SpecError(f"{f}.weight", f"{clip(w)!r} must be an integer from 1 to 100")
    return w



def _requirement(obj: Any, field: str, ops: tuple[str, ...] = OPERATORS,
                 key_check: bool = True) -> NodeSelectorRequirement:
    """One requirement, refused where ``labels.NewRequirement`` would refuse it (the
    component-helpers node affinity then fails the whole term, so the API server's stored
    pod could never match through it): key a qualified name, In/NotIn one or more label
    values, Exists/DoesNotExist none, Gt/Lt exactly one Go integer."""
    m = as_map(obj, field)
    key, op = m.get("key"), m.get("operator")
    if not isinstance(key, str) or not key:
        raise SpecError(f"{field}.key", "is required")
    if key_check and (why := label_key_problem(key)):
        raise SpecError(f"{field}.key", why)
    if op not in ops:
        raise SpecError(f"{field}.operator", f"{clip(op)!r} is not one of {', '.join(ops)}")
    raw = as_list(m.get("values"), f"{field}.values")
    for j, v in enumerate(raw):
        if isinstance(v, bool) or not isinstance(v, str | int):
            raise SpecError(f"{field}.values[{j}]", "must be a string")
    values = tuple(str(v) for v in raw)
    if op in ("In", "NotIn"):
        if not values:
            raise SpecError(f"{field}.values", f"{op} needs at least one value")
        for j, v in enumerate(values):
            if why := label_value_problem(v):
                raise SpecError(f"{field}.values[{j}]", why)
    if op in ("Exists", "DoesNotExist") and values:
        raise SpecError(f"{field}.values", f"{op} takes no values")
    if op in ("Gt", "Lt") and (len(values) != 1 or quantity.go_parse_int(values[0]) is None):
        raise SpecError(f"{field}.values", f"{op} needs exactly one integer (Go's ParseInt)")
    return NodeSelectorRequirement(key, op, values)


def _node_term(obj: Any, f: str) -> NodeSelectorTerm:
    """One node selector term; shared by required terms and preferred ``preference``s so
    that soft and hard affinity can never disagree on what a term means. ``matchFields``
    as the API server validates it: key ``metadata.name``, In or NotIn, exactly one value."""
    tm = as_map(obj, f)
    reqs = [_requirement(r, f"{f}.matchExpressions[{j}]")
            for j, r in enumerate(as_list(tm.get("matchExpressions"), f"{f}.matchExpressions"))]
    for j, r in enumerate(as_list(tm.get("matchFields"), f"{f}.matchFields")):
        req = _requirement(r, f"{f}.matchFields[{j}]", ("In", "NotIn"), key_check=False)
        if req.key != "metadata.name":
            raise SpecError(f"{f}.matchFields[{j}].key", "only metadata.name is supported")
        if len(req.values) != 1:
            raise SpecError(f"{f}.matchFields[{j}].values",
                            "must be exactly one value for a node field selector")
        reqs.append(NodeSelectorRequirement(HOSTNAME, req.operator, req.values))
    return NodeSelectorTerm(tuple(reqs))


def node_terms(obj: Any, field: str) -> tuple[NodeSelectorTerm, ...]:
    return tuple(_node_term(t, f"{field}[{i}]") for i, t in enumerate(as_list(obj, field)))


def required_terms(na: Mapping[str, Any], field: str) -> tuple[NodeSelectorTerm, ...]:
    """A Pod's required node affinity. A present selector with no terms is refused, as the
    API server refuses it ("must have at least one node selector term"): dropping it would
    place the pod anywhere."""
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    if na.get(key) is None:
        return ()
    req = as_map(na[key], field)
    terms = node_terms(req.get("nodeSelectorTerms"), f"{field}.nodeSelectorTerms")
    if not terms:
        raise SpecError(f"{field}.nodeSelectorTerms", "must have at least one node selector term")
    return terms


def preferred_terms(obj: Any, field: str) -> tuple[tuple[int, NodeSelectorTerm], ...]:
    """``[{weight: 1..100, preference: <node selector term>}]`` (Kubernetes'
    ``preferredDuringSchedulingIgnoredDuringExecution``) as (weight, term) pairs."""
    out = []
    for i, t in enumerate(as_list(obj, field)):
        f = f"{field}[{i}]"
        tm = as_map(t, f)
        w = _weight(tm, f)
        if tm.get("preference") is None:
            raise SpecError(f"{f}.preference", "is required")
        out.append((w, _node_term(tm["preference"], f"{f}.preference")))
    return tuple(out)


def _selector(obj: Any, field: str) -> LabelSelector:
    m = as_map(obj, field)
    exprs = tuple(_requirement(r, f"{field}.matchExpressions[{j}]", LABEL_SELECTOR_OPERATORS)
                  for j, r in enumerate(as_list(m.get("matchExpressions"),
                                              f"{field}.matchExpressions")))
    return LabelSelector(str_map(m.get("matchLabels"), f"{field}.matchLabels"), exprs)


def label_selector(obj: Any, field: str) -> LabelSelector:
    """A metav1.LabelSelector (``matchLabels``, ``matchExpressions``); raises SpecError."""
    return _selector(obj, field)


def _pod_term(obj: Any, f: str) -> PodAffinityTerm:
    tm = as_map(obj, f)
    key = tm.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise SpecError(f"{f}.topologyKey", "is required")
    if "labelSelector" not in tm:
        raise SpecError(f"{f}.labelSelector", "is required")
    ns = tuple(str(x) for x in as_list(tm.get("namespaces"), f"{f}.namespaces"))
    return PodAffinityTerm(_selector(tm["labelSelector"], f"{f}.labelSelector"), key, ns)


def pod_terms(obj: Any, field: str) -> tuple[PodAffinityTerm, ...]:
    return tuple(_pod_term(t, f"{field}[{i}]") for i, t in enumerate(as_list(obj, field)))


def weighted_pod_terms(obj: Any, field: str) -> tuple[tuple[int, PodAffinityTerm], ...]:
    """``[{weight: 1..100, podAffinityTerm: <term>}]`` (Kubernetes'
    ``WeightedPodAffinityTerm``) as (weight, term) pairs; the term parsed like a required
    one."""
    out = []
    for i, t in enumerate(as_list(obj, field)):
        f = f"{field}[{i}]"
        tm = as_map(t, f)
        w = _weight(tm, f)
        if tm.get("podAffinityTerm") is None:
            raise SpecError(f"{f}.podAffinityTerm", "is required")
        out.append((w, _pod_term(tm["podAffinityTerm"], f"{f}.podAffinityTerm")))
    return tuple(out)


def tolerations(obj: Any, field: str) -> tuple[Toleration, ...]:
    """Tolerations as ``validateTolerations`` (pkg/apis/core/validation) accepts them: an
    empty operator means Equal; an empty key needs Exists (it then tolerates every taint);
    Exists takes no value; Equal's value is a label value; tolerationSeconds needs
    NoExecute."""
    out = []
    for i, t in enumerate(as_list(obj, field)):
        f = f"{field}[{i}]"
        tm = as_map(t, f)
        op = tm.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise SpecError(f"{f}.operator", f"{clip(op)!r} is not Equal or Exists")
        effect = tm.get("effect") or ""
        if effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise SpecError(f"{f}.effect", f"{clip(effect)!r} is not a taint effect")
        key, value = tm.get("key") or "", tm.get("value") or ""
        if not isinstance(key, str) or not isinstance(value, str):
            raise SpecError(f, "key and value must be strings")
        if key and (why := label_key_problem(key)):
            raise SpecError(f"{f}.key", why)
        if not key and op != "Exists":
            raise SpecError(f"{f}.operator",
                            "must be Exists when key is empty (it then matches every taint)")
        if op == "Exists" and value:
            raise SpecError(f"{f}.value", "must be empty when operator is Exists")
        if op == "Equal" and (why := label_value_problem(value)):
            raise SpecError(f"{f}.value", why)
        if tm.get("tolerationSeconds") is not None and effect != "NoExecute":
            raise SpecError(f"{f}.effect", "must be NoExecute when tolerationSeconds is set")
        out.append(Toleration(key, op, value, effect))
    return tuple(out)


def spread_constraints(obj: Any, field: str, labels: Mapping[str, str]
                       ) -> tuple[SpreadConstraint, ...]:
    """``topologySpreadConstraints``; ``matchLabelKeys`` take the pod's own label values."""
    out = []
    for i, c in enumerate(as_list(obj, field)):
        f = f"{field}[{i}]"
        cm = as_map(c, f)
        skew = cm.get("maxSkew")
        if isinstance(skew, bool) or not isinstance(skew, int) or skew < 1:
            raise SpecError(f"{f}.maxSkew", f"{skew!r} must be an integer >= 1")
        key = cm.get("topologyKey")
        if not isinstance(key, str) or not key:
            raise SpecError(f"{f}.topologyKey", "is required")
        if why := label_key_problem(key):  # ValidateTopologySpreadConstraints: a label name
            raise SpecError(f"{f}.topologyKey", why)
        when = cm.get("whenUnsatisfiable")
        if when not in ("DoNotSchedule", "ScheduleAnyway"):
            raise SpecError(f"{f}.whenUnsatisfiable",
                            f"{when!r} is not DoNotSchedule or ScheduleAnyway")
        min_domains = cm.get("minDomains")
        if min_domains is not None:
            if isinstance(min_domains, bool) or not isinstance(min_domains, int) \
                    or min_domains < 1:
                raise SpecError(f"{f}.minDomains", f"{min_domains!r} must be an integer >= 1")
            if when != "DoNotSchedule":
                raise SpecError(f"{f}.minDomains", "only with whenUnsatisfiable DoNotSchedule")
        pols = {}
        for p, default in (("nodeAffinityPolicy", "Honor"), ("nodeTaintsPolicy", "Ignore")):
            v = cm.get(p) or default
            if v not in ("Honor", "Ignore"):
                raise SpecError(f"{f}.{p}", f"{v!r} is not Honor or Ignore")
            pols[p] = v == "Honor"
        if cm.get("labelSelector") is None:
            # a nil selector matches no pod: every domain counts 0, the constraint holds
            sel = LabelSelector({}, (NodeSelectorRequirement("cfnet.io/nothing", "In",
                                                             ("\x00",)),))
        else:
            sel = _selector(cm["labelSelector"], f"{f}.labelSelector")
        keys = [str(k) for k in as_list(cm.get("matchLabelKeys"), f"{f}.matchLabelKeys")]
        extra = {k: labels[k] for k in keys if k in labels}
        if extra:
            sel = LabelSelector({**sel.match_labels, **extra}, sel.match_expressions)
        out.append(SpreadConstraint(skew, key, when == "DoNotSchedule", sel, min_domains,
                                    pols["nodeAffinityPolicy"], pols["nodeTaintsPolicy"]))
    return tuple(out)
