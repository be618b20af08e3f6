"""Workload specs: a Kubernetes Pod (or a controller's pod template) or the same fields as
plain YAML, parsed into ``Workload``. Every error names the field and the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from cloud_core.errors import SpecError
from edge_agent.names import (
    ID_MAX,
    NAME_MAX,
    label_key_problem,
    label_value_problem,
    name_problem,
    uid_problem,
)

from . import quantity
from .model import (
    HOSTNAME,
    LabelSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Resources,
    Toleration,
    Workload,
)

SCHEDULER_NAME = "cfnet-scheduler"
GPU = "nvidia.com/gpu"
CONTROLLERS = ("Deployment", "StatefulSet", "ReplicaSet", "Job", "DaemonSet",
               "ReplicationController")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
# The most workloads one document may expand to (replicas), checked before expanding; the
# console's per-request cap (commands.MAX_SUBMIT) is the same number.
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
        w = tm.get("weight")
        if w is None:
            raise SpecError(f"{f}.weight", "is required")
        # no strings or floats: Kubernetes' weight is an int32, and "50" is a typo to report
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 100:
            raise SpecError(f"{f}.weight", f"{w!r} must be an integer from 1 to 100")
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


def _pod_terms(obj: Any, field: str) -> tuple[PodAffinityTerm, ...]:
    out = []
    for i, t in enumerate(_list(obj, field)):
        f = f"{field}[{i}]"
        tm = _map(t, f)
        key = tm.get("topologyKey")
        if not isinstance(key, str) or not key:
            raise SpecError(f"{f}.topologyKey", "is required")
        if "labelSelector" not in tm:
            raise SpecError(f"{f}.labelSelector", "is required")
        ns = tuple(str(x) for x in _list(tm.get("namespaces"), f"{f}.namespaces"))
        out.append(PodAffinityTerm(_selector(tm["labelSelector"], f"{f}.labelSelector"), key, ns))
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


def _requests(containers: Sequence[Any], field: str) -> Resources:
    total = Resources()
    for i, c in enumerate(containers):
        f = f"{field}[{i}].resources"
        res = _map(_map(c, f"{field}[{i}]").get("resources"), f)
        req = dict(_map(res.get("limits"), f"{f}.limits"))  # limits default the requests
        req.update(_map(res.get("requests"), f"{f}.requests"))
        total = total + parse_resources(req, f"{f}.requests")
    return total


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
    ann = _str_map(meta.get("annotations"), "metadata.annotations", labels=False)
    aff = _map(spec.get("affinity"), f"{sp}.affinity")
    na = _map(aff.get("nodeAffinity"), f"{sp}.affinity.nodeAffinity")
    pa = _map(aff.get("podAffinity"), f"{sp}.affinity.podAffinity")
    paa = _map(aff.get("podAntiAffinity"), f"{sp}.affinity.podAntiAffinity")
    rq = "requiredDuringSchedulingIgnoredDuringExecution"
    extras = _extras(lambda k: ann.get(ANN + k), ANN,
                     lambda k: f"metadata.annotations.{ANN}{k}")
    return Workload(
        uid=uid or str(meta.get("uid") or f"{ns}/{name}"),
        name=name,
        namespace=ns,
        requests=_requests(containers, f"{sp}.containers"),
        node_selector=_str_map(spec.get("nodeSelector"), f"{sp}.nodeSelector"),
        node_affinity=_required_terms(na, f"{sp}.affinity.nodeAffinity.{rq}"),
        preferred_node_affinity=_preferred_terms(
            na.get(PREFERRED), f"{sp}.affinity.nodeAffinity.{PREFERRED}"),
        tolerations=_tolerations(spec.get("tolerations"), f"{sp}.tolerations"),
        pod_affinity=_pod_terms(pa.get(rq), f"{sp}.affinity.podAffinity.{rq}"),
        pod_anti_affinity=_pod_terms(paa.get(rq), f"{sp}.affinity.podAntiAffinity.{rq}"),
        labels=_str_map(meta.get("labels"), "metadata.labels"),
        **extras,
    )


_PLAIN_KEYS = {"name", "namespace", "uid", "replicas", "requests", "nodeSelector", "nodeAffinity",
               "preferredNodeAffinity", "tolerations", "podAffinity", "podAntiAffinity",
               "labels", "maxLatencyMs", "latencyTo", "residency", "minSecurityLevel", "data",
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
        labels=_str_map(doc.get("labels"), f"{where}labels"), **extras)
    uid = doc.get("uid") or f"{ns}/{name}"
    if why := uid_problem(uid):
        raise SpecError(f"{where}uid", why)
    if replicas == 1 and "replicas" not in doc:
        return [_with(base, uid, name)]
    return [_with(base, f"{uid}-{i}", f"{name}-{i}") for i in range(replicas)]


def _check_name(value: object, field: str, max_len: int) -> None:
    """The one name rule (``edge_agent.names``) for every name a workload carries."""
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
