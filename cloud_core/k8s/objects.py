"""What cfnet reads of a Pod and a Node: one lean schema per kind, decoded by msgspec.

A list page or watch event is decoded straight into these ``TypedDict`` schemas, so the
parts cfnet never reads are skipped by msgspec's decoder instead of being built as Python
objects: ``metadata.managedFields`` (often the largest part of an object), a Pod's status
but its ``phase``, a Node's status but ``capacity``, ``allocatable`` and ``conditions``
(its ``images``, ``nodeInfo``, ``addresses``, ``daemonEndpoints`` are most of a Node), and
of a pod another scheduler places, every spec field but what its node counts
(``OtherSpec``). At 5,000 nodes and 10,000 pods that is most of the start-up's decoding CPU
(``tools/bench_decode.py``).

The result is still plain dicts of the API's JSON (a ``TypedDict`` decodes to a ``dict``), so
every reader above (``handlers``, ``registry``, the spec parser, ``evict``) is unchanged.
Every leaf cfnet reads is typed ``Any``: it is decoded exactly as the generic decoder would,
and checked where it is read, as before. The spec of a pod cfnet places is kept whole: the
spec parser refuses a pod naming any PodSpec field it does not know (``check_supported``, in a
FailedScheduling event), so it must see every one (``PodSchema``). A page, object or spec
whose shape does not fit (``metadata`` not an object, ``items`` or ``containers`` not a
list...) is decoded generically instead (counted in ``STATS["fallback"]``), so an odd answer
is read exactly as before; malformed JSON raises as before. Size bounds are the callers' and
unchanged (``WATCH_LINE_MAX_BYTES``; a list page is limited by ``limit=``; nothing is
expanded that the generic decoder would not have built).

A reader that needs a field not named here must add it here: a field left out reads as
absent.
"""

from __future__ import annotations

from typing import Any, TypedDict

import msgspec

# How many pages/events did not fit their schema and were decoded generically.
STATS = {"fallback": 0}

_generic = msgspec.json.Decoder().decode


class ObjectMeta(TypedDict, total=False):
    """``metav1.ObjectMeta`` without ``managedFields`` (server-side apply's bookkeeping)."""

    name: Any
    generateName: Any
    namespace: Any
    selfLink: Any
    uid: Any
    resourceVersion: Any
    generation: Any
    creationTimestamp: Any
    deletionTimestamp: Any
    deletionGracePeriodSeconds: Any
    labels: Any
    annotations: Any
    ownerReferences: Any
    finalizers: Any


class PodStatus(TypedDict, total=False):
    """What ``handlers`` reads of a pod's status: bound, live or finished."""

    phase: Any


class Pod(TypedDict, total=False):
    """A Pod, its ``spec`` left encoded until its ``schedulerName`` says which it needs:
    whole, or ``OtherSpec`` (``PodSchema``)."""

    apiVersion: Any
    kind: Any
    metadata: ObjectMeta
    spec: msgspec.Raw
    status: PodStatus


class Container(TypedDict, total=False):
    """What ``spec.usage_workload`` reads of a container: its requests and host ports
    (``restartPolicy``: a sidecar init container's count as the containers')."""

    name: Any
    resources: Any
    ports: Any
    restartPolicy: Any


class OtherSpec(TypedDict, total=False):
    """The spec of a pod another scheduler places, as far as cfnet reads it: where it is
    bound and what it takes there (``spec.usage_workload``: requests, overhead, host ports,
    pod (anti-)affinity), its priority and scheduler. Its volumes, env, tolerations,
    security contexts, the ServiceAccount's projected volume... are never read: such a pod
    is only ever counted on its node (``handlers.EventHandlers``; ``spec.parse_pod`` refuses
    it at its ``schedulerName``, before it looks at any other field)."""

    schedulerName: Any
    nodeName: Any
    priority: Any
    priorityClassName: Any
    hostNetwork: Any
    containers: list[Container]
    initContainers: list[Container]
    resources: Any
    overhead: Any
    affinity: Any


