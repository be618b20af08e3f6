"""Node registry built from the cluster's Node objects (never from what an agent says).

The facts that decide security come only from labels a node cannot set on itself. A kubelet
may write any label on its own Node except those that the NodeRestriction admission plugin
reserves (``node-restriction.kubernetes.io/`` and its subdomains) and the
``kubernetes.io``/``k8s.io`` ones outside the kubelet's own set (``IsKubeletLabel``:
``topology.kubernetes.io/region`` and ``zone`` ARE in that set). So:

* the security level is ``node-restriction.kubernetes.io/cfnet-security-level``;
* the region that residency checks is ``node-restriction.kubernetes.io/cfnet-region``;
* the agent id (MQTT node id -> Node) is ``node-restriction.kubernetes.io/cfnet-agent-id``
  (default: the Node's name, which a kubelet cannot choose for another node).

The older ``cfnet.io/security-level`` and ``cfnet.io/agent-id`` are not read at all: a node
can write them, so honouring them, even as a fallback, is the weakness itself (a node labels
itself level 5 and receives the level-4 pods). A node that carries one is named once in a
Warning event (``on_problems``) with the protected key to set instead. The topology labels
(``topology.kubernetes.io/region``, ``zone``) stay what topology spread and affinity read, as
in kube-scheduler: steering by them is what a pod's own selector asks for.

A node is a KubeEdge edge node when it carries ``node-role.kubernetes.io/edge`` (its NodeGroup
is the ``apps.kubeedge.io/belonging-to`` label), an OpenYurt node when it carries
``apps.openyurt.io/nodepool`` (the pool name). KubeEdge's edge taint is kept or dropped as
configured.

``upsert`` reports changes of the facts that decide residency and security so the actuator
can check the pods already running there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from cloud_core.errors import CoreError, SpecError
from cloud_core.placement.model import (
    Health,
    NodeInfo,
    Resources,
    Taint,
    bounded,
    bounded_resources,
    frozen_counts,
    frozen_map,
)
from cloud_core.placement.spec_pod import GPU, parse_resources, pod_requests, split_requests

REGION = "topology.kubernetes.io/region"
ZONE = "topology.kubernetes.io/zone"
# NodeRestriction forbids a kubelet to set labels in this namespace (or a subdomain of it) on
# create and on update (plugin/pkg/admission/noderestriction, getForbiddenLabels)
PROTECTED_PREFIX = "node-restriction.kubernetes.io/"
SECURITY = PROTECTED_PREFIX + "cfnet-security-level"
RESIDENCY_REGION = PROTECTED_PREFIX + "cfnet-region"
AGENT_ID = PROTECTED_PREFIX + "cfnet-agent-id"
# node-writable keys cfnet once read, and what replaces each (never read now)
LEGACY = {"cfnet.io/security-level": SECURITY, "cfnet.io/agent-id": AGENT_ID}
KUBEEDGE_EDGE = "node-role.kubernetes.io/edge"
OPENYURT_POOL = "apps.openyurt.io/nodepool"
KUBEEDGE_GROUP = "apps.kubeedge.io/belonging-to"
WATCHED_FACTS = (RESIDENCY_REGION, SECURITY, REGION, ZONE)
CFNET_PREFIX = "cfnet.io/"
# a label problem is logged once per cause (``say_problems``) with the count of nodes that
# have it and the first few of their names: 5,000 nodes with an old label are one line
PROBLEM_NODES_NAMED = 5
log = logging.getLogger(__name__)

def node_protected(key: str) -> bool:
    """Whether NodeRestriction keeps a kubelet from setting label ``key`` on its own Node:
    its prefix is ``node-restriction.kubernetes.io`` or a subdomain of it (upstream's
    ``namespace == LabelNamespaceNodeRestriction || HasSuffix(namespace, "."+...)``)."""
    ns = key.split("/", 1)[0] if "/" in key else ""
    base = PROTECTED_PREFIX.rstrip("/")
    return ns == base or ns.endswith("." + base)


def resources_of(d: Mapping[str, Any] | None) -> Resources:
    """``status.allocatable``-style map → ``Resources``, with the engine's own quantity
    parser (raises SpecError on a malformed quantity)."""
    return parse_resources(d or {}, "status.allocatable")


@dataclass(frozen=True)
class RegistryConfig:
    """How Node objects are read.

    ``edge_taint``: ``"respect"`` keeps KubeEdge's ``node-role.kubernetes.io/edge`` taint (pods
    need a toleration), ``"ignore"`` drops it (every cfnet pod may land on edge nodes).
    """

    edge_taint: str = "respect"
    agent_id_label: str = AGENT_ID
    kubeedge_group_label: str = KUBEEDGE_GROUP
    openyurt_pool_label: str = OPENYURT_POOL

    def __post_init__(self) -> None:
        if self.edge_taint not in ("respect", "ignore"):
            raise CoreError(f"edge_taint {self.edge_taint!r}: must be 'respect' or 'ignore'")
        if not node_protected(self.agent_id_label):
            # the agent id decides whose measured links a node gets: a key the node could
            # set would let it take another agent's identity
            raise CoreError(f"agent_id_label {self.agent_id_label!r}: must be a label a node "
                            f"cannot set on itself ({PROTECTED_PREFIX}...)")


def label_problems(labels: Mapping[str, str], cfg: RegistryConfig) -> list[str]:
    """What is wrong with a Node's cfnet labels, each naming the label: a node-writable key
    cfnet no longer reads (``LEGACY``: ignored, the protected key to set is named), a
    ``cfnet.io/`` key cfnet does not read (a typo such as ``cfnet.io/security_level`` would
    leave the node at level 0 without a word), a security level that is not a number, a
    topology region that disagrees with the protected one residency reads."""
    known = {cfg.kubeedge_group_label, cfg.openyurt_pool_label}
    out = []
    for k in sorted(labels):
        if k in LEGACY:
            out.append(f"label {k!r} ignored: a node can set it on itself; cfnet reads "
                       f"{LEGACY[k]!r}, which only an administrator can set")
        elif k.startswith(CFNET_PREFIX) and k not in known:
            out.append(f"unknown label {k!r} (cfnet reads {SECURITY!r}, "
                       f"{RESIDENCY_REGION!r}, {cfg.agent_id_label!r})")
    lvl = labels.get(SECURITY)
    if lvl is not None and not lvl.strip().lstrip("-").isdigit():
        out.append(f"label {SECURITY!r}: {lvl!r} is not a number (counted as 0)")
    topo, res = labels.get(REGION), labels.get(RESIDENCY_REGION)
    if topo is not None and res is not None and topo != res:
        out.append(f"label {REGION!r} is {topo!r} but {RESIDENCY_REGION!r} is {res!r}: "
                   "residency reads the latter")
    return out


@dataclass(frozen=True)
class NodeRecord:
    """What the registry knows about one Node."""

    name: str
    agent_id: str
    region: str
    zone: str
    security_level: int
    flavour: str  # "kubeedge" | "openyurt" | "cloud"
    pool: str | None  # OpenYurt NodePool or KubeEdge NodeGroup
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    capacity: Resources = field(default_factory=Resources)
    health: Health = Health.ONLINE
    max_pods: int | None = None  # allocatable "pods"
    extended: Mapping[str, int] = field(default_factory=dict)  # other allocatable resources


@dataclass(frozen=True)
class LabelChange:
    """A residency/security fact of a node changed (``old`` None: it was absent)."""

    node: str
    key: str
    old: str | None
    new: str | None


def record_of(node: Mapping[str, Any], cfg: RegistryConfig) -> NodeRecord:
    """Read one Node object."""
    md = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels: dict[str, str] = dict(md.get("labels") or {})
    name = str(md["name"])
    if KUBEEDGE_EDGE in labels:
        flavour, pool = "kubeedge", labels.get(cfg.kubeedge_group_label)
    elif cfg.openyurt_pool_label in labels:
        flavour, pool = "openyurt", labels.get(cfg.openyurt_pool_label)
    else:
        flavour, pool = "cloud", None
    taints = tuple(Taint(str(t.get("key", "")), str(t.get("value", "") or ""),
                         str(t.get("effect", "NoSchedule")))
                   for t in spec.get("taints") or [])
    if flavour == "kubeedge" and cfg.edge_taint == "ignore":
        taints = tuple(t for t in taints if t.key != KUBEEDGE_EDGE)
    try:
        level = int(labels.get(SECURITY, "0"))
    except ValueError:
        level = 0  # a malformed level counts as the lowest, never the highest
    ready = "Unknown"
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            ready = str(c.get("status"))
    if spec.get("unschedulable"):
        health = Health.CORDONED
    elif ready == "True" or not status.get("conditions"):
        health = Health.ONLINE
    else:
        # An edge node that lost the cloud keeps its pods (autonomy): unreachable, not down.
        health = Health.UNREACHABLE if flavour != "cloud" else Health.DOWN
    alloc = status.get("allocatable") or status.get("capacity") or {}
    capacity, max_pods, extended = allocatable_of(alloc)
    # region: the protected label only (a kubelet may set topology.kubernetes.io/region on
    # itself, so it never decides residency); absent, no residency list admits the node
    return NodeRecord(name=name, agent_id=labels.get(cfg.agent_id_label, name),
                      region=labels.get(RESIDENCY_REGION, ""), zone=labels.get(ZONE, ""),
                      security_level=level, flavour=flavour, pool=pool, labels=labels,
                      taints=taints, capacity=capacity, health=health, max_pods=max_pods,
                      extended=extended)


# Parsed allocatable maps by their items: a cluster's nodes share a few shapes (a node pool
# is one machine type), and parsing the quantities was most of a listed Node's CPU (5,000
# Nodes at start-up: 0.37 -> 0.2 CPU-s, tests/unit/test_k8s_registry_memo.py). Bounded: a
# map seen past ALLOC_MEMO_MAX distinct ones is parsed, not kept (all of them are dropped
# once full, so a burst of odd nodes cannot pin memory, and the common shapes come back).
ALLOC_MEMO_MAX = 256
_alloc_memo: dict[tuple[tuple[Any, Any], ...], tuple[Resources, int | None, Mapping[str, int]]]
_alloc_memo = {}
_alloc_lock = threading.Lock()


def allocatable_of(alloc: Mapping[str, Any]
                   ) -> tuple[Resources, int | None, Mapping[str, int]]:
    """A Node's ``allocatable`` (or ``capacity``) map as its capacity, ``pods`` and other
    resources (``other_allocatable``), parsed once per distinct map (``_alloc_memo``). The
    extended map handed out is shared: the registry never changes it (``NodeInfo`` takes a
    frozen copy)."""
    key: tuple[tuple[Any, Any], ...] | None = tuple(alloc.items())
    # quantities are strings in the API; anything else (a number, a list, a map: 1 and True
    # would share a key) is parsed every time, never kept
    if all(type(k) is str and type(v) is str for k, v in key):  # type: ignore[union-attr]
        hit = _alloc_memo.get(key)  # type: ignore[arg-type]
        if hit is not None:
            return hit
    else:
        key = None
    try:
        capacity = bounded_resources(resources_of(alloc))
    except SpecError:
        capacity = Resources()
    max_pods, extended = other_allocatable(alloc)
    out = (capacity, max_pods, extended)
    if key is not None:
        with _alloc_lock:
            if len(_alloc_memo) >= ALLOC_MEMO_MAX:
                _alloc_memo.clear()
            _alloc_memo[key] = out
    return out


def other_allocatable(alloc: Mapping[str, Any]) -> tuple[int | None, dict[str, int]]:
    """``pods`` and every allocatable resource besides cpu, memory and GPUs (extended
    resources, ephemeral-storage, hugepages-*). A malformed figure counts as 0: the node
    then takes no pod that needs it, never more than it has."""
    max_pods: int | None = None
    extended: dict[str, int] = {}
    for k, v in alloc.items():
        if k in ("cpu", "memory", GPU):
            continue
        try:
            n = split_requests(pod_requests({"containers": [
                {"resources": {"requests": {k: v}}}]}))[1].get(k, 0)
        except SpecError:
            n = 0
        n = bounded(n)  # a figure past what cfnet counts is that much (model.COUNT_MAX)
        if k == "pods":
            max_pods = n
        else:
            extended[str(k)] = n
    return max_pods, extended


class NodeRegistry:
    """Thread-safe map of Node name → ``NodeRecord`` with agent-id lookups."""

    def __init__(self, config: RegistryConfig = RegistryConfig()) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeRecord] = {}
        # Pool membership read from the frameworks' own objects (OpenYurt NodePool status,
        # KubeEdge NodeGroup spec): (flavour, pool) -> explicit node names / label selector.
        self._pool_objects: dict[tuple[str, str], tuple[frozenset[str], dict[str, str]]] = {}
        # node_infos() runs once per scheduling step over every node: a node whose record and
        # allocation did not change since the last step keeps its NodeInfo (building 5,000 of
        # them per step was a tenth of the scheduler's CPU at 5,000 nodes).
        self._infos: dict[str, tuple[NodeRecord, Resources, NodeInfo]] = {}
        # node -> the label problems last reported for it (logged when they change)
        self.label_problems: dict[str, tuple[str, ...]] = {}
        # problem -> (how many nodes, the first few names): not logged yet (say_problems)
        self._unsaid: dict[str, tuple[int, list[str]]] = {}
        self._order: list[str] | None = None  # node names, sorted; None: rebuild
        # bumped when a Node is added, removed or changes what the registry reads of it (a
        # status update that changes nothing of it does not): the loop's source prepares the
        # cluster afresh only then (placement.carry)
        self.version = 0
        self._agent_names: tuple[int, Mapping[str, str]] | None = None  # (version, names)
        # called (outside the lock) with the Node and its problems when they change and are
        # not empty: the core writes them as a Warning event on the Node (wiring)
        self.on_problems: Callable[[Mapping[str, Any], tuple[str, ...]], None] | None = None

    def set_pool_object(self, flavour: str, pool: str, nodes: list[str] | None,
                        match_labels: Mapping[str, str] | None = None) -> None:
        """Record a NodePool (``flavour`` "openyurt") or NodeGroup ("kubeedge"); ``nodes``
        None removes it."""
        with self._lock:
            if nodes is None:
                self._pool_objects.pop((flavour, pool), None)
            else:
                self._pool_objects[(flavour, pool)] = (frozenset(nodes),
                                                       dict(match_labels or {}))

    def membership(self, flavour: str) -> dict[str, str]:
        """Node name -> pool of ``flavour``: the node's label, else the pool objects that list
        it or whose label selector matches it (the label wins when both say something)."""
        with self._lock:
            recs = list(self._nodes.values())
            objs = dict(self._pool_objects)
        out: dict[str, str] = {}
        for r in recs:
            if r.flavour == flavour and r.pool:
                out[r.name] = r.pool
                continue
            for (fl, pool), (names, sel) in sorted(objs.items()):
                if fl != flavour:
                    continue
                if r.name in names or (sel and all(r.labels.get(k) == v
                                                   for k, v in sel.items())):
                    out[r.name] = pool
                    break
        return out

    def upsert(self, node: Mapping[str, Any]) -> list[LabelChange]:
        """Add or update a Node; return changes of the ``WATCHED_FACTS`` labels."""
        rec = record_of(node, self.config)
        problems = tuple(label_problems(rec.labels, self.config)) if rec.labels else ()
        with self._lock:
            old = self._nodes.get(rec.name)
            if old is not None and old == rec:
                rec = old  # the same facts: its NodeInfo is kept (node_infos)
            else:
                self._nodes[rec.name] = rec
                self.version += 1
            if old is None:
                self._order = None
            seen = self.label_problems.get(rec.name, ())
            if problems:
                self.label_problems[rec.name] = problems
            else:
                self.label_problems.pop(rec.name, None)
            if problems and problems != seen:
                for p in problems:
                    n, names = self._unsaid.get(p, (0, []))
                    if len(names) < PROBLEM_NODES_NAMED:
                        names.append(rec.name)
                    self._unsaid[p] = (n + 1, names)
        if problems and problems != seen and self.on_problems is not None:
            self.on_problems(node, problems)
        if old is None:
            return []
        return [LabelChange(rec.name, k, old.labels.get(k), rec.labels.get(k))
                for k in WATCHED_FACTS if old.labels.get(k) != rec.labels.get(k)]

    def say_problems(self) -> int:
        """Log the label problems found since the last call: one WARNING per cause, with the
        count of nodes and the first ``PROBLEM_NODES_NAMED`` names (the actuator's loop calls
        this each time it wakes). Returns how many lines it wrote."""
        with self._lock:
            unsaid, self._unsaid = self._unsaid, {}
        for problem, (n, names) in sorted(unsaid.items()):
            if n == 1:
                log.warning("node %s: %s", names[0], problem)
                continue
            more = f", +{n - len(names)} more" if n > len(names) else ""
            log.warning("%d nodes (%s%s): %s", n, ", ".join(names), more, problem)
        return len(unsaid)

    def remove(self, name: str) -> None:
        with self._lock:
            self._nodes.pop(name, None)
            self.label_problems.pop(name, None)
            self._infos.pop(name, None)
            self._order = None
            self.version += 1

    def get(self, name: str) -> NodeRecord | None:
        with self._lock:
            return self._nodes.get(name)

    def records(self) -> list[NodeRecord]:
        with self._lock:
            return list(self._nodes.values())

    def node_for_agent(self, agent_id: str) -> str | None:
        """The Node name an agent (by its MQTT node id) runs on."""
        with self._lock:
            for r in self._nodes.values():
                if r.agent_id == agent_id:
                    return r.name
        return None

    def agent_names(self) -> Mapping[str, str]:
        """Agent id -> Node name, for every Node (read-only; built once per registry
        version: the loop's source asks every step, and 5,000 Nodes were 0.5 ms a step)."""
        with self._lock:
            if self._agent_names is None or self._agent_names[0] != self.version:
                self._agent_names = (self.version, MappingProxyType(
                    {r.agent_id: r.name for r in self._nodes.values()}))
            return self._agent_names[1]

    def agent_for_node(self, name: str) -> str | None:
        r = self.get(name)
        return r.agent_id if r else None

    def pools(self) -> dict[tuple[str, str], list[str]]:
        """(flavour, pool) → Node names, for KubeEdge NodeGroups and OpenYurt NodePools
        (labels and the pool objects, see :meth:`membership`)."""
        out: dict[tuple[str, str], list[str]] = {}
        for flavour in ("kubeedge", "openyurt"):
            for node, pool in self.membership(flavour).items():
                out.setdefault((flavour, pool), []).append(node)
        return {k: sorted(v) for k, v in sorted(out.items())}

    def node_infos(self, allocated: Mapping[str, Resources] | None = None) -> tuple[NodeInfo, ...]:
        """The registry as the placement engine's ``NodeInfo``s (``allocated`` per node),
        sorted by name."""
        allocated = allocated or {}
        with self._lock:
            if self._order is None:
                self._order = sorted(self._nodes)
            recs = [self._nodes[n] for n in self._order]
        zero = Resources()
        return tuple(self._info(r, allocated.get(r.name, zero)) for r in recs)

    def node_info(self, name: str, allocated: Resources) -> NodeInfo | None:
        """Node ``name`` as :meth:`node_infos` gives it with ``allocated`` (None: no such
        Node)."""
        with self._lock:
            r = self._nodes.get(name)
        return self._info(r, allocated) if r is not None else None

    def _info(self, r: NodeRecord, a: Resources) -> NodeInfo:
        cached = self._infos.get(r.name)
        if cached is not None and cached[0] is r and cached[1] == a:
            return cached[2]
        info = NodeInfo(name=r.name, region=r.region, zone=r.zone,
                        security_level=r.security_level, labels=frozen_map(r.labels),
                        taints=r.taints, capacity=r.capacity, allocated=a, health=r.health,
                        max_pods=r.max_pods, extended=frozen_counts(r.extended))
        self._infos[r.name] = (r, a, info)
        return info
