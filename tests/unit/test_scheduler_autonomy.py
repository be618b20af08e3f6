"""Edge autonomy and the partition/crash verdict.

- ``plan_moves``: workloads on an ``unreachable`` node stay there unless their
  latency SLA can no longer be met; on a ``down`` node they move.
- ``node_health``: a silent node is ``unreachable`` only when a peer *heard*
  from it (bytes acked or received) in a report taken after it fell silent;
  retransmits into a dead host, idle sockets and reports covering the moments
  before a crash do not count.
- the core's link table stays bounded per source node.
"""

from __future__ import annotations

import json

from cloud_core.health import Health as LiveHealth
from cloud_core.health import HealthConfig, node_health
from cloud_core.ingest import Ingest
from cloud_core.placement import ReplanConfig, ReplanState, plan_moves
from cloud_core.placement.model import (
    ClusterSnapshot,
    Health,
    LinkInfo,
    NodeInfo,
    Resources,
    RunningPod,
    Workload,
)
from cloud_core.state import ClusterState
from edge_agent import wire
from tests.unit.reports import report_dict

CAP = Resources(4000, 8 << 30, 0)


def snapshot(health_a: Health, lat_ac: float) -> tuple[ClusterSnapshot, list[tuple[Workload, str]]]:
    nodes = (
        NodeInfo("edge-a", "eu", "eu-1", capacity=CAP, health=health_a),
        NodeInfo("edge-b", "eu", "eu-2", capacity=CAP),
        NodeInfo("edge-c", "eu", "eu-3", capacity=CAP),
    )
    links = {
        # Measured by the peers (edge-a's own reports don't reach the core).
        ("edge-b", "edge-a"): LinkInfo(4.0, 5.0),
        ("edge-c", "edge-a"): LinkInfo(lat_ac * 0.8, lat_ac),
        ("edge-b", "edge-c"): LinkInfo(4.0, 5.0),
    }
    small = Resources(100, 1 << 20, 0)
    ws = [
        Workload("plain", "plain", requests=small),
        Workload("near-b", "near-b", requests=small, max_latency_ms=20, latency_to="edge-b"),
        Workload("near-c", "near-c", requests=small, max_latency_ms=20, latency_to="edge-c"),
    ]
    pods = tuple(RunningPod(w.uid, w.name, w.namespace, "edge-a", requests=w.requests)
                 for w in ws)
    return ClusterSnapshot(nodes, links, now=1000.0, pods=pods), [(w, "edge-a") for w in ws]


def run(health_a: Health, lat_ac: float, rounds: int = 5, cooldown_s: float = 0.0,
        step_s: float = 1.0) -> list[tuple[float, str, str, str]]:
    """``rounds`` replans ``step_s`` apart; the snapshot never shows a move done
    (as when the actuator has not applied it yet). Returns (time, uid, src, dst)."""
    state = ReplanState()
    out = []
    for i in range(rounds):
        snap, running = snapshot(health_a, lat_ac)
        now = 1000.0 + i * step_s
        snap = ClusterSnapshot(snap.nodes, snap.links, now=now, pods=snap.pods)
        moves, state = plan_moves(snap, running, state, ReplanConfig(cooldown_s=cooldown_s))
        out += [(now, m.workload_uid, m.src, m.dst) for m in moves]
    return out


def test_unreachable_node_keeps_workloads_whose_sla_still_holds() -> None:
    assert run(Health.UNREACHABLE, lat_ac=8.0) == []


def test_unreachable_node_loses_only_the_workload_whose_sla_broke() -> None:
    # Five replans a second apart, within a 60 s cool-down: near-c (its SLA to
    # edge-c broke) is planned exactly once, nothing else ever.
    moves = run(Health.UNREACHABLE, lat_ac=80.0, cooldown_s=60.0)
    assert len(moves) == 1, moves
    _t, uid, src, dst = moves[0]
    assert (uid, src) == ("near-c", "edge-a") and dst in ("edge-b", "edge-c")


def test_cool_down_is_what_holds_a_repeat_back() -> None:
    # Same, replans 40 s apart: the move is planned once, and again only after
    # the 60 s cool-down (the snapshot still shows near-c on edge-a).
    moves = run(Health.UNREACHABLE, lat_ac=80.0, rounds=4, cooldown_s=60.0, step_s=40.0)
    assert [m[1] for m in moves] == ["near-c", "near-c"], moves
    assert moves[1][0] - moves[0][0] >= 60.0


