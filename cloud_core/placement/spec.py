"""Workload specs: a Kubernetes Pod (or a controller's pod template) or the same fields as
plain YAML, parsed into ``Workload``. Every error names the field and the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import yaml

from cloud_core.errors import SpecError

from . import quantity
from .model import (
    COUNT_MAX,
    HOSTNAME,
    HostPort,
    LabelSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Resources,
    SpreadConstraint,
    Toleration,
    Workload,
)
from .names import (
    ID_MAX,
    NAME_MAX,
    label_key_problem,
    label_value_problem,
    name_problem,
    uid_problem,
)

SCHEDULER_NAME = "cfnet-scheduler"
GPU = "nvidia.com/gpu"
CONTROLLERS = ("Deployment", "StatefulSet", "ReplicaSet", "Job", "DaemonSet",
               "ReplicationController")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
# The most workloads one document may expand to (replicas), checked before expanding; the
# console's per-request cap (console.registry.MAX_SUBMIT) is the same number.
MAX_EXPAND = 1000
LABEL_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")  # metav1.LabelSelector
ANN = "cfnet.io/"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def parse_quantity(value: Any, field: str, kind: str) -> int:
    """A Kubernetes quantity (``resource.ParseQuantity``, see ``quantity.py``): ``kind``
    "cpu" gives millicores (``MilliValue``: rounded up), "mem" bytes (``Value``: rounded
    up), "count" whole units (extended resources must be integers). Negative values are
    refused as the API server refuses negative requests and capacities."""
    if isinstance(value, bool) or value is None:
        raise SpecError(field, f"{value!r} is not a quantity")
    if isinstance(value, int) and value.bit_length() > 128:
        raise SpecError(field, "is too large: an integer of more than 128 bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(field, f"{value!r} is not a finite quantity")
    if not isinstance(value, str | int | float):
        raise SpecError(field, f"a {type(value).__name__} is not a quantity")
    try:
        q = quantity.parse(str(value).strip())  # UnmarshalJSON trims spaces too
        if q.negative and q.mantissa:
            raise quantity.QuantityError("must be greater than or equal to 0")
        if kind == "cpu":
            return q.scaled(3, "millicores")
        if kind == "mem":
            return q.scaled(0, "bytes")
        milli = q.scaled(3, "milli-units")
    except quantity.QuantityError as exc:
        raise SpecError(field, str(exc)) from exc
    if milli % 1000:
        raise SpecError(field, f"{value!r} must be a whole number")
    return milli // 1000


def _map(obj: Any, field: str) -> Mapping[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise SpecError(field, f"must be a mapping, got {type(obj).__name__}")
    return obj


def _list(obj: Any, field: str) -> Sequence[Any]:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise SpecError(field, f"must be a list, got {type(obj).__name__}")
    return obj


def _str_map(obj: Any, field: str, labels: bool = True) -> dict[str, str]:
    """A string map; ``labels``: keys and values checked as Kubernetes label keys and values
    (``ValidateLabels``: metadata.labels, nodeSelector, matchLabels), else any strings
    (annotations)."""
    out = {}
    for k, v in _map(obj, field).items():
        if not isinstance(k, str) or not isinstance(v, str | int | float) or isinstance(v, bool):
            raise SpecError(f"{field}.{_clip(k)}", "labels and selectors map strings to strings")
        out[k] = str(v)
        if labels:
            why = label_key_problem(k) or label_value_problem(out[k])
            if why:
                raise SpecError(f"{field}.{_clip(k)}", why)
    return out


def _clip(v: object, n: int = 64) -> str:
    """A value for an error message: short, and printable (errors reach terminals)."""
    s = str(v)
    s = s if len(s) <= n else s[: n - 3] + "..."
    return "".join(c if c.isprintable() else "?" for c in s)

def _weight(tm: Mapping[str, Any], f: str) -> int:
    """A preferred term's ``weight``: required, an integer from 1 to 100 (no strings or
    floats: Kubernetes' weight is an int32, and "50" is a typo to report)."""
    w = tm.get("weight")
    if w is None:
        raise SpecError(f"{f}.weight", "is required")
    if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 100:
        raise SpecError(f"{f}.weight", f"{_clip(w)!r} must be an integer from 1 to 100")
    return w



def _requirement(obj: Any, field: str, ops: tuple[str, ...] = OPERATORS,
                 key_check: bool = True) -> NodeSelectorRequirement:
    """One requirement, refused where ``labels.NewRequirement`` would refuse it (the
    component-helpers node affinity then fails the whole term, so the API server's stored
    pod could never match through it): key a qualified name, In/NotIn one or more label
    values, Exists/DoesNotExist none, Gt/Lt exactly one Go integer."""
    m = _map(obj, field)
    key, op = m.get("key"), m.get("operator")
    if not isinstance(key, str) or not key:
        raise SpecError(f"{field}.key", "is required")
    if key_check and (why := label_key_problem(key)):
        raise SpecError(f"{field}.key", why)
    if op not in ops:
        raise SpecError(f"{field}.operator", f"{_clip(op)!r} is not one of {', '.join(ops)}")
    raw = _list(m.get("values"), f"{field}.values")
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
    tm = _map(obj, f)
    reqs = [_requirement(r, f"{f}.matchExpressions[{j}]")
            for j, r in enumerate(_list(tm.get("matchExpressions"), f"{f}.matchExpressions"))]
    for j, r in enumerate(_list(tm.get("matchFields"), f"{f}.matchFields")):
        req = _requirement(r, f"{f}.matchFields[{j}]", ("In", "NotIn"), key_check=False)
        if req.key != "metadata.name":
            raise SpecError(f"{f}.matchFields[{j}].key", "only metadata.name is supported")
        if len(req.values) != 1:
            raise SpecError(f"{f}.matchFields[{j}].values",
                            "must be exactly one value for a node field selector")
        reqs.append(NodeSelectorRequirement(HOSTNAME, req.operator, req.values))
    return NodeSelectorTerm(tuple(reqs))


