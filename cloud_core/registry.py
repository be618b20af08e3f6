"""The core's own node registry (YAML): the facts an agent must never assert about itself.

Region, zone, security level, taints, price, carbon and power model come from
here (or, on Kubernetes, from Node objects via ``cloud_core.k8s.registry``).
An agent that reports telemetry but is not registered gets the ``defaults``
entry — by default region ``unregistered`` and security level 0 — so a
compromised device cannot move itself into a region or raise its clearance.

File format::

    defaults: {region: unregistered, zone: unregistered, security_level: 0}
    nodes:
      - name: edge-a
        region: eu-west
        zone: eu-west-1
        security_level: 2
        labels: {site: lyon}
        taints: [{key: dedicated, value: ml, effect: NoSchedule}]
        capacity: {cpu: "4", memory: 8Gi, nvidia.com/gpu: 1}   # else: what the agent measures
        price_per_hour: 0.12
        energy_price_per_kwh: 0.2
        carbon_g_per_kwh: 60
        idle_watts: 8
        max_watts: 45

The file is checked with msgspec before anything is read from it: an unknown key (a typo such
as ``security-level``) or a value of the wrong type is a ``RegistryError`` naming the entry and
the key (``... unknown field `security-level` - at `$.nodes[0]```).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
import yaml
from msgspec import UNSET, UnsetType

from cloud_core.errors import CoreError, SpecError
from cloud_core.placement.model import NodeInfo, Taint, frozen_map
from cloud_core.placement.spec_pod import parse_resources
from edge_agent.wire import valid_id


class RegistryError(CoreError):
    """The node registry file is unreadable or invalid; the message names the entry."""


_NUM_FIELDS = (
    "price_per_hour", "energy_price_per_kwh", "carbon_g_per_kwh", "idle_watts", "max_watts",
)

@dataclass(frozen=True, slots=True)
class NodeFacts:
    info: NodeInfo
    capacity_set: bool  # False: take capacity from the agent's measurement


@dataclass(frozen=True, slots=True)
class Registry:
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    defaults: NodeInfo = NodeInfo(name="", region="unregistered", zone="unregistered")

    def facts(self, node: str) -> NodeFacts:
        f = self.nodes.get(node)
        if f is not None:
            return f
        return NodeFacts(replace(self.defaults, name=node), capacity_set=False)

    @property
    def names(self) -> list[str]:
        return sorted(self.nodes)


Scalar = str | int | float


class _TaintEntry(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    value: str = ""
    effect: str = "NoSchedule"


class _NodeEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One ``nodes`` entry (or ``defaults``) as msgspec checks it: a key not listed here
    (``security-level`` for ``security_level``) is refused and named, never ignored."""

    name: str | UnsetType = UNSET
    region: str | UnsetType = UNSET
    zone: str | UnsetType = UNSET
    security_level: int | UnsetType = UNSET
    labels: dict[str, Scalar] | UnsetType = UNSET
    taints: list[_TaintEntry] | UnsetType = UNSET
    capacity: dict[str, Scalar] | UnsetType | None = UNSET
    price_per_hour: float | UnsetType = UNSET
    energy_price_per_kwh: float | UnsetType = UNSET
    carbon_g_per_kwh: float | UnsetType = UNSET
    idle_watts: float | UnsetType = UNSET
    max_watts: float | UnsetType = UNSET


class _RegistryFile(msgspec.Struct, forbid_unknown_fields=True):
    defaults: _NodeEntry | None = None
    nodes: list[_NodeEntry] | None = None


def _node_info(d: _NodeEntry, where: str, base: NodeInfo) -> NodeFacts:
    name = base.name if d.name is UNSET else d.name
    if name and not valid_id(name):
        raise RegistryError(f"{where}: name {name!r} is not a valid node id")
    kw: dict[str, Any] = {"name": name}
    for k in ("region", "zone", "security_level", *_NUM_FIELDS):
        v = getattr(d, k)
        if v is UNSET:
            continue
        if k in _NUM_FIELDS and v < 0:
            raise RegistryError(f"{where}.{k}: must not be negative")
        kw[k] = float(v) if k in _NUM_FIELDS else v
    if d.labels is not UNSET:
        kw["labels"] = frozen_map({k: str(v) for k, v in d.labels.items()})
    if d.taints is not UNSET:
        kw["taints"] = tuple(Taint(t.key, t.value, t.effect) for t in d.taints)
    cap_set = d.capacity is not UNSET
    if d.capacity is not UNSET:
        try:
            kw["capacity"] = parse_resources(d.capacity or {}, f"{where}.capacity")
        except SpecError as exc:
            raise RegistryError(str(exc)) from exc
    return NodeFacts(replace(base, **kw), capacity_set=cap_set)


def parse_registry(text: str) -> Registry:
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise RegistryError(f"registry is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise RegistryError("registry: top level must be a mapping")
    try:
        # strict: a YAML string is not a number, a number not a name
        doc = msgspec.convert(raw, _RegistryFile, strict=True)
    except msgspec.ValidationError as exc:
        # "Object contains unknown field `security-level` - at `$.nodes[0]`"
        raise RegistryError(f"registry: {exc}") from exc
    defaults = Registry().defaults
    if doc.defaults is not None:
        if doc.defaults.name is not UNSET:
            raise RegistryError("defaults: a name belongs to a nodes entry")
        defaults = _node_info(doc.defaults, "defaults", defaults).info
    nodes: dict[str, NodeFacts] = {}
    for i, d in enumerate(doc.nodes or []):
        f = _node_info(d, f"nodes[{i}]", replace(defaults, name=""))
        if not f.info.name:
            raise RegistryError(f"nodes[{i}]: name is required")
        if f.info.name in nodes:
            raise RegistryError(f"nodes[{i}]: duplicate node {f.info.name!r}")
        nodes[f.info.name] = f
    return Registry(nodes=nodes, defaults=defaults)


def load_registry(path: Path | None) -> Registry:
    if path is None:
        return Registry()
    try:
        return parse_registry(path.read_text())
    except OSError as exc:
        raise RegistryError(f"cannot read node registry {path}: {exc}") from exc