def test_down_node_loses_every_workload() -> None:
    moves = run(Health.DOWN, lat_ac=8.0, rounds=1)
    assert sorted(m[1] for m in moves) == ["near-b", "near-c", "plain"]
    assert all(m[3] != "edge-a" for m in moves)


# ---------------------------------------------------------------- partition vs crash


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _link(peer: str, tx: float, rx: float, segs: int) -> dict[str, object]:
    return {"peer": peer, "rtt_us": {"p50": 900.0, "p95": 1000.0, "min": 800.0}, "retrans": segs,
            "segs_out": segs, "loss": 0.0, "tx_bps": tx, "rx_bps": rx, "samples": 3}


def _world() -> tuple[Ingest, ClusterState, Clock]:
    clock = Clock()
    state = ClusterState()
    ing = Ingest(state, clock)
    ing.handle("cfnet/v1/nodes/edge-a/status", wire.encode_status(
        wire.NodeStatus(node="edge-a", state="online", ts=1.0, addresses=("10.1.0.1",))))
    return ing, state, clock


def _report(ing: Ingest, node: str, seq: int, links: list[dict[str, object]]) -> None:
    body = report_dict(node=node, seq=seq, links=links)
    assert ing.handle(f"cfnet/v1/nodes/{node}/telemetry", json.dumps(body).encode()) == "accepted"


def _verdict(state: ClusterState, clock: Clock) -> LiveHealth:
    return node_health(state.snapshot(clock()), "edge-a", HealthConfig())


def test_peer_retransmitting_into_a_dead_node_does_not_make_it_unreachable() -> None:
    ing, state, clock = _world()
    _report(ing, "edge-a", 1, [])
    for i in range(8):  # edge-a is silent; edge-b only sends into the void
        clock.t += 1
        _report(ing, "edge-b", i + 1, [_link("10.1.0.1", 0.0, 0.0, 5)])
    assert _verdict(state, clock) is LiveHealth.DOWN


def test_peer_heard_it_before_the_crash_only_is_down() -> None:
    ing, state, clock = _world()
    _report(ing, "edge-a", 1, [])
    clock.t += 1
    # This peer report covers the second before the crash: traffic, but stale news.
    _report(ing, "edge-b", 1, [_link("10.1.0.1", 1e6, 1e6, 10)])
    for i in range(5):
        clock.t += 1
        _report(ing, "edge-b", i + 2, [])
    assert _verdict(state, clock) is LiveHealth.DOWN


def test_peer_hearing_it_after_it_went_silent_is_unreachable() -> None:
    ing, state, clock = _world()
    _report(ing, "edge-a", 1, [])
    for i in range(6):
        clock.t += 1
        _report(ing, "edge-b", i + 1, [_link("10.1.0.1", 1e6, 1e6, 10)])
    assert _verdict(state, clock) is LiveHealth.UNREACHABLE


def test_link_table_is_bounded_per_node() -> None:
    """A (compromised) agent naming new made-up peers in every report can't grow the core."""
    from cloud_core.state import MAX_LINKS_PER_NODE

    ing, state, clock = _world()
    for seq in range(1, 6):
        peers = [f"10.{seq}.{i >> 8}.{i & 255}" for i in range(1000)]
        _report(ing, "edge-b", seq, [_link(p, 1e6, 1e6, 10) for p in peers])
    links = [k for k in state.snapshot(clock()).links if k[0] == "edge-b"]
    assert len(links) == MAX_LINKS_PER_NODE
    # The most recently measured peers are the ones kept.
    assert ("edge-b", "10.5.3.231") in state.snapshot(clock()).links


def test_node_known_only_from_retained_status_is_suspect_not_down() -> None:
    """A core that just restarted has the retained 'online' status before the first report."""
    _ing, state, clock = _world()  # edge-a: status only, no report yet
    assert _verdict(state, clock) is LiveHealth.SUSPECT
    clock.t += 6  # no report within offline_after_s: now it is judged
    assert _verdict(state, clock) is LiveHealth.DOWN
