"""Frozen input model of the placement engine: nodes, links, running pods and workloads.

The core's state module builds a ``ClusterSnapshot``; nothing here does I/O or reads a clock.
Everything is hashable so that equal constraints can be grouped into equivalence classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from cloud_core.errors import PlacementError

# The most of one resource cfnet counts: per pod (a pod's summed requests), per node
# (capacity, and the summed requests of its pods). The engine keeps resources in int64
# arrays; with every figure at most 2^50 (1 PiB of memory, 2^40 cores in millicores) no sum
# or difference it forms can overflow. A pod of cfnet's that asks for more is refused (a
# SpecError naming the field); a pod of another scheduler that does is counted as this
# much, so its node is full, and nothing else is affected (docs/placement.md, "Bounds").
COUNT_MAX = 2**50


def bounded(v: int) -> int:
    """``v`` clamped to [-COUNT_MAX, COUNT_MAX] (a figure that cannot be counted)."""
    return COUNT_MAX if v > COUNT_MAX else -COUNT_MAX if v < -COUNT_MAX else v


def bounded_resources(r: Resources) -> Resources:
    """``r`` with each figure clamped by :func:`bounded` (``r`` itself when already)."""
    if all(-COUNT_MAX <= v <= COUNT_MAX for v in (r.cpu_milli, r.mem_bytes, r.gpus)):
        return r
    return Resources(bounded(r.cpu_milli), bounded(r.mem_bytes), bounded(r.gpus))


class Health(StrEnum):
    """A node's health: the one enum of the core (the health tracker, the Node registry, the
    decision loop and the engine). Only ``ONLINE`` nodes take new work."""

    ONLINE = "online"
    SUSPECT = "suspect"
    UNREACHABLE = "unreachable"  # partitioned: peers still see it, the core does not
    DOWN = "down"  # crashed: nobody sees it
    CORDONED = "cordoned"  # an operator's cordon: alive, takes no new work
    UNKNOWN = "unknown"  # never reported (the tracker's answer; the engine counts it as down)


def frozen_map(m: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """A read-only, hashable view of a label map (``EMPTY`` when there is none)."""
    return FrozenLabels(m) if m else EMPTY


def _freeze(obj: object, name: str) -> None:
    v = getattr(obj, name)
    if not isinstance(v, FrozenLabels):
        object.__setattr__(obj, name, FrozenLabels(v) if v else EMPTY)


def frozen_counts(m: Mapping[str, int] | None = None) -> Mapping[str, int]:
    """A read-only, hashable view of resource counts by name (``EMPTY`` when none)."""
    return FrozenLabels(m) if m else EMPTY


def _freeze_counts(obj: object, name: str) -> None:
    _freeze(obj, name)


class FrozenLabels(Mapping[str, Any]):
    """An immutable, hashable mapping of labels (or of resource counts: dataclasses need
    hashable fields)."""

    __slots__ = ("_d", "_h")

    def __init__(self, d: Mapping[str, Any]) -> None:
        self._d = MappingProxyType(dict(d))
        self._h = hash(frozenset(self._d.items()))

    def __getitem__(self, k: str) -> Any:
        return self._d[k]

    # The Mapping mixins are Python-level (get() is a try/except around __getitem__); the
    # placement filters and the validator call these per pod and node: delegate to the dict.
    def get(self, k: str, default: Any = None) -> Any:
        return self._d.get(k, default)

    def __contains__(self, k: object) -> bool:
        return k in self._d

    def keys(self) -> Any:
        return self._d.keys()

    def items(self) -> Any:
        return self._d.items()

    def values(self) -> Any:
        return self._d.values()

    def __iter__(self) -> Any:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        return self._h

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenLabels):
            return self._h == other._h and self._d == other._d
        if isinstance(other, Mapping):
            return dict(self._d) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"{dict(self._d)!r}"


# The one empty mapping the constructors here give (most pods have no extended resources):
# ``x is EMPTY`` is answered in C, where ``bool(x)`` calls ``__len__`` in Python (per
# running pod, every step: ``sequential.NodeUsage``). Another empty FrozenLabels is still
# empty; only the shortcut is lost.
EMPTY = FrozenLabels({})


@dataclass(frozen=True, slots=True)
class Resources:
    """Requests, capacity or allocation: millicores, bytes of memory, whole GPUs."""

    cpu_milli: int = 0
    mem_bytes: int = 0
    gpus: int = 0

    def __add__(self, o: Resources) -> Resources:
        return Resources(self.cpu_milli + o.cpu_milli, self.mem_bytes + o.mem_bytes,
                         self.gpus + o.gpus)

    def __sub__(self, o: Resources) -> Resources:
        return Resources(self.cpu_milli - o.cpu_milli, self.mem_bytes - o.mem_bytes,
                         self.gpus - o.gpus)

    def fits_in(self, free: Resources) -> bool:
        return (self.cpu_milli <= free.cpu_milli and self.mem_bytes <= free.mem_bytes
                and self.gpus <= free.gpus)


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint; effects ``NoSchedule`` and ``NoExecute`` repel, ``PreferNoSchedule`` not."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod toleration (Kubernetes semantics: empty key with Exists tolerates everything)."""

    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty: every effect


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    """One ``matchExpressions`` entry: In, NotIn, Exists, DoesNotExist, Gt, Lt."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Requirements ANDed; a workload's terms are ORed (Kubernetes semantics)."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A pod label selector: ``match_labels`` and ``match_expressions`` ANDed."""

    match_labels: Mapping[str, str] = field(default_factory=frozen_map)
    match_expressions: tuple[NodeSelectorRequirement, ...] = ()

    def __post_init__(self) -> None:
        _freeze(self, "match_labels")


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """Required pod (anti-)affinity: pods matching ``selector`` in the same ``topology_key``
    domain (``kubernetes.io/hostname``, ``topology.kubernetes.io/zone`` or ``.../region``).
    ``namespaces`` empty means the workload's own namespace."""

    selector: LabelSelector
    topology_key: str = "kubernetes.io/hostname"
    namespaces: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """A ``topologySpreadConstraints`` entry (Kubernetes semantics, see ``sequential.py``).

    ``hard``: ``whenUnsatisfiable: DoNotSchedule`` (a filter); else ``ScheduleAnyway`` (a
    cost). ``selector`` already carries the pod's ``matchLabelKeys`` values. Policies:
    ``honor_affinity`` (nodeAffinityPolicy Honor, the default) counts only domains of nodes
    that pass the pod's nodeSelector/required node affinity; ``honor_taints``
    (nodeTaintsPolicy Honor; default Ignore) also drops nodes with untolerated taints."""

    max_skew: int
    topology_key: str
    hard: bool
    selector: LabelSelector
    min_domains: int | None = None
    honor_affinity: bool = True
    honor_taints: bool = False


