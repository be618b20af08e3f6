"""The PodSpec fields a workload spec reads beyond its selector terms: which fields cfnet
honours (any other is refused, :func:`check_supported`), what a pod requests of a node
(:func:`pod_requests`, as kube-scheduler's fit filter sums it) and the host ports it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cloud_core.errors import SpecError

from .model import COUNT_MAX, HostPort, Resources
from .spec_values import as_list, as_map, clip, parse_quantity

GPU = "nvidia.com/gpu"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


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
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1  # spec.priority is an int32


def pod_priority(spec: Mapping[str, Any]) -> int:
    """``spec.priority`` (set by the API server's Priority admission from
    ``priorityClassName``), 0 when absent or not an integer, clamped to int32."""
    p = spec.get("priority")
    if isinstance(p, bool) or not isinstance(p, int):
        return 0
    return min(max(p, PRIORITY_MIN), PRIORITY_MAX)


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
    gates = as_list(spec.get("schedulingGates"), f"{sp}.schedulingGates")
    if gates:
        names = ", ".join(str(as_map(g, f"{sp}.schedulingGates").get("name")) for g in gates)
        raise SpecError(f"{sp}.schedulingGates", f"the pod is gated ({names}); it is "
                        "placed once the gates are removed")
    aff = as_map(spec.get("affinity"), f"{sp}.affinity")
    for k, v in aff.items():
        if k not in AFFINITY_FIELDS:
            raise SpecError(f"{sp}.affinity.{k}", NOT_SUPPORTED)
        for kk, terms in as_map(v, f"{sp}.affinity.{k}").items():
            f = f"{sp}.affinity.{k}.{kk}"
            if kk not in AFFINITY_FIELDS[k]:
                raise SpecError(f, NOT_SUPPORTED)
            if k == "nodeAffinity":
                continue
            for i, t in enumerate(as_list(terms, f)):
                tm = as_map(t, f"{f}[{i}]")
                where = f"{f}[{i}]"
                if kk == PREFERRED:
                    for x in tm:
                        if x not in WEIGHTED_TERM_FIELDS:
                            raise SpecError(f"{where}.{x}", NOT_SUPPORTED)
                    where += ".podAffinityTerm"
                    tm = as_map(tm.get("podAffinityTerm"), where)
                # a preferred term is scored now: a field cfnet cannot honour is refused there
                # too (namespaceSelector, matchLabelKeys), never scored as if absent
                for x in tm:
                    if x not in POD_TERM_FIELDS:
                        raise SpecError(f"{where}.{x}", NOT_SUPPORTED)
    for i, c in enumerate(as_list(spec.get("topologySpreadConstraints"),
                                f"{sp}.topologySpreadConstraints")):
        for x in as_map(c, f"{sp}.topologySpreadConstraints[{i}]"):
            if x not in SPREAD_FIELDS:
                raise SpecError(f"{sp}.topologySpreadConstraints[{i}].{x}", NOT_SUPPORTED)
    for i, v in enumerate(as_list(spec.get("volumes"), f"{sp}.volumes")):
        for x in as_map(v, f"{sp}.volumes[{i}]"):
            if x not in PLAIN_VOLUMES:
                raise SpecError(f"{sp}.volumes[{i}].{x}", NOT_SUPPORTED)
    if "resources" in spec:
        for x in as_map(spec.get("resources"), f"{sp}.resources"):
            if x not in CONTAINER_RESOURCE_FIELDS:
                raise SpecError(f"{sp}.resources.{x}", NOT_SUPPORTED)
    for part in ("containers", "initContainers"):
        for i, c in enumerate(as_list(spec.get(part), f"{sp}.{part}")):
            res = as_map(as_map(c, f"{sp}.{part}[{i}]").get("resources"),
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
    res = as_map(as_map(c, field).get("resources"), f"{field}.resources")
    req = dict(as_map(res.get("limits"), f"{field}.resources.limits"))  # limits default requests
    req.update(as_map(res.get("requests"), f"{field}.resources.requests"))
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
    for i, c in enumerate(as_list(spec.get("containers"), f"{sp}.containers")):
        total = _add(total, _container_requests(c, f"{sp}.containers[{i}]"))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, c in enumerate(as_list(spec.get("initContainers"), f"{sp}.initContainers")):
        f = f"{sp}.initContainers[{i}]"
        req = _container_requests(c, f)
        if as_map(c, f).get("restartPolicy") == "Always":
            sidecars = _add(sidecars, req)
            continue
        for k, v in _add(sidecars, req).items():
            init_peak[k] = max(init_peak.get(k, 0), v)
    total = _add(total, sidecars)
    for k, v in init_peak.items():
        total[k] = max(total.get(k, 0), v)
    pod_level = as_map(spec.get("resources"), f"{sp}.resources")
    if pod_level:
        lvl = dict(as_map(pod_level.get("limits"), f"{sp}.resources.limits"))
        lvl.update(as_map(pod_level.get("requests"), f"{sp}.resources.requests"))
        total.update(_resource_map(lvl, f"{sp}.resources.requests"))
    return _add(total, _resource_map(as_map(spec.get("overhead"), f"{sp}.overhead"),
                                     f"{sp}.overhead"))


def counted_requests(req: Mapping[str, int], sp: str = "spec") -> dict[str, int]:
    """``req`` (a pod's :func:`pod_requests`) if every figure is one cfnet counts; else a
    SpecError naming the resource (the pod is refused, nothing else is affected)."""
    for k, v in req.items():
        if not -COUNT_MAX <= v <= COUNT_MAX:
            raise SpecError(f"{sp}.containers[*].resources.requests.{clip(str(k))}",
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
        for i, c in enumerate(as_list(spec.get(part), f"{sp}.{part}")):
            if part == "initContainers" and (not isinstance(c, Mapping)
                                             or c.get("restartPolicy") != "Always"):
                continue
            for j, p in enumerate(as_list(as_map(c, f"{sp}.{part}[{i}]").get("ports"),
                                        f"{sp}.{part}[{i}].ports")):
                f = f"{sp}.{part}[{i}].ports[{j}]"
                pm = as_map(p, f)
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
