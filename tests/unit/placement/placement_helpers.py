"""Shared builders for the placement tests (small, explicit clusters)."""

from __future__ import annotations

from typing import Any

from cloud_core.placement import (
    ClusterSnapshot,
    Health,
    LinkInfo,
    NodeInfo,
    Resources,
    Workload,
)

GIB = 1 << 30


def node(name: str, region: str = "r1", zone: str | None = None, **kw: Any) -> NodeInfo:
    kw.setdefault("capacity", Resources(4000, 8 * GIB, 0))
    kw.setdefault("health", Health.ONLINE)
    kw.setdefault("price_per_hour", 1.0)
    return NodeInfo(name, region, zone or f"{region}-a", **kw)


def wl(uid: str, **kw: Any) -> Workload:
    kw.setdefault("requests", Resources(1000, GIB, 0))
    return Workload(uid, uid, **kw)


def snap(nodes: list[NodeInfo], links: dict[tuple[str, str], LinkInfo] | None = None,
         **kw: Any) -> ClusterSnapshot:
    return ClusterSnapshot(tuple(nodes), links or {}, now=kw.pop("now", 1000.0), **kw)