@dataclass(frozen=True, slots=True)
class HostPort:
    """A container's ``hostPort`` (hostIP ``0.0.0.0`` conflicts with every address)."""

    port: int
    protocol: str = "TCP"
    host_ip: str = "0.0.0.0"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as the core's registry and the latest telemetry describe it."""

    name: str
    region: str
    zone: str
    security_level: int = 0
    labels: Mapping[str, str] = field(default_factory=frozen_map)
    taints: tuple[Taint, ...] = ()
    capacity: Resources = Resources()
    allocated: Resources = Resources()
    health: Health = Health.ONLINE
    price_per_hour: float = 0.0  # whole node; a pod pays its dominant share
    energy_price_per_kwh: float = 0.0
    carbon_g_per_kwh: float = 0.0
    idle_watts: float = 0.0
    max_watts: float = 0.0
    # status.allocatable["pods"] (None: no limit known) and other allocatable resources
    # (extended resources, ephemeral-storage, hugepages-*) by name, in whole units/bytes.
    max_pods: int | None = None
    extended: Mapping[str, int] = field(default_factory=frozen_counts)

    def __post_init__(self) -> None:
        _freeze(self, "labels")
        _freeze_counts(self, "extended")

    @property
    def free(self) -> Resources:
        return self.capacity - self.allocated


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """Measured link from one node to another; ``age_s`` is how old the figure is."""

    rtt_p50_ms: float
    rtt_p95_ms: float
    loss: float = 0.0
    tx_bps: float = 0.0
    age_s: float = 0.0
    samples: int = 0  # RTT samples behind the figures (0: not known)


