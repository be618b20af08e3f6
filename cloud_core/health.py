"""Node health from a state snapshot: online, suspect, unreachable or down.

Pure functions, no clocks: the snapshot carries ``now``. The cloud sees a node
fall silent the same way whether its link to the cloud was cut or it crashed;
the difference shows in its *peers'* measurements. If other agents still
measure fresh traffic with the silent node, it is alive and cut off from us
(``unreachable``: its workloads keep running there, edge autonomy); if nobody
does, it is ``down``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cloud_core.placement.model import Health
from cloud_core.state import StateSnapshot

__all__ = ["Health", "HealthConfig", "all_health", "node_health", "peers_see"]


@dataclass(frozen=True, slots=True)
class HealthConfig:
    # A node is suspect after missing this many report intervals...
    suspect_intervals: float = 2.5
    # ...and offline after this long without a report (or at once on its will).
    offline_after_s: float = 5.0
    # Peer traffic younger than this proves a silent node is still alive.
    peer_fresh_s: float = 5.0


# Who heard from whom: dst (node id or raw peer address) -> [(src, heard time)].
PeerIndex = dict[str, list[tuple[str, float]]]


def peer_index(snap: StateSnapshot) -> PeerIndex:
    """Index links by destination once, so judging many silent nodes stays linear."""
    idx: PeerIndex = {}
    for (src, dst), lk in snap.links.items():
        if lk.heard <= 0:
            continue
        idx.setdefault(dst, []).append((src, lk.heard))
        if lk.peer_addr != dst:
            idx.setdefault(lk.peer_addr, []).append((src, lk.heard))
    return idx


def node_health(
    snap: StateSnapshot,
    node: str,
    cfg: HealthConfig = HealthConfig(),
    index: Callable[[], PeerIndex] | None = None,
) -> Health:
    v = snap.nodes.get(node)
    if v is None or (v.last_report == 0 and v.status != "online"):
        return Health.UNKNOWN
    fresh_status = snap.now - v.status_ts <= cfg.offline_after_s
    if v.last_report == 0 and v.status == "online" and fresh_status:
        # Known only from its retained 'online' status (a core that just
        # started): give its first report time to arrive before judging it,
        # or a restarted core would move every workload off healthy nodes.
        return Health.SUSPECT
    age = snap.now - v.last_report if v.last_report else float("inf")
    will_fired = v.status == "offline" and v.status_ts >= v.last_report
    if not will_fired and age <= v.interval_s * cfg.suspect_intervals:
        return Health.ONLINE
    if not will_fired and age <= cfg.offline_after_s:
        return Health.SUSPECT
    seen = peers_see(snap, node, cfg.peer_fresh_s, index)
    return Health.UNREACHABLE if seen else Health.DOWN


def peers_see(
    snap: StateSnapshot, node: str, fresh_s: float, index: Callable[[], PeerIndex] | None = None
) -> bool:
    """Whether some other node heard from ``node`` within ``fresh_s``, *after* it fell silent.

    Only answers count (``LinkView.heard``: bytes the node acked or sent), not
    segments sent to it or sockets still open to it: a peer retransmitting into
    a dead host sees nothing. And the answer must come from a peer report whose
    interval began after the silent node could have sent its next report
    (its last report + its interval + the peer's interval, with slack): a peer
    report that merely covers the moments before a crash proves nothing.
    """
    heard_by = peer_index(snap) if index is None else index()
    v = snap.nodes.get(node)
    keys = {node, *(v.addresses if v is not None else ())}
    silent_since = v.last_report + v.interval_s if v is not None and v.last_report else 0.0
    for key in keys:
        for src, heard in heard_by.get(key, ()):
            if src == node or src not in snap.nodes:
                continue
            peer = snap.nodes[src]
            after = silent_since + peer.interval_s * 1.5 if silent_since else 0.0
            # The peer's own report must be fresh too, or its view is as old as ours.
            if (
                heard > after
                and snap.now - heard <= fresh_s
                and snap.now - peer.last_report <= fresh_s
            ):
                return True
    return False


def combined_health(node: Health, agent: Health | None) -> Health:
    """A Node's health on Kubernetes: its ``Ready`` condition (``node``, as the Node registry
    reads it) combined with its agent's verdict (``agent``, :func:`node_health` over the
    agents' heartbeats, last will and the links their peers measure; None: no agent reports
    for it).

    - the agent is ``down`` (silent or its will fired, and no peer hears it any more): the
      node crashed, whatever the kubelet's last word: ``down``, its pods are re-placed within
      seconds instead of Kubernetes' 40-50 s (the Node NotReady with the will fired and no
      peer hearing it is the same verdict);
    - the agent is ``unreachable`` (silent, but peers on its site still hear it): a
      partition; its pods stay, even once the Node turns NotReady (edge autonomy: no eviction
      storm when a site's uplink drops);
    - otherwise the Node's condition, made ``suspect`` (no new pods) while the agent is.
    A cordon stays a cordon unless the node is down.
    """
    if agent is None or agent is Health.UNKNOWN:
        return node
    if agent is Health.DOWN:
        return Health.DOWN
    if node is Health.CORDONED:
        return node
    if agent is Health.UNREACHABLE:
        return Health.UNREACHABLE
    if node is not Health.ONLINE:
        return node
    return agent


def all_health(snap: StateSnapshot, cfg: HealthConfig = HealthConfig()) -> dict[str, Health]:
    # Runs every scheduler step and every scrape: the peer index (a pass over
    # all links) is built once, and only when some node's verdict needs it.
    built: list[PeerIndex] = []

    def index() -> PeerIndex:
        if not built:
            built.append(peer_index(snap))
        return built[0]

    return {n: node_health(snap, n, cfg, index) for n in snap.nodes}