def _node_terms(obj: Any, field: str) -> tuple[NodeSelectorTerm, ...]:
    return tuple(_node_term(t, f"{field}[{i}]") for i, t in enumerate(_list(obj, field)))


def _required_terms(na: Mapping[str, Any], field: str) -> tuple[NodeSelectorTerm, ...]:
    """A Pod's required node affinity. A present selector with no terms is refused, as the
    API server refuses it ("must have at least one node selector term"): dropping it would
    place the pod anywhere."""
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    if na.get(key) is None:
        return ()
    req = _map(na[key], field)
    terms = _node_terms(req.get("nodeSelectorTerms"), f"{field}.nodeSelectorTerms")
    if not terms:
        raise SpecError(f"{field}.nodeSelectorTerms", "must have at least one node selector term")
    return terms


def _preferred_terms(obj: Any, field: str) -> tuple[tuple[int, NodeSelectorTerm], ...]:
    """``[{weight: 1..100, preference: <node selector term>}]`` (Kubernetes'
    ``preferredDuringSchedulingIgnoredDuringExecution``) as (weight, term) pairs."""
    out = []
    for i, t in enumerate(_list(obj, field)):
        f = f"{field}[{i}]"
        tm = _map(t, f)
        w = _weight(tm, f)
        if tm.get("preference") is None:
            raise SpecError(f"{f}.preference", "is required")
        out.append((w, _node_term(tm["preference"], f"{f}.preference")))
    return tuple(out)


def _selector(obj: Any, field: str) -> LabelSelector:
    m = _map(obj, field)
    exprs = tuple(_requirement(r, f"{field}.matchExpressions[{j}]", LABEL_SELECTOR_OPERATORS)
                  for j, r in enumerate(_list(m.get("matchExpressions"),
                                              f"{field}.matchExpressions")))
    return LabelSelector(_str_map(m.get("matchLabels"), f"{field}.matchLabels"), exprs)


def _pod_term(obj: Any, f: str) -> PodAffinityTerm:
    tm = _map(obj, f)
    key = tm.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise SpecError(f"{f}.topologyKey", "is required")
    if "labelSelector" not in tm:
        raise SpecError(f"{f}.labelSelector", "is required")
    ns = tuple(str(x) for x in _list(tm.get("namespaces"), f"{f}.namespaces"))
    return PodAffinityTerm(_selector(tm["labelSelector"], f"{f}.labelSelector"), key, ns)


def _pod_terms(obj: Any, field: str) -> tuple[PodAffinityTerm, ...]:
    return tuple(_pod_term(t, f"{field}[{i}]") for i, t in enumerate(_list(obj, field)))


def _weighted_pod_terms(obj: Any, field: str) -> tuple[tuple[int, PodAffinityTerm], ...]:
    """``[{weight: 1..100, podAffinityTerm: <term>}]`` (Kubernetes'
    ``WeightedPodAffinityTerm``) as (weight, term) pairs; the term parsed like a required
    one."""
    out = []
    for i, t in enumerate(_list(obj, field)):
        f = f"{field}[{i}]"
        tm = _map(t, f)
        w = _weight(tm, f)
        if tm.get("podAffinityTerm") is None:
            raise SpecError(f"{f}.podAffinityTerm", "is required")
        out.append((w, _pod_term(tm["podAffinityTerm"], f"{f}.podAffinityTerm")))
    return tuple(out)


def _tolerations(obj: Any, field: str) -> tuple[Toleration, ...]:
    """Tolerations as ``validateTolerations`` (pkg/apis/core/validation) accepts them: an
    empty operator means Equal; an empty key needs Exists (it then tolerates every taint);
    Exists takes no value; Equal's value is a label value; tolerationSeconds needs
    NoExecute."""
    out = []
    for i, t in enumerate(_list(obj, field)):
        f = f"{field}[{i}]"
        tm = _map(t, f)
        op = tm.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise SpecError(f"{f}.operator", f"{_clip(op)!r} is not Equal or Exists")
        effect = tm.get("effect") or ""
        if effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise SpecError(f"{f}.effect", f"{_clip(effect)!r} is not a taint effect")
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


def parse_resources(m: Mapping[str, Any], field: str) -> Resources:
    """A ``{cpu, memory, nvidia.com/gpu}`` map (requests, or a node's capacity) as
    Resources; absent keys are 0, other keys are ignored. Errors name ``field.<key>``."""
    return Resources(
        parse_quantity(m["cpu"], f"{field}.cpu", "cpu") if "cpu" in m else 0,
        parse_quantity(m["memory"], f"{field}.memory", "mem") if "memory" in m else 0,
        parse_quantity(m[GPU], f"{field}.{GPU}", "count") if GPU in m else 0,
    )


