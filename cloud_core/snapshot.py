"""Build the placement engine's frozen ``ClusterSnapshot`` from the live model.

This is the seam between the measured world (state snapshot, health) and the
pure engine: registry facts (never agent claims) for region and security, the
agent's measurement for capacity when the registry gives none, health and
cordons for eligibility, and the measured links between known nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from cloud_core.placement.model import (
    ClusterSnapshot,
    Health,
    LinkInfo,
    NodeInfo,
    Resources,
    RunningPod,
    Workload,
)
from cloud_core.registry import Registry
from cloud_core.state import LinkView, StateSnapshot

# A latency SLA is about requests, not segments. Once at least this share of
# segments is lost, the 95th-percentile request waits for a retransmission:
# at least Linux's minimum RTO on top of the RTT. So heavy loss breaks a
# latency SLA (and triggers re-placement) even when the RTT of the segments
# that do arrive looks fine.
LOSS_BREAKS_P95 = 0.05
MIN_RTO_MS = 200.0


def link_info(lk: LinkView, now: float) -> LinkInfo | None:
    """A measured link as the engine sees it (ms, age); None without an RTT figure.

    ``rtt_p95_ms`` is the p95 a request sees: the measured p95 RTT, plus the
    minimum RTO when loss reaches :data:`LOSS_BREAKS_P95`.
    """
    if lk.rtt_p50_us is None:
        return None
    p95_ms = (lk.rtt_p95_us or lk.rtt_p50_us) / 1000.0
    if lk.loss >= LOSS_BREAKS_P95:
        p95_ms += MIN_RTO_MS
    return LinkInfo(
        rtt_p50_ms=lk.rtt_p50_us / 1000.0,
        rtt_p95_ms=p95_ms,
        loss=lk.loss,
        tx_bps=lk.tx_bps,
        age_s=max(0.0, now - lk.updated),
        samples=lk.samples,
    )


def translated_links(
    state: StateSnapshot, name_of: Callable[[str], str | None]
) -> dict[tuple[str, str], LinkInfo]:
    """Links between nodes the engine knows, under the names ``name_of`` gives agent ids."""
    out: dict[tuple[str, str], LinkInfo] = {}
    for (src, dst), lk in state.links.items():
        a, b = name_of(src), name_of(dst)
        info = link_info(lk, state.now)
        if a is not None and b is not None and info is not None:
            out[(a, b)] = info
    return out


def build_snapshot(
    state: StateSnapshot,
    registry: Registry,
    health: dict[str, Health],
    cordoned: set[str],
    running: Iterable[tuple[Workload, str]],
) -> ClusterSnapshot:
    running = list(running)
    used: dict[str, Resources] = {}
    for w, node in running:
        used[node] = used.get(node, Resources()) + w.requests
    names = sorted(set(registry.nodes) | set(state.nodes))
    nodes: list[NodeInfo] = []
    for name in names:
        facts = registry.facts(name)
        info = facts.info
        if not facts.capacity_set:
            view = state.nodes.get(name)
            r = view.resources if view else None
            cap = (
                Resources(r.cpu_cores * 1000, r.mem_total_bytes, len(r.gpus)) if r else Resources()
            )
            info = replace(info, capacity=cap)
        h = health.get(name, Health.UNKNOWN)
        if h is Health.UNKNOWN:
            h = Health.DOWN  # never reported: nothing runs there as far as we know
        if name in cordoned:
            h = Health.CORDONED
        nodes.append(replace(info, allocated=used.get(name, Resources()), health=h))
    known = set(names)
    links = translated_links(state, lambda n: n if n in known else None)
    pods = tuple(RunningPod.of(w, node) for w, node in running)
    return ClusterSnapshot(nodes=tuple(nodes), links=links, now=state.now, pods=pods)