class NodeStatus(TypedDict, total=False):
    """What ``registry.record_of`` and ``handlers.node_may_help`` read of a node's status."""

    capacity: Any
    allocatable: Any
    conditions: Any


class Node(TypedDict, total=False):
    """A Node; ``spec`` whole (taints, unschedulable: small)."""

    apiVersion: Any
    kind: Any
    metadata: ObjectMeta
    spec: Any
    status: NodeStatus


class PodList(msgspec.Struct):
    """A list page: its metadata (resourceVersion, continue: small) generic, its items lean;
    both may be absent or null, as the generic decoder allows."""

    metadata: dict[str, Any] | None = None
    items: list[Pod] | None = None


class NodeList(msgspec.Struct):
    """As ``PodList``."""

    metadata: dict[str, Any] | None = None
    items: list[Node] | None = None


class _Event(TypedDict, total=False):
    """A watch event, its object left encoded until its type says what it is (an ERROR
    event carries a ``Status``, which the object schemas would strip)."""

    type: Any
    object: msgspec.Raw


class Schema:
    """One kind's decoders: a list page and a watch event into the kind's lean schema."""

    def __init__(self, name: str, item: Any, page: type[PodList | NodeList]) -> None:
        self.name = name
        self._page = msgspec.json.Decoder(page).decode
        self._item = msgspec.json.Decoder(item).decode
        self._event = msgspec.json.Decoder(_Event).decode

    def _finish(self, obj: Any) -> Any:
        """A decoded item's last step (``PodSchema``: its spec)."""
        return obj

    def page(self, data: bytes) -> Any:
        """A list page as the generic decoder gives it (``metadata``, ``items``), its items
        lean; one that does not fit the schema is decoded generically."""
        try:
            p = self._page(data)
        except msgspec.ValidationError:
            STATS["fallback"] += 1
            return _generic(data)
        out: dict[str, Any] = {}
        if p.metadata is not None:
            out["metadata"] = p.metadata
        if p.items is not None:
            out["items"] = [self._finish(o) for o in p.items]
        return out

    def event(self, line: bytes) -> Any:
        """A watch event as the generic decoder gives it (``type``, ``object``), the object
        lean unless the event is an ERROR."""
        try:
            ev = self._event(line)
        except msgspec.ValidationError:
            STATS["fallback"] += 1
            return _generic(line)
        raw = ev.get("object")
        if raw is None:
            return ev
        if ev.get("type") == "ERROR":
            return {**ev, "object": _generic(raw)}
        try:
            obj = self._finish(self._item(raw))
        except msgspec.ValidationError:
            STATS["fallback"] += 1
            obj = _generic(raw)
        return {**ev, "object": obj}


class PodSchema(Schema):
    """Pods, each ``spec`` decoded whole when ``schedulerName`` is one of ``whole`` (or not
    a string: absent, the API server would default it), as ``OtherSpec`` otherwise. The
    pods cfnet places need every field (``check_supported`` names any it does not know, and
    is answered in a FailedScheduling event); the others only what their node counts.
    ``whole`` None: every spec whole."""

    def __init__(self, whole: frozenset[str] | None = None) -> None:
        super().__init__("Pod", Pod, PodList)
        self.whole = whole
        self._other = msgspec.json.Decoder(OtherSpec).decode

    def _finish(self, obj: Any) -> Any:
        raw = obj.get("spec")
        if raw is None:
            return obj
        if self.whole is None:
            obj["spec"] = _generic(raw)
            return obj
        try:
            spec = self._other(raw)
        except msgspec.ValidationError:
            STATS["fallback"] += 1
            spec = None
        sched = spec.get("schedulerName") if spec is not None else None
        obj["spec"] = spec if isinstance(sched, str) and sched not in self.whole \
            else _generic(raw)
        return obj


POD = PodSchema()
NODE = Schema("Node", Node, NodeList)
