"""Ingest: bad messages are counted and dropped with state untouched; good ones keep flowing."""

from __future__ import annotations

import json

import pytest

from cloud_core.health import Health, HealthConfig, node_health
from cloud_core.ingest import Ingest
from cloud_core.replicas import encode_digests
from cloud_core.state import NAME_FOR_S, ClusterState
from edge_agent import wire
from tests.unit.reports import report_bytes, report_dict

T = "cfnet/v1/nodes/edge-a/telemetry"


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _ingest() -> tuple[Ingest, ClusterState, Clock]:
    clock = Clock()
    state = ClusterState()
    return Ingest(state, clock), state, clock


def test_good_report_updates_node_and_link() -> None:
    ing, state, clock = _ingest()
    assert ing.handle(T, report_bytes()) == "accepted"
    snap = state.snapshot(clock())
    assert snap.nodes["edge-a"].resources is not None
    lk = snap.links[("edge-a", "10.77.2.2")]  # peer address unknown to the core yet
    assert lk.rtt_p50_us == 1200.0 and lk.loss == pytest.approx(0.05) and lk.tx_bps == 20e6


def test_peer_address_resolves_to_node_once_announced() -> None:
    ing, state, clock = _ingest()
    st = wire.NodeStatus(node="edge-b", state="online", ts=1.0, addresses=("10.77.2.2",))
    assert ing.handle("cfnet/v1/nodes/edge-b/status", wire.encode_status(st)) == "status"
    ing.handle(T, report_bytes())
    assert ("edge-a", "edge-b") in state.snapshot(clock()).links


BAD = [
    (T, b"{broken", "malformed"),
    (T, json.dumps({k: v for k, v in report_dict().items() if k != "seq"}).encode(), "missing"),
    (T, report_bytes().replace(b'"cpu_util": 0.25', b'"cpu_util": NaN'), "nan"),
    (T, report_bytes(links=[{**report_dict()["links"][0], "rtt_us": {"p50": -5, "p95": 1, "min": -9}}]), "range"),
    (T, report_bytes(links=[{**report_dict()["links"][0], "loss": 1.01}]), "range"),
    (T, b"x" * (wire.MAX_PAYLOAD_BYTES + 1), "oversized"),
    (T, report_bytes(node="edge-b"), "node_mismatch"),
    ("cfnet/v1/nodes/edge-a/other", report_bytes(), "topic"),
    ("garbage/topic", report_bytes(), "topic"),
    ("cfnet/v1/nodes/edge-a/status", b'{"node":"edge-z","state":"online","ts":1}', "node_mismatch"),
]


@pytest.mark.parametrize(("topic", "payload", "reason"), BAD)
def test_bad_input_is_counted_and_state_unchanged(topic: str, payload: bytes, reason: str) -> None:
    ing, state, clock = _ingest()
    ing.handle(T, report_bytes(seq=1))
    before = state.snapshot(clock())
    assert ing.handle(topic, payload) == f"rejected:{reason}"
    after = state.snapshot(clock())
    assert after == before
    assert ing.counters().rejected == {reason: 1}
    # ...and the next good report is still ingested.
    assert ing.handle(T, report_bytes(seq=2)) == "accepted"
    assert state.snapshot(clock()).nodes["edge-a"].seq == 2


def test_duplicates_are_dropped_exactly_once_semantics() -> None:
    ing, state, _ = _ingest()
    for seq in (1, 2, 2, 3, 1):
        ing.handle(T, report_bytes(seq=seq))
    c = ing.counters()
    assert (c.accepted, c.duplicates) == (3, 2)
    assert state.node_history("edge-a") == [("b1", 1), ("b1", 2), ("b1", 3)]
    # A new boot restarts seq numbering without being mistaken for duplicates.
    assert ing.handle(T, report_bytes(seq=1, boot="b2")) == "accepted"


def test_replicas_share_folded_seqs_through_digests() -> None:
    """What one replica folded is named in its digest (ranges per boot); the other marks
    it seen, so the same report reaching it later (a redelivery, an agent's resend after
    a lost ack) is acknowledged as a duplicate there, not folded a second time."""
    a_ing, a, clock = _ingest()
    b_ing, b, _ = _ingest()
    acked: list[int] = []
    b_ing.on_ingested = lambda _n, _b, seq: acked.append(seq)
    a.share_seqs = b.share_seqs = True
    for seq in (1, 2, 3, 5):
        a_ing.handle(T, report_bytes(seq=seq))
    items = a.export_local(0.0, clock())
    assert items[0]["seqs"] == [["b1", [[1, 3], [5, 5]]]]
    # Named again in every digest for NAME_FOR_S (digests lost while a replica's connection
    # was away lose nothing), then no more.
    clock.t += NAME_FOR_S - 1
    assert [it["seqs"] for it in a.export_local(clock(), clock())] == [items[0]["seqs"]]
    a_ing.handle(T, report_bytes(seq=6))
    clock.t += 1
    assert [it["seqs"] for it in a.export_local(clock(), clock())] == [[["b1", [[6, 6]]]]]
    clock.t += NAME_FOR_S
    assert a.export_local(clock(), clock()) == []
    (wire_digest,) = encode_digests(items)  # as it travels
    assert b.merge(json.loads(wire_digest)["items"], clock()) == 0
    assert [b_ing.handle(T, report_bytes(seq=q)) for q in (2, 4)] == ["duplicate", "accepted"]
    assert acked == [2, 4] and b.node_history("edge-a") == [("b1", 4)]
    # Bounded before expansion: an item naming too many seqs is refused whole.
    big = [{**items[0], "seqs": [["b1", [[1, 10**9]]]]}]
    assert b.merge(big, clock()) == 1


def test_late_buffered_report_does_not_overwrite_newer_view() -> None:
    ing, state, _clock = _ingest()
    ing.handle(T, report_bytes(seq=5, ts=2000.0))
    ing.handle(T, report_bytes(seq=3, ts=1000.0))
    assert state.snapshot(0).nodes["edge-a"].seq == 5


def test_health_online_suspect_down_unreachable() -> None:
    ing, state, clock = _ingest()
    cfg = HealthConfig(suspect_intervals=2.5, offline_after_s=5.0, peer_fresh_s=5.0)
    ing.handle("cfnet/v1/nodes/edge-b/status", wire.encode_status(
        wire.NodeStatus(node="edge-b", state="online", ts=1.0, addresses=("10.77.2.2",))))
    ing.handle(T, report_bytes(seq=1))
    assert node_health(state.snapshot(clock()), "edge-a", cfg) is Health.ONLINE
    clock.t += 3
    assert node_health(state.snapshot(clock()), "edge-a", cfg) is Health.SUSPECT
    clock.t += 10
    assert node_health(state.snapshot(clock()), "edge-a", cfg) is Health.DOWN
    # edge-b goes silent while edge-a still measures fresh traffic with it.
    ing.handle(T, report_bytes(seq=2))
    assert node_health(state.snapshot(clock()), "edge-b", cfg) is Health.UNREACHABLE
