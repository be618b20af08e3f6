"""Workload specs: a Kubernetes Pod (or a controller's pod template) or the same fields as
plain YAML, parsed into ``Workload``. Every error names the field and the reason.

This module reads the document (kind, metadata, replicas) and puts a Workload together; the
rules for each part live beside their bounds: PodSpec fields and requests in
:mod:`.spec_pod`, selector terms in :mod:`.spec_terms`, the ``cfnet.io/`` annotations in
:mod:`.spec_annotations`, quantities and other bounded values in :mod:`.spec_values`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import msgspec
import yaml

from cloud_core.errors import SpecError

from .model import (
    HOSTNAME,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Workload,
)
from .names import ID_MAX, NAME_MAX, uid_problem
from .spec_annotations import ANN, POLICIES, cfnet_fields
from .spec_pod import (
    GPU,
    PREFERRED,
    check_supported,
    clamped_requests,
    counted_requests,
    host_ports,
    parse_resources,
    pod_priority,
    pod_requests,
    split_requests,
)
from .spec_terms import (
    node_terms,
    pod_terms,
    preferred_terms,
    required_terms,
    spread_constraints,
    tolerations,
    weighted_pod_terms,
)
from .spec_values import as_list, as_map, check_name, clip, str_map, whole

SCHEDULER_NAME = "cfnet-scheduler"
CONTROLLERS = ("Deployment", "StatefulSet", "ReplicaSet", "Job", "DaemonSet",
               "ReplicationController")
# The most workloads one document may expand to (replicas), checked before expanding; the
# console's per-request cap (console.registry.MAX_SUBMIT) is the same number.
MAX_EXPAND = 1000


def parse_pod(pod: Mapping[str, Any], uid: str | None = None) -> Workload:
    """A Pod, or a controller (Deployment, ...) whose pod template is used, as a Workload."""
    if not isinstance(pod, Mapping):
        raise SpecError("(root)", "a pod must be a mapping")
    kind = pod.get("kind", "Pod")
    meta = as_map(pod.get("metadata"), "metadata")
    spec = as_map(pod.get("spec"), "spec")
    sp = "spec"
    if kind in CONTROLLERS:
        tmpl = as_map(spec.get("template"), "spec.template")
        tmeta = as_map(tmpl.get("metadata"), "spec.template.metadata")
        meta = {**meta, "labels": tmeta.get("labels", {}),
                "annotations": {**as_map(meta.get("annotations"), "metadata.annotations"),
                                **as_map(tmeta.get("annotations"),
                                       "spec.template.metadata.annotations")}}
        spec = as_map(tmpl.get("spec"), "spec.template.spec")
        sp = "spec.template.spec"
    elif kind != "Pod":
        raise SpecError("kind", f"{kind!r} is not a Pod or a workload controller")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError("metadata.name", "is required")
    check_name(name, "metadata.name", NAME_MAX)
    ns = meta.get("namespace") or "default"
    check_name(ns, "metadata.namespace", ID_MAX)
    sched = spec.get("schedulerName")
    if sched is not None and sched != SCHEDULER_NAME:
        raise SpecError(f"{sp}.schedulerName", f"is {sched!r}, not {SCHEDULER_NAME!r}")
    containers = as_list(spec.get("containers"), f"{sp}.containers")
    if not containers:
        raise SpecError(f"{sp}.containers", "at least one container is required")
    check_supported(spec, sp)
    requests, extended = split_requests(counted_requests(pod_requests(spec, sp), sp))
    ann = str_map(meta.get("annotations"), "metadata.annotations", labels=False)
    policy = ann.get(ANN + "placement-policy")
    if policy is not None and policy not in POLICIES:
        raise SpecError(f"metadata.annotations.{ANN}placement-policy",
                        f"{clip(policy)!r} is not one of {', '.join(POLICIES)}")
    labels = str_map(meta.get("labels"), "metadata.labels")
    aff = as_map(spec.get("affinity"), f"{sp}.affinity")
    na = as_map(aff.get("nodeAffinity"), f"{sp}.affinity.nodeAffinity")
    pa = as_map(aff.get("podAffinity"), f"{sp}.affinity.podAffinity")
    paa = as_map(aff.get("podAntiAffinity"), f"{sp}.affinity.podAntiAffinity")
    rq = "requiredDuringSchedulingIgnoredDuringExecution"
    extras = cfnet_fields(lambda k: ann.get(ANN + k), ANN,
                     lambda k: f"metadata.annotations.{ANN}{k}")
    if "gang" in extras:
        # a gang is a tenant's name: per namespace, so tenant B's "train" is not tenant A's
        # (the engine's and validator's messages then name it as namespace/name)
        extras["gang"] = f"{ns}/{extras['gang']}"
    node_affinity = required_terms(na, f"{sp}.affinity.nodeAffinity.{rq}")
    node_name = spec.get("nodeName")
    if node_name:
        # the API server stores only a DNS subdomain here (ValidateNodeName)
        check_name(node_name, f"{sp}.nodeName", NAME_MAX)
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
        node_selector=str_map(spec.get("nodeSelector"), f"{sp}.nodeSelector"),
        node_affinity=node_affinity,
        priority=pod_priority(spec),
        preferred_node_affinity=preferred_terms(
            na.get(PREFERRED), f"{sp}.affinity.nodeAffinity.{PREFERRED}"),
        tolerations=tolerations(spec.get("tolerations"), f"{sp}.tolerations"),
        pod_affinity=pod_terms(pa.get(rq), f"{sp}.affinity.podAffinity.{rq}"),
        pod_anti_affinity=pod_terms(paa.get(rq), f"{sp}.affinity.podAntiAffinity.{rq}"),
        preferred_pod_affinity=weighted_pod_terms(
            pa.get(PREFERRED), f"{sp}.affinity.podAffinity.{PREFERRED}"),
        preferred_pod_anti_affinity=weighted_pod_terms(
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
        check_name(name, "metadata.name", NAME_MAX)
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
    check_name(name, f"{where}name", NAME_MAX)
    ns = doc.get("namespace") or "default"
    check_name(ns, f"{where}namespace", ID_MAX)
    req = as_map(doc.get("requests"), f"{where}requests")
    for k in req:
        if k not in ("cpu", "memory", GPU):
            raise SpecError(f"{where}requests.{k}",
                            "unknown resource (cpu, memory, nvidia.com/gpu)")
    res = parse_resources(req, f"{where}requests")
    replicas = _replicas(doc.get("replicas", 1), f"{where}replicas", name)
    extras = cfnet_fields(lambda k: doc.get(_CAMEL[k]), "", lambda k: f"{where}{_CAMEL[k]}")
    base = Workload(
        uid="", name=name, namespace=ns, requests=res,
        node_selector=str_map(doc.get("nodeSelector"), f"{where}nodeSelector"),
        node_affinity=node_terms(doc.get("nodeAffinity"), f"{where}nodeAffinity"),
        preferred_node_affinity=preferred_terms(doc.get("preferredNodeAffinity"),
                                                 f"{where}preferredNodeAffinity"),
        tolerations=tolerations(doc.get("tolerations"), f"{where}tolerations"),
        pod_affinity=pod_terms(doc.get("podAffinity"), f"{where}podAffinity"),
        pod_anti_affinity=pod_terms(doc.get("podAntiAffinity"), f"{where}podAntiAffinity"),
        preferred_pod_affinity=weighted_pod_terms(doc.get("preferredPodAffinity"),
                                                   f"{where}preferredPodAffinity"),
        preferred_pod_anti_affinity=weighted_pod_terms(doc.get("preferredPodAntiAffinity"),
                                                        f"{where}preferredPodAntiAffinity"),
        labels=str_map(doc.get("labels"), f"{where}labels"), **extras)
    uid = doc.get("uid") or f"{ns}/{name}"
    if why := uid_problem(uid):
        raise SpecError(f"{where}uid", why)
    if replicas == 1 and "replicas" not in doc:
        return [_with(base, uid, name)]
    return [_with(base, f"{uid}-{i}", f"{name}-{i}") for i in range(replicas)]


def _replicas(v: Any, field: str, name: str) -> int:
    """A replica count, bounded before anything is expanded: ``replicas: 1000000`` must be
    refused by looking at one number, not after building a million workloads."""
    n = whole(v, field)
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
        parts["labels"] = str_map(meta.get("labels"), "metadata.labels")
    rq = "requiredDuringSchedulingIgnoredDuringExecution"
    # its pod (anti-)affinity terms: required anti-affinity repels newcomers (a filter); the
    # others score them (InterPodAffinity's symmetry, scores.interpod_raw); each read apart
    for part, kind, key, parse in (
            ("pod_anti_affinity", "podAntiAffinity", rq, pod_terms),
            ("pod_affinity", "podAffinity", rq, pod_terms),
            ("preferred_pod_affinity", "podAffinity", PREFERRED, weighted_pod_terms),
            ("preferred_pod_anti_affinity", "podAntiAffinity", PREFERRED,
             weighted_pod_terms)):
        with contextlib.suppress(SpecError):
            aff = as_map(as_map(spec.get("affinity"), "a").get(kind), "a")
            parts[part] = parse(aff.get(key), "a")
    return Workload(uid=str(meta.get("uid") or f"{ns}/{name}"), name=name, namespace=ns,
                    priority=pod_priority(spec), **parts)