# -- every PodSpec field: understood, irrelevant to placement, or refused ----------------------
# A field kube-scheduler acts on that cfnet does not implement must never be ignored: the pod is
# refused (SpecError naming the field -> FailedScheduling event). Fields listed here either
# are honoured by cfnet or do not take part in scheduling at all.
POD_SPEC_FIELDS = frozenset({
    # honoured (see docs/kubernetes.md, "PodSpec fields and cfnet-scheduler")
    "containers", "initContainers", "nodeSelector", "affinity", "tolerations", "nodeName",
    "topologySpreadConstraints", "overhead", "resources", "schedulerName", "hostNetwork",
    "schedulingGates", "volumes",
    # no part in scheduling (kube-scheduler's plugins don't read them either)
    "ephemeralContainers", "restartPolicy", "terminationGracePeriodSeconds",
    "activeDeadlineSeconds", "dnsPolicy", "dnsConfig", "serviceAccountName", "serviceAccount",
    "automountServiceAccountToken", "hostPID", "hostIPC", "shareProcessNamespace",
    "securityContext", "imagePullSecrets", "hostname", "subdomain", "hostAliases",
    "priorityClassName", "priority", "preemptionPolicy", "readinessGates", "runtimeClassName",
    "enableServiceLinks", "setHostnameAsFQDN", "os", "hostUsers",
})
AFFINITY_FIELDS = {
    "nodeAffinity": frozenset({"requiredDuringSchedulingIgnoredDuringExecution", PREFERRED}),
    # preferred pod (anti-)affinity: InterPodAffinity's score (scores.interpod_raw)
    "podAffinity": frozenset({"requiredDuringSchedulingIgnoredDuringExecution", PREFERRED}),
    "podAntiAffinity": frozenset({"requiredDuringSchedulingIgnoredDuringExecution",
                                  PREFERRED}),
}
POD_TERM_FIELDS = frozenset({"labelSelector", "namespaces", "topologyKey"})
WEIGHTED_TERM_FIELDS = frozenset({"weight", "podAffinityTerm"})
SPREAD_FIELDS = frozenset({"maxSkew", "topologyKey", "whenUnsatisfiable", "labelSelector",
                           "minDomains", "nodeAffinityPolicy", "nodeTaintsPolicy",
                           "matchLabelKeys"})
# volume sources that tie a pod to nodes (PVCs: zones, node affinity, attach limits) are
# refused; these never constrain the node
PLAIN_VOLUMES = frozenset({"name", "emptyDir", "configMap", "secret", "projected",
                           "downwardAPI", "hostPath"})
CONTAINER_RESOURCE_FIELDS = frozenset({"requests", "limits"})
NOT_SUPPORTED = "not supported by cfnet-scheduler (the pod is refused, never placed " \
                "ignoring it)"


def check_supported(spec: Mapping[str, Any], sp: str = "spec") -> None:
    """Raise ``SpecError`` naming the first field of ``spec`` that cfnet cannot honour."""
    for k in spec:
        if k not in POD_SPEC_FIELDS:
            raise SpecError(f"{sp}.{k}", NOT_SUPPORTED)
    gates = _list(spec.get("schedulingGates"), f"{sp}.schedulingGates")
    if gates:
        names = ", ".join(str(_map(g, f"{sp}.schedulingGates").get("name")) for g in gates)
        raise SpecError(f"{sp}.schedulingGates", f"the pod is gated ({names}); it is "
                        "placed once the gates are removed")
    aff = _map(spec.get("affinity"), f"{sp}.affinity")
    for k, v in aff.items():
        if k not in AFFINITY_FIELDS:
            raise SpecError(f"{sp}.affinity.{k}", NOT_SUPPORTED)
        for kk, terms in _map(v, f"{sp}.affinity.{k}").items():
            f = f"{sp}.affinity.{k}.{kk}"
            if kk not in AFFINITY_FIELDS[k]:
                raise SpecError(f, NOT_SUPPORTED)
            if k == "nodeAffinity":
                continue
            for i, t in enumerate(_list(terms, f)):
                tm = _map(t, f"{f}[{i}]")
                where = f"{f}[{i}]"
                if kk == PREFERRED:
                    for x in tm:
                        if x not in WEIGHTED_TERM_FIELDS:
                            raise SpecError(f"{where}.{x}", NOT_SUPPORTED)
                    where += ".podAffinityTerm"
                    tm = _map(tm.get("podAffinityTerm"), where)
                # a preferred term is scored now: a field cfnet cannot honour is refused there
                # too (namespaceSelector, matchLabelKeys), never scored as if absent
                for x in tm:
                    if x not in POD_TERM_FIELDS:
                        raise SpecError(f"{where}.{x}", NOT_SUPPORTED)
    for i, c in enumerate(_list(spec.get("topologySpreadConstraints"),
                                f"{sp}.topologySpreadConstraints")):
        for x in _map(c, f"{sp}.topologySpreadConstraints[{i}]"):
            if x not in SPREAD_FIELDS:
                raise SpecError(f"{sp}.topologySpreadConstraints[{i}].{x}", NOT_SUPPORTED)
    for i, v in enumerate(_list(spec.get("volumes"), f"{sp}.volumes")):
        for x in _map(v, f"{sp}.volumes[{i}]"):
            if x not in PLAIN_VOLUMES:
                raise SpecError(f"{sp}.volumes[{i}].{x}", NOT_SUPPORTED)
    if "resources" in spec:
        for x in _map(spec.get("resources"), f"{sp}.resources"):
            if x not in CONTAINER_RESOURCE_FIELDS:
                raise SpecError(f"{sp}.resources.{x}", NOT_SUPPORTED)
    for part in ("containers", "initContainers"):
        for i, c in enumerate(_list(spec.get(part), f"{sp}.{part}")):
            res = _map(_map(c, f"{sp}.{part}[{i}]").get("resources"),
                       f"{sp}.{part}[{i}].resources")
            for x in res:
                if x not in CONTAINER_RESOURCE_FIELDS:
                    raise SpecError(f"{sp}.{part}[{i}].resources.{x}", NOT_SUPPORTED)