@dataclass(frozen=True, slots=True)
class RunningPod:
    """A pod already bound to a node (counts for pod (anti-)affinity)."""

    uid: str
    name: str
    namespace: str
    node: str
    labels: Mapping[str, str] = field(default_factory=frozen_map)
    requests: Resources = Resources()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    extended: Mapping[str, int] = field(default_factory=frozen_counts)
    # being deleted (metadata.deletionTimestamp): still holds its resources and host ports,
    # but topology spread does not count it (PodTopologySpread skips terminating pods)
    terminating: bool = False
    # Its own pod affinity terms, for InterPodAffinity's symmetric score (scores.py): a
    # newcomer its required affinity selects scores ``hard_pod_affinity_weight`` in its
    # domain, one its preferred (anti-)affinity selects +/- the term's weight.
    affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_affinity: tuple[tuple[int, PodAffinityTerm], ...] = ()
    preferred_anti_affinity: tuple[tuple[int, PodAffinityTerm], ...] = ()
    # spec.priority: a pending pod of higher priority may have it evicted (relax/preempt.py)
    priority: int = 0

    def __post_init__(self) -> None:
        _freeze(self, "labels")
        _freeze_counts(self, "extended")

    @classmethod
    def of(cls, w: Workload | None, node: str, *, uid: str | None = None,
           name: str | None = None, namespace: str | None = None,
           labels: Mapping[str, str] | None = None, terminating: bool = False) -> RunningPod:
        """Workload ``w`` running on ``node``: the one constructor the core uses, so every
        running pod carries all that the engine checks against a node (requests,
        anti-affinity, host ports, extended resources). ``uid``/``name``/``namespace``/
        ``labels`` override ``w``'s (a Kubernetes pod's own metadata); ``w`` None is a pod
        whose spec could not be read, counted as taking nothing. ``terminating``: the pod has
        a deletionTimestamp (it holds its room, but topology spread does not count it)."""
        if w is None:
            return cls(uid=uid or "", name=name or "", namespace=namespace or "default",
                       node=node, labels=labels or {}, terminating=terminating)
        return cls(uid=w.uid if uid is None else uid, name=w.name if name is None else name,
                   namespace=w.namespace if namespace is None else namespace, node=node,
                   labels=w.labels if labels is None else labels, requests=w.requests,
                   anti_affinity=w.pod_anti_affinity, host_ports=w.host_ports,
                   extended=w.extended, terminating=terminating, affinity=w.pod_affinity,
                   preferred_affinity=w.preferred_pod_affinity,
                   preferred_anti_affinity=w.preferred_pod_anti_affinity,
                   priority=w.priority)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Everything the engine may look at, frozen at ``now`` (UNIX seconds)."""

    nodes: tuple[NodeInfo, ...]
    links: Mapping[tuple[str, str], LinkInfo]
    now: float = 0.0
    pods: tuple[RunningPod, ...] = ()

    def __hash__(self) -> int:  # links is a plain mapping; identity is enough for caches
        return id(self)


@dataclass(frozen=True, slots=True)
class Workload:
    """A workload to place (one pod). Hard constraints and cost inputs, from ``spec.py``."""

    uid: str
    name: str
    namespace: str = "default"
    requests: Resources = Resources()
    node_selector: Mapping[str, str] = field(default_factory=frozen_map)
    node_affinity: tuple[NodeSelectorTerm, ...] = ()
    # Soft node affinity: (weight 1..100, term) pairs; a cost, never a filter (scores.py).
    preferred_node_affinity: tuple[tuple[int, NodeSelectorTerm], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    # Soft pod (anti-)affinity: (weight 1..100, term) pairs; InterPodAffinity's score, a cost
    # (scores.interpod_raw), never a filter.
    preferred_pod_affinity: tuple[tuple[int, PodAffinityTerm], ...] = ()
    preferred_pod_anti_affinity: tuple[tuple[int, PodAffinityTerm], ...] = ()
    max_latency_ms: float | None = None
    latency_to: str | None = None
    residency: frozenset[str] = frozenset()
    min_security_level: int = 0
    data_name: str | None = None
    data_gb: float = 0.0
    data_location: str | None = None
    cost_weight: float = 1.0
    labels: Mapping[str, str] = field(default_factory=frozen_map)
    gang: str | None = None
    # Constraints placed pod by pod (sequential.py): spread, host ports, extended resources.
    spread: tuple[SpreadConstraint, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    extended: Mapping[str, int] = field(default_factory=frozen_counts)
    # Scoring policy of this workload ("cost", "spread"; None: the engine's default).
    policy: str | None = None
    # spec.priority (the API server's admission resolves priorityClassName into it): no part
    # in where a pod goes; which running pods it may ask to evict (preempt.py)
    priority: int = 0

    def __post_init__(self) -> None:
        # Callers may hand in plain dicts; freeze them so workloads stay hashable.
        _freeze(self, "node_selector")
        _freeze(self, "labels")
        _freeze_counts(self, "extended")
        if self.preferred_node_affinity:
            check_preferences(self.preferred_node_affinity)
        for name in ("preferred_pod_affinity", "preferred_pod_anti_affinity"):
            if getattr(self, name):
                check_preferences(getattr(self, name), name, PodAffinityTerm)


def check_preferences(prefs: tuple[tuple[int, Any], ...],
                      name: str = "preferred_node_affinity",
                      kind: type = NodeSelectorTerm) -> None:
    """Weights are whole numbers in 1..100 (Kubernetes): the affinity cost divides by their
    sum, so a zero, negative or non-numeric weight must be refused here, not crash a solve."""
    if not isinstance(prefs, tuple):
        raise PlacementError(f"{name} must be a tuple, got {prefs!r}")
    for i, p in enumerate(prefs):
        if not (isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], kind)):
            raise PlacementError(f"{name}[{i}] must be a (weight, "
                                 f"{kind.__name__}) pair, got {p!r}")
        w = p[0]
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 100:
            raise PlacementError(f"{name}[{i}] weight must be an integer "
                                 f"from 1 to 100, got {w!r}")


HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
SECURITY_LABEL = "cfnet.io/security-level"


def node_label(node: NodeInfo, key: str) -> str | None:
    """A node label (None: the node does not have it), with the topology facts the
    registry owns filled in (not agent-set). Absent is not empty: a node without a zone
    (edge nodes often have none) answers ``Exists`` false, ``DoesNotExist`` true, and a
    nodeSelector ``zone: ""`` false, as Kubernetes' label matching does. A label the node
    carries (Kubernetes mode: the Node's own labels) wins over the registry's field."""
    if key == HOSTNAME:
        return node.name
    v = node.labels.get(key)
    if v is not None:
        return v
    if key == ZONE:
        return node.zone or None
    if key == REGION:
        return node.region or None
    if key == SECURITY_LABEL:
        # the level field is 0 both when unset and when set to 0; only a level above 0 (or
        # the label itself, above) says the node has the label
        return str(node.security_level) if node.security_level else None
    return None


def topology_domain(node: NodeInfo, key: str) -> str | None:
    """The domain of ``node`` under a topology key (None: node lacks the key)."""
    return node_label(node, key)
