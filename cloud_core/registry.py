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
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from cloud_core.errors import CoreError, SpecError
from cloud_core.placement.model import NodeInfo, Taint, frozen_map
from cloud_core.placement.spec import parse_resources
from edge_agent.wire import valid_id


class RegistryError(CoreError):
    """The node registry file is unreadable or invalid; the message names the entry."""


_NUM_FIELDS = (
    "price_per_hour", "energy_price_per_kwh", "carbon_g_per_kwh", "idle_watts", "max_watts",
)
def _number(v: Any, where: str) -> float:
    if isinstance(v, bool):
        raise RegistryError(f"{where}: {v!r} is not a number")
    try:
        return float(v)
    except (TypeError, ValueError) as exc:
        raise RegistryError(f"{where}: {v!r} is not a number") from exc


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


def _node_info(d: dict[str, Any], where: str, base: NodeInfo) -> NodeFacts:
    if not isinstance(d, dict):
        raise RegistryError(f"{where}: must be a mapping")
    name = str(d.get("name", base.name))
    if name and not valid_id(name):
        raise RegistryError(f"{where}: name {name!r} is not a valid node id")
    kw: dict[str, Any] = {"name": name}
    for k in ("region", "zone"):
        if k in d:
            kw[k] = str(d[k])
    if "security_level" in d:
        try:
            kw["security_level"] = int(d["security_level"])
        except (TypeError, ValueError) as exc:
            raise RegistryError(f"{where}.security_level: must be an integer") from exc
    for k in _NUM_FIELDS:
        if k in d:
            val = _number(d[k], f"{where}.{k}")
            if val < 0:
                raise RegistryError(f"{where}.{k}: must not be negative")
            kw[k] = val
    if "labels" in d:
        if not isinstance(d["labels"], dict):
            raise RegistryError(f"{where}.labels: must be a mapping")
        kw["labels"] = frozen_map({str(k): str(v) for k, v in d["labels"].items()})
    if "taints" in d:
        try:
            kw["taints"] = tuple(
                Taint(str(t["key"]), str(t.get("value", "")), str(t.get("effect", "NoSchedule")))
                for t in d["taints"]
            )
        except (TypeError, KeyError) as exc:
            raise RegistryError(f"{where}.taints: each needs a key") from exc
    cap_set = "capacity" in d
    if cap_set:
        c = d["capacity"] or {}
        if not isinstance(c, dict):
            raise RegistryError(f"{where}.capacity: must be a mapping")
        try:
            kw["capacity"] = parse_resources(c, f"{where}.capacity")
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
    defaults = Registry().defaults
    if "defaults" in raw:
        defaults = _node_info({**raw["defaults"], "name": ""}, "defaults", defaults).info
    nodes: dict[str, NodeFacts] = {}
    for i, d in enumerate(raw.get("nodes") or []):
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