def _quantity_of(name: str, v: Any, field: str) -> int:
    """One resource by name: cpu in millicores, byte-valued ones in bytes, others counted."""
    if name == "cpu":
        return parse_quantity(v, field, "cpu")
    if name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
        return parse_quantity(v, field, "mem")
    return parse_quantity(v, field, "count")


def _resource_map(m: Mapping[str, Any], field: str) -> dict[str, int]:
    return {str(k): _quantity_of(str(k), v, f"{field}.{k}") for k, v in m.items()}


def _container_requests(c: Any, field: str) -> dict[str, int]:
    res = _map(_map(c, field).get("resources"), f"{field}.resources")
    req = dict(_map(res.get("limits"), f"{field}.resources.limits"))  # limits default requests
    req.update(_map(res.get("requests"), f"{field}.resources.requests"))
    return _resource_map(req, f"{field}.resources.requests")


def _add(a: dict[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def pod_requests(spec: Mapping[str, Any], sp: str = "spec") -> dict[str, int]:
    """What a pod asks of a node, as kube-scheduler's fit filter computes it: the sum over
    containers (plus restartable "sidecar" init containers), at least each init container's
    own request on top of the sidecars started before it, a pod-level ``resources`` where
    set, plus the pod ``overhead``."""
    total: dict[str, int] = {}
    for i, c in enumerate(_list(spec.get("containers"), f"{sp}.containers")):
        total = _add(total, _container_requests(c, f"{sp}.containers[{i}]"))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, c in enumerate(_list(spec.get("initContainers"), f"{sp}.initContainers")):
        f = f"{sp}.initContainers[{i}]"
        req = _container_requests(c, f)
        if _map(c, f).get("restartPolicy") == "Always":
            sidecars = _add(sidecars, req)
            continue
        for k, v in _add(sidecars, req).items():
            init_peak[k] = max(init_peak.get(k, 0), v)
    total = _add(total, sidecars)
    for k, v in init_peak.items():
        total[k] = max(total.get(k, 0), v)
    pod_level = _map(spec.get("resources"), f"{sp}.resources")
    if pod_level:
        lvl = dict(_map(pod_level.get("limits"), f"{sp}.resources.limits"))
        lvl.update(_map(pod_level.get("requests"), f"{sp}.resources.requests"))
        total.update(_resource_map(lvl, f"{sp}.resources.requests"))
    return _add(total, _resource_map(_map(spec.get("overhead"), f"{sp}.overhead"),
                                     f"{sp}.overhead"))


def counted_requests(req: Mapping[str, int], sp: str = "spec") -> dict[str, int]:
    """``req`` (a pod's :func:`pod_requests`) if every figure is one cfnet counts; else a
    SpecError naming the resource (the pod is refused, nothing else is affected)."""
    for k, v in req.items():
        if not -COUNT_MAX <= v <= COUNT_MAX:
            raise SpecError(f"{sp}.containers[*].resources.requests.{_clip(str(k))}",
                            f"adds up to {v}, more than cfnet counts ({COUNT_MAX}) for one pod")
    return dict(req)


def clamped_requests(req: Mapping[str, int]) -> dict[str, int]:
    """``req`` with each figure clamped to what cfnet counts: a pod of another scheduler
    asking for more takes all of its node, and no sum overflows."""
    return {k: min(max(v, -COUNT_MAX), COUNT_MAX) for k, v in req.items()}


def split_requests(req: Mapping[str, int]) -> tuple[Resources, dict[str, int]]:
    """(cpu, memory, GPU) as ``Resources`` and every other resource by name (non-zero)."""
    rest = {k: v for k, v in req.items() if k not in ("cpu", "memory", GPU) and v}
    return Resources(req.get("cpu", 0), req.get("memory", 0), req.get(GPU, 0)), rest


def host_ports(spec: Mapping[str, Any], sp: str = "spec") -> tuple[HostPort, ...]:
    """Host ports the pod holds (with ``hostNetwork`` each containerPort is one): those of
    its containers and of its restartable ("sidecar", ``restartPolicy: Always``) init
    containers. A run-to-completion init container has finished before the containers start,
    so its ports are not held (NodePorts' getContainerPorts; node_ports_test.go cases
    "non-sidecar initContainer using hostPort", "TCP hostPort conflict from sidecar
    initContainer")."""
    out: list[HostPort] = []
    host_net = bool(spec.get("hostNetwork"))
    for part in ("initContainers", "containers"):
        for i, c in enumerate(_list(spec.get(part), f"{sp}.{part}")):
            if part == "initContainers" and (not isinstance(c, Mapping)
                                             or c.get("restartPolicy") != "Always"):
                continue
            for j, p in enumerate(_list(_map(c, f"{sp}.{part}[{i}]").get("ports"),
                                        f"{sp}.{part}[{i}].ports")):
                f = f"{sp}.{part}[{i}].ports[{j}]"
                pm = _map(p, f)
                port = pm.get("hostPort") or (pm.get("containerPort") if host_net else None)
                if not port:
                    continue
                if isinstance(port, bool) or not isinstance(port, int) \
                        or not 0 < port < 65536:
                    raise SpecError(f"{f}.hostPort", f"{port!r} is not a port number")
                proto = str(pm.get("protocol") or "TCP")
                if proto not in ("TCP", "UDP", "SCTP"):
                    raise SpecError(f"{f}.protocol", f"{proto!r} is not TCP, UDP or SCTP")
                out.append(HostPort(port, proto, str(pm.get("hostIP") or "0.0.0.0")))
    return tuple(dict.fromkeys(out))


def spread_constraints(obj: Any, field: str, labels: Mapping[str, str]
                       ) -> tuple[SpreadConstraint, ...]:
    """``topologySpreadConstraints``; ``matchLabelKeys`` take the pod's own label values."""
    out = []
    for i, c in enumerate(_list(obj, field)):
        f = f"{field}[{i}]"
        cm = _map(c, f)
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
        keys = [str(k) for k in _list(cm.get("matchLabelKeys"), f"{f}.matchLabelKeys")]
        extra = {k: labels[k] for k in keys if k in labels}
        if extra:
            sel = LabelSelector({**sel.match_labels, **extra}, sel.match_expressions)
        out.append(SpreadConstraint(skew, key, when == "DoNotSchedule", sel, min_domains,
                                    pols["nodeAffinityPolicy"], pols["nodeTaintsPolicy"]))
    return tuple(out)


POLICIES = ("cost", "spread")


def _number(v: Any, field: str, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(v, bool):
        raise SpecError(field, f"{v!r} is not a number")
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise SpecError(field, f"{_clip(v)!r} is not a number") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise SpecError(field, f"{v!r} is not a finite number")
    if x < minimum or (strict and x <= minimum):
        raise SpecError(field, f"{v!r} must be {'>' if strict else '>='} {minimum:g}")
    return x


def _text(v: Any, field: str, max_len: int = NAME_MAX) -> str:
    """A free-text reference (a data set, a gang, a zone): a short printable string."""
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise SpecError(field, "must be a string")
    t = str(v)
    if len(t) > max_len or not t.isprintable():
        raise SpecError(field, f"must be at most {max_len} printable characters")
    return t


def _int(v: Any, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise SpecError(field, f"{_clip(v)!r} is not an integer")
    if (isinstance(v, int) and v.bit_length() > 64) or (isinstance(v, str) and len(v) > 24):
        raise SpecError(field, "is out of range (more than 64 bits)")
    try:
        x = int(str(v).strip())
    except ValueError:
        raise SpecError(field, f"{_clip(v)!r} is not an integer") from None
    if x < 0:
        raise SpecError(field, f"{x} must be >= 0")
    return x


def _extras(get: Any, prefix: str, field_name: Any) -> dict[str, Any]:
    """The cfnet fields, read through ``get(key)`` under either naming scheme."""
    out: dict[str, Any] = {}
    v = get("max-latency-ms")
    if v is not None:
        out["max_latency_ms"] = _number(v, field_name("max-latency-ms"), strict=True)
    v = get("latency-to")
    if v is not None:
        if not isinstance(v, str) or not v.strip():
            raise SpecError(field_name("latency-to"), "must name a node, zone or region")
        out["latency_to"] = _text(v.strip(), field_name("latency-to"))
    if "max_latency_ms" in out and "latency_to" not in out:
        raise SpecError(field_name("latency-to"), "is required with max-latency-ms")
    v = get("residency")
    if v is not None:
        items = v.split(",") if isinstance(v, str) else v
        if not isinstance(items, list):
            raise SpecError(field_name("residency"), "must be a comma list of regions")
        regions = frozenset(_text(str(x).strip(), field_name("residency"))
                            for x in items[:64] if str(x).strip())
        if not regions:
            raise SpecError(field_name("residency"), "names no region")
        out["residency"] = regions
    v = get("min-security-level")
    if v is not None:
        out["min_security_level"] = _int(v, field_name("min-security-level"))
    v = get("data")
    if v is not None:
        out["data_name"] = _text(v, field_name("data"))
    v = get("data-gb")
    if v is not None:
        out["data_gb"] = _number(v, field_name("data-gb"))
    v = get("data-location")
    if v is not None:
        out["data_location"] = _text(v, field_name("data-location"))
    v = get("cost-weight")
    if v is not None:
        out["cost_weight"] = _number(v, field_name("cost-weight"))
    v = get("gang")
    if v is not None:
        out["gang"] = _text(v, field_name("gang"))
    return out


def parse_pod(pod: Mapping[str, Any], uid: str | None = None) -> Workload:
    """A Pod, or a controller (Deployment, ...) whose pod template is used, as a Workload."""
    if not isinstance(pod, Mapping):
        raise SpecError("(root)", "a pod must be a mapping")
    kind = pod.get("kind", "Pod")
    meta = _map(pod.get("metadata"), "metadata")
    spec = _map(pod.get("spec"), "spec")
    sp = "spec"
    if kind in CONTROLLERS:
        tmpl = _map(spec.get("template"), "spec.template")
        tmeta = _map(tmpl.get("metadata"), "spec.template.metadata")
        meta = {**meta, "labels": tmeta.get("labels", {}),
                "annotations": {**_map(meta.get("annotations"), "metadata.annotations"),
                                **_map(tmeta.get("annotations"),
                                       "spec.template.metadata.annotations")}}
        spec = _map(tmpl.get("spec"), "spec.template.spec")
        sp = "spec.template.spec"
    elif kind != "Pod":
        raise SpecError("kind", f"{kind!r} is not a Pod or a workload controller")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError("metadata.name", "is required")
    _check_name(name, "metadata.name", NAME_MAX)
    ns = meta.get("namespace") or "default"
    _check_name(ns, "metadata.namespace", ID_MAX)
    sched = spec.get("schedulerName")
    if sched is not None and sched != SCHEDULER_NAME:
        raise SpecError(f"{sp}.schedulerName", f"is {sched!r}, not {SCHEDULER_NAME!r}")
    containers = _list(spec.get("containers"), f"{sp}.containers")
    if not containers:
        raise SpecError(f"{sp}.containers", "at least one container is required")
    check_supported(spec, sp)
    requests, extended = split_requests(counted_requests(pod_requests(spec, sp), sp))
    ann = _str_map(meta.get("annotations"), "metadata.annotations", labels=False)
    policy = ann.get(ANN + "placement-policy")
    if policy is not None and policy not in POLICIES:
        raise SpecError(f"metadata.annotations.{ANN}placement-policy",
                        f"{_clip(policy)!r} is not one of {', '.join(POLICIES)}")
    labels = _str_map(meta.get("labels"), "metadata.labels")
    aff = _map(spec.get("affinity"), f"{sp}.affinity")
    na = _map(aff.get("nodeAffinity"), f"{sp}.affinity.nodeAffinity")
    pa = _map(aff.get("podAffinity"), f"{sp}.affinity.podAffinity")
    paa = _map(aff.get("podAntiAffinity"), f"{sp}.affinity.podAntiAffinity")
    rq = "requiredDuringSchedulingIgnoredDuringExecution"
    extras = _extras(lambda k: ann.get(ANN + k), ANN,
                     lambda k: f"metadata.annotations.{ANN}{k}")
    if "gang" in extras:
        # a gang is a tenant's name: per namespace, so tenant B's "train" is not tenant A's
        # (the engine's and validator's messages then name it as namespace/name)
        extras["gang"] = f"{ns}/{extras['gang']}"
    node_affinity = _required_terms(na, f"{sp}.affinity.nodeAffinity.{rq}")
    node_name = spec.get("nodeName")
    if node_name:
        # the API server stores only a DNS subdomain here (ValidateNodeName)
        _check_name(node_name, f"{sp}.nodeName", NAME_MAX)
        # nodeName ANDs with the required terms: the node itself, and one of the terms
        on = NodeSelectorRequirement(HOSTNAME, "In", (str(node_name),))
        node_affinity = tuple(NodeSelectorTerm((*t.match_expressions, on))
                              for t in node_affinity) or (NodeSelectorTerm((on,)),)
    return Workload(
        uid=uid or str(meta.get("uid") or f"{ns}/{name}"),
        name=name,
        namespace=ns,
        requests=requests,
        extended=extended,
        host_ports=host_ports(spec, sp),
        spread=spread_constraints(spec.get("topologySpreadConstraints"),
                                  f"{sp}.topologySpreadConstraints", labels),
        policy=policy,
        node_selector=_str_map(spec.get("nodeSelector"), f"{sp}.nodeSelector"),
        node_affinity=node_affinity,
        preferred_node_affinity=_preferred_terms(
            na.get(PREFERRED), f"{sp}.affinity.nodeAffinity.{PREFERRED}"),
        tolerations=_tolerations(spec.get("tolerations"), f"{sp}.tolerations"),
        pod_affinity=_pod_terms(pa.get(rq), f"{sp}.affinity.podAffinity.{rq}"),
        pod_anti_affinity=_pod_terms(paa.get(rq), f"{sp}.affinity.podAntiAffinity.{rq}"),
        preferred_pod_affinity=_weighted_pod_terms(
            pa.get(PREFERRED), f"{sp}.affinity.podAffinity.{PREFERRED}"),
        preferred_pod_anti_affinity=_weighted_pod_terms(
            paa.get(PREFERRED), f"{sp}.affinity.podAntiAffinity.{PREFERRED}"),
        labels=labels,
        **extras,
    )


class PodParser:
    """``parse_pod`` with a memo for pods that differ only in name and uid.

    The pods of one controller (a ReplicaSet's, a Job's) share namespace, labels,
    annotations and spec: the first is parsed in full, the others reuse its Workload with
    their own name (checked) and uid. The key is the JSON of everything ``parse_pod`` reads
    besides those two, so any difference parses afresh; the memo is bounded (cleared when
    full) and refusals are not memoised. For pods decoded from JSON (string keys only: a
    non-string key would encode like its string). One instance per thread (no lock).
    """

    def __init__(self, max_entries: int = 2048) -> None:
        self.max_entries = max_entries
        self._memo: dict[bytes, Workload] = {}
        self._encode = msgspec.json.Encoder().encode
        self.hits = 0

    def parse(self, pod: Mapping[str, Any]) -> Workload:
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        if not isinstance(meta, Mapping) or pod.get("kind", "Pod") != "Pod":
            return parse_pod(pod)
        spec = _key_spec(pod.get("spec"))
        if spec is None:
            return parse_pod(pod)
        try:
            key = self._encode((meta.get("namespace"), meta.get("labels"),
                                meta.get("annotations"), spec))
        except (TypeError, ValueError):  # not JSON-shaped: parse_pod says why
            return parse_pod(pod)
        t = self._memo.get(key)
        if t is None:
            w = parse_pod(pod)
            if len(self._memo) >= self.max_entries:
                self._memo.clear()
            self._memo[key] = w
            return w
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise SpecError("metadata.name", "is required")
        _check_name(name, "metadata.name", NAME_MAX)
        self.hits += 1
        return dataclasses.replace(t, uid=str(meta.get("uid") or f"{t.namespace}/{name}"),
                                   name=name)


def _key_spec(spec: Any) -> Any:
    """What of ``spec`` parse_pod reads, for PodParser's key; None: no memo for this pod.

    The API server gives every pod a projected ServiceAccount volume with a random name
    (``kube-api-access-xxxxx``), mounted in each container: parse_pod reads neither volume
    names nor mounts (only which sources a volume uses), so they stay out of the key.
    """
    if not isinstance(spec, Mapping):
        return spec
    if "volumes" not in spec:
        return spec
    vols = spec.get("volumes")
    out = dict(spec)
    if isinstance(vols, list):
        if not all(isinstance(v, Mapping) for v in vols):
            return None
        out["volumes"] = [{"sources": sorted(str(k) for k in v if k != "name")} for v in vols]
    for c in ("containers", "initContainers"):
        cs = spec.get(c)
        if isinstance(cs, list):
            if not all(isinstance(x, Mapping) for x in cs):
                return None
            out[c] = [{k: v for k, v in x.items() if k != "volumeMounts"} for x in cs]
    return out


_PLAIN_KEYS = {"name", "namespace", "uid", "replicas", "requests", "nodeSelector", "nodeAffinity",
               "preferredNodeAffinity", "tolerations", "podAffinity", "podAntiAffinity",
               "preferredPodAffinity", "preferredPodAntiAffinity", "labels", "maxLatencyMs",
               "latencyTo", "residency", "minSecurityLevel", "data",
               "dataGb", "dataLocation", "costWeight", "gang"}
_CAMEL = {"max-latency-ms": "maxLatencyMs", "latency-to": "latencyTo", "residency": "residency",
          "min-security-level": "minSecurityLevel", "data": "data", "data-gb": "dataGb",
          "data-location": "dataLocation", "cost-weight": "costWeight", "gang": "gang"}


def parse_plain(doc: Mapping[str, Any], where: str = "") -> list[Workload]:
    """The plain (non-Kubernetes) form: flat camelCase fields, ``replicas`` expands."""
    unknown = sorted(set(doc) - _PLAIN_KEYS)
    if unknown:
        raise SpecError(f"{where}{unknown[0]}", "unknown field")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{where}name", "is required")
    _check_name(name, f"{where}name", NAME_MAX)
    ns = doc.get("namespace") or "default"
    _check_name(ns, f"{where}namespace", ID_MAX)
    req = _map(doc.get("requests"), f"{where}requests")
    for k in req:
        if k not in ("cpu", "memory", GPU):
            raise SpecError(f"{where}requests.{k}",
                            "unknown resource (cpu, memory, nvidia.com/gpu)")
    res = parse_resources(req, f"{where}requests")
    replicas = _replicas(doc.get("replicas", 1), f"{where}replicas", name)
    extras = _extras(lambda k: doc.get(_CAMEL[k]), "", lambda k: f"{where}{_CAMEL[k]}")
    base = Workload(
        uid="", name=name, namespace=ns, requests=res,
        node_selector=_str_map(doc.get("nodeSelector"), f"{where}nodeSelector"),
        node_affinity=_node_terms(doc.get("nodeAffinity"), f"{where}nodeAffinity"),
        preferred_node_affinity=_preferred_terms(doc.get("preferredNodeAffinity"),
                                                 f"{where}preferredNodeAffinity"),
        tolerations=_tolerations(doc.get("tolerations"), f"{where}tolerations"),
        pod_affinity=_pod_terms(doc.get("podAffinity"), f"{where}podAffinity"),
        pod_anti_affinity=_pod_terms(doc.get("podAntiAffinity"), f"{where}podAntiAffinity"),
        preferred_pod_affinity=_weighted_pod_terms(doc.get("preferredPodAffinity"),
                                                   f"{where}preferredPodAffinity"),
        preferred_pod_anti_affinity=_weighted_pod_terms(doc.get("preferredPodAntiAffinity"),
                                                        f"{where}preferredPodAntiAffinity"),
        labels=_str_map(doc.get("labels"), f"{where}labels"), **extras)
    uid = doc.get("uid") or f"{ns}/{name}"
    if why := uid_problem(uid):
        raise SpecError(f"{where}uid", why)
    if replicas == 1 and "replicas" not in doc:
        return [_with(base, uid, name)]
    return [_with(base, f"{uid}-{i}", f"{name}-{i}") for i in range(replicas)]


def _check_name(value: object, field: str, max_len: int) -> None:
    """The one name rule (``names``) for every name a workload carries."""
    if why := name_problem(value, max_len):
        raise SpecError(field, why)


def _replicas(v: Any, field: str, name: str) -> int:
    """A replica count, bounded before anything is expanded: ``replicas: 1000000`` must be
    refused by looking at one number, not after building a million workloads."""
    n = _int(v, field)
    if n > MAX_EXPAND:
        raise SpecError(field, f"at most {MAX_EXPAND} replicas per document")
    if n and len(name) + 1 + len(str(n - 1)) > NAME_MAX:
        raise SpecError(field, f"replica names ({name}-{n - 1}) would exceed {NAME_MAX} "
                        "characters")
    return n


def _with(w: Workload, uid: str, name: str) -> Workload:
    kw = {f: getattr(w, f) for f in w.__dataclass_fields__}
    kw.update(uid=uid, name=name)
    return Workload(**kw)


def parse_workload_yaml(text: str) -> list[Workload]:
    """One or more YAML documents, each a Kubernetes object or the plain form."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        # ValueError: an integer of more than 4,300 digits
        raise SpecError("(yaml)", f"not valid YAML: {str(e)[:300]}") from e
    out: list[Workload] = []
    for i, d in enumerate(docs):
        where = f"[{i}]." if len(docs) > 1 else ""
        if not isinstance(d, Mapping):
            raise SpecError(f"{where}(root)" if where else "(root)", "a workload is a mapping")
        if "kind" in d or "spec" in d:
            try:
                w = parse_pod(d)
            except SpecError as e:
                raise SpecError(f"{where}{e.field}", e.reason) from e
            n = d.get("spec", {}).get("replicas", 1) if d.get("kind") in CONTROLLERS else 1
            n = _replicas(n, f"{where}spec.replicas", w.name)
            out.extend([w] if d.get("kind", "Pod") == "Pod"
                       else [_with(w, f"{w.uid}-{j}", f"{w.name}-{j}") for j in range(n)])
        else:
            out.extend(parse_plain(d, where))
    uids = [w.uid for w in out]
    if len(set(uids)) != len(uids):
        dup = next(u for u in uids if uids.count(u) > 1)
        raise SpecError("uid", f"{dup!r} appears twice")
    return out


def usage_workload(pod: Mapping[str, Any]) -> Workload | None:
    """What a pod bound by anyone (kube-scheduler too, or a pod cfnet refuses to place) takes
    from its node: requests, extended resources, host ports, labels and pod (anti-)affinity
    terms, read leniently (a part that does not parse is left out) so that the
    node's usage is counted whatever else the pod says. None: not even a name."""
    if not isinstance(pod, Mapping):
        return None
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(meta, Mapping) and isinstance(spec, Mapping)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    ns = str(meta.get("namespace") or "default")
    parts: dict[str, Any] = {}
    with contextlib.suppress(SpecError):
        parts["requests"], parts["extended"] = split_requests(
            clamped_requests(pod_requests(spec)))
    with contextlib.suppress(SpecError):
        parts["host_ports"] = host_ports(spec)
    with contextlib.suppress(SpecError):
        parts["labels"] = _str_map(meta.get("labels"), "metadata.labels")
    rq = "requiredDuringSchedulingIgnoredDuringExecution"
    # its pod (anti-)affinity terms: required anti-affinity repels newcomers (a filter); the
    # others score them (InterPodAffinity's symmetry, scores.interpod_raw); each read apart
    for part, kind, key, parse in (
            ("pod_anti_affinity", "podAntiAffinity", rq, _pod_terms),
            ("pod_affinity", "podAffinity", rq, _pod_terms),
            ("preferred_pod_affinity", "podAffinity", PREFERRED, _weighted_pod_terms),
            ("preferred_pod_anti_affinity", "podAntiAffinity", PREFERRED,
             _weighted_pod_terms)):
        with contextlib.suppress(SpecError):
            aff = _map(_map(spec.get("affinity"), "a").get(kind), "a")
            parts[part] = parse(aff.get(key), "a")
    return Workload(uid=str(meta.get("uid") or f"{ns}/{name}"), name=name, namespace=ns,
                    **parts)
