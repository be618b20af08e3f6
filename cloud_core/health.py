"""Node health from a state snapshot: online, suspect, unreachable or down.

Pure functions, no clocks: the snapshot carries ``now``. The cloud sees a node
fall silent the same way whether its link to the cloud was cut or it crashed;
the difference shows in its *peers'* measurements. If other agents still
measure fresh traffic with the silent node, it is alive and cut off from us
(``unreachable``: its workloads keep running there, edge autonomy); if nobody
does, it is ``down``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cloud_core.state import StateSnapshot


class Health(StrEnum):
    ONLINE = "online"
    SUSPECT = "suspect"
    UNREACHABLE = "unreachable"
    DOWN = "down"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class HealthConfig:
    # A node is suspect after missing this many report intervals...
    suspect_intervals: float = 2.5
    # ...and offline after this long without a report (or at once on its will).
    offline_after_s: float = 5.0
    # Peer traffic younger than this proves a silent node is still alive.
    peer_fresh_s: float = 5.0


def node_health(snap: StateSnapshot, node: str, cfg: HealthConfig = HealthConfig()) -> Health:
    v = snap.nodes.get(node)
    if v is None or (v.last_report == 0 and v.status != "online"):
        return Health.UNKNOWN
    age = snap.now - v.last_report if v.last_report else float("inf")
    will_fired = v.status == "offline" and v.status_ts >= v.last_report
    if not will_fired and age <= v.interval_s * cfg.suspect_intervals:
        return Health.ONLINE
    if not will_fired and age <= cfg.offline_after_s:
        return Health.SUSPECT
    return Health.UNREACHABLE if peers_see(snap, node, cfg.peer_fresh_s) else Health.DOWN


def peers_see(snap: StateSnapshot, node: str, fresh_s: float) -> bool:
    """Whether some other node measured traffic with ``node`` within ``fresh_s``."""
    addrs = set(snap.nodes[node].addresses) if node in snap.nodes else set()
    for (src, dst), lk in snap.links.items():
        if src == node:
            continue
        # The peer's own report must be fresh too, or its view is as old as ours.
        if (
            (dst == node or lk.peer_addr in addrs)
            and snap.now - lk.updated <= fresh_s
            and snap.now - snap.nodes[src].last_report <= fresh_s
        ):
            return True
    return False


def all_health(snap: StateSnapshot, cfg: HealthConfig = HealthConfig()) -> dict[str, Health]:
    return {n: node_health(snap, n, cfg) for n in snap.nodes}
