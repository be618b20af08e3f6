"""The fold gate (cloud_core/ownership.py): calm, every report folds; while replicas cannot
hear each other, a node's owner holds its reports until the peers' digests say what they
folded, and the others drop them for their agents to resend."""

from __future__ import annotations

import json
import zlib
from typing import Any

from cloud_core.ingest import Ingest
from cloud_core.ownership import DROP, FOLD, HOLD, FoldGate
from cloud_core.replicas import DigestExchange, encode_digests
from cloud_core.state import ClusterState
from edge_agent.wire import TelemetryReport, digest_topic
from edge_agent.wire.bus import Message
from tests.unit.reports import report_bytes


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Bus:
    def __init__(self) -> None:
        self.up, self.connects = True, 1


def rep(node: str, seq: int = 1) -> TelemetryReport:
    return TelemetryReport(node=node, seq=seq, boot="b", ts=1.0, interval_s=1.0,
                           probe="ebpf", resources=None, links=())


def node_owned_by(index: int) -> str:
    """A node id whose CRC-32 puts it on the ``index``-th of two sorted replicas."""
    return next(f"n{k}" for k in range(100) if zlib.crc32(f"n{k}".encode()) % 2 == index)


def gate(folded: list[TelemetryReport], **kw: Any) -> tuple[FoldGate, Bus, Clock]:
    bus, clock = Bus(), Clock()
    g = FoldGate("core-a", folded.append, connected=lambda: bus.up,
                 connects=lambda: bus.connects, clock=clock, **kw)
    return g, bus, clock


def test_alone_it_folds_and_after_a_reconnect_listens_first() -> None:
    folded: list[TelemetryReport] = []
    g, bus, clock = gate(folded)
    assert g.check(rep("w")) == FOLD  # a fresh replica has folded nothing before
    bus.connects = 2  # its connection came back: listening for peers
    assert g.check(rep("x")) == HOLD
    clock.t += 3
    g.tick()
    assert [r.node for r in folded] == ["x"]
    assert g.check(rep("y")) == FOLD and g.owner("y") == "core-a"


def test_after_a_reconnect_the_owner_holds_until_the_peer_speaks() -> None:
    folded: list[TelemetryReport] = []
    g, bus, clock = gate(folded)
    g.peer_heard("core-b", 1.0)
    assert not g.disturbed
    mine, theirs = node_owned_by(0), node_owned_by(1)  # sorted: core-a, core-b
    assert g.check(rep(mine)) == FOLD and g.check(rep(theirs)) == FOLD  # calm
    bus.up = False
    assert g.check(rep(mine, 2)) == HOLD
    assert g.check(rep(mine, 2)) == HOLD and g.counts()["holding"] == 1  # one copy kept
    assert g.check(rep(theirs, 2)) == DROP
    bus.up, bus.connects = True, 2
    clock.t += 1
    g.peer_heard("core-b", 1.0, complete=False)  # a digest's first chunk only
    assert g.disturbed and not folded
    g.peer_heard("core-b", 1.0)
    assert [(r.node, r.seq) for r in folded] == [(mine, 2)]
    assert g.counts() == {"held": 1, "released": 1, "dropped_owner": 1, "dropped_full": 0,
                          "peers_forgotten": 0, "late": 0, "peers_refused": 0, "holding": 0}


def test_peers_past_the_bound_are_refused_and_counted() -> None:
    g, _bus, _clock = gate([], max_peers=2)
    for p in ("core-b", "core-c", "core-x"):
        g.peer_heard(p, 1.0)
    assert g.counts()["peers_refused"] == 1
    assert {g.owner(f"n{k}") for k in range(200)} == {"core-a", "core-b", "core-c"}
    g.peer_heard("core-b", 1.0)  # a tracked peer is still heard
    assert g.counts()["peers_refused"] == 1


def test_an_overdue_peer_disturbs_and_a_gone_one_is_forgotten() -> None:
    folded: list[TelemetryReport] = []
    g, _bus, clock = gate(folded, forget_s=8.0)
    g.peer_heard("core-b", 1.0)
    theirs = node_owned_by(1)
    clock.t += 2.6  # 2.5 of its 1 s intervals without a digest
    assert g.check(rep(theirs)) == DROP
    mine = node_owned_by(0)
    assert g.check(rep(mine)) == HOLD
    clock.t += 8.1
    g.tick()  # core-b is gone: what it owned is this replica's now
    assert [r.node for r in folded] == [mine] and g.counts()["peers_forgotten"] == 1
    assert g.check(rep(theirs, 2)) == FOLD and g.owner(theirs) == "core-a"


def test_a_calm_replica_leaves_a_holding_owner_its_copies() -> None:
    folded: list[TelemetryReport] = []
    g, _bus, _clock = gate(folded)
    g.peer_heard("core-b", 1.0, holding=True)  # core-b's connection just came back
    theirs, mine = node_owned_by(1), node_owned_by(0)
    assert not g.disturbed and g.check(rep(mine)) == FOLD
    assert g.check(rep(theirs)) == DROP  # core-b may hold a copy of it: its to fold
    g.peer_heard("core-b", 1.0)  # it folded what it held: this digest names it
    assert g.check(rep(theirs)) == FOLD and not g.holding


def test_a_late_report_disturbs_until_the_peer_speaks_again() -> None:
    folded: list[TelemetryReport] = []
    g, _bus, clock = gate(folded)
    g.peer_heard("core-b", 1.0)
    mine, theirs = node_owned_by(0), node_owned_by(1)
    assert g.check(rep(theirs), late=True) == DROP  # a copy may be with core-b at once
    assert g.check(rep(mine), late=True) == HOLD
    clock.t += 0.5
    g.peer_heard("core-b", 1.0)  # names what it folded meanwhile
    assert [r.node for r in folded] == [mine] and g.counts()["late"] == 1
    assert g.check(rep(theirs, 2)) == FOLD


def test_held_reports_are_bounded() -> None:
    g, bus, _clock = gate([], max_held=2)
    assert g.check(rep("x", 1)) == FOLD
    bus.up = False
    assert [g.check(rep("x", s)) for s in (2, 3, 4)] == [HOLD, HOLD, DROP]
    assert g.counts()["dropped_full"] == 1


def test_a_held_report_the_peer_folded_is_acknowledged_not_folded_again() -> None:
    clock = Clock()
    a, b = ClusterState(), ClusterState()
    a.share_seqs = b.share_seqs = True
    a_ing, b_ing = Ingest(a, clock), Ingest(b, clock)
    acked: list[int] = []
    b_ing.on_ingested = lambda _n, _b, seq: acked.append(seq)
    bus = Bus()
    g = FoldGate("core-b", b_ing.fold, connected=lambda: bus.up, connects=lambda: bus.connects,
                 clock=clock)
    b_ing.gate = g
    owner_b = next(f"e{k}" for k in range(100)
                   if sorted(["core-a", "core-b"])[zlib.crc32(f"e{k}".encode()) % 2] == "core-b")
    g.peer_heard("core-a", 1.0)
    topic = f"cfnet/v1/nodes/{owner_b}/telemetry"
    # core-a folded seq 1 (a redelivery's first copy) just before the bus went away.
    assert a_ing.handle(topic, report_bytes(node=owner_b, seq=1)) == "accepted"
    bus.up = False
    assert b_ing.handle(topic, report_bytes(node=owner_b, seq=1)) == "hold"
    assert b_ing.handle(topic, report_bytes(node=owner_b, seq=2)) == "hold"
    bus.up, bus.connects = True, 2
    clock.t += 1
    (digest,) = encode_digests(a.export_local(0.0, clock()))
    body = json.loads(digest)
    assert body["last"] is True and body["every"] == 1.0
    b.merge(body["items"], clock())
    g.peer_heard("core-a", body["every"])
    assert b.node_history(owner_b) == [("b1", 2)]  # seq 1 in core-a's state only
    assert acked == [1, 2]  # both acknowledged to the agent
    assert b_ing.counters().duplicates == 1 and b_ing.counters().accepted == 1


def test_digests_say_the_interval_and_mark_the_last_chunk() -> None:
    (empty,) = encode_digests([], every_s=2.0)
    assert json.loads(empty) == {"v": 1, "every": 2.0, "holding": False, "items": [],
                                 "last": True}
    items = [{"node": f"n{i}", "pad": "x" * 100} for i in range(30)]
    chunks = [json.loads(c) for c in encode_digests(items, limit=1000)]
    assert len(chunks) > 2 and [c.get("last", False) for c in chunks][-2:] == [False, True]
    assert sum(len(c["items"]) for c in chunks) == 30


def test_a_wait_ends_only_with_a_digest_that_heard_ours_saying_we_hold() -> None:
    folded: list[TelemetryReport] = []
    g, bus, clock = gate(folded)
    n0, holding, heard = g.next_digest()
    assert not holding and heard == {}
    g.peer_heard("core-b", 1.0, n=7, heard_me=n0)
    mine = node_owned_by(0)
    bus.connects = 2  # back: core-b's next digest awaited
    assert g.check(rep(mine, 2)) == HOLD
    # In flight when the wait began: exported before core-b heard we hold.
    g.peer_heard("core-b", 1.0, n=8, heard_me=n0)
    assert g.disturbed and not folded
    n1, holding, heard = g.next_digest()
    assert n1 == n0 + 1 and holding and heard == {"core-b": 8}
    g.peer_heard("core-b", 1.0, n=9, heard_me=n1)
    assert not g.disturbed and [r.seq for r in folded] == [2]
    clock.t += 0.5
    assert g.next_digest()[1] is False  # folded before the digest says it stopped


def test_digests_carry_their_number_and_what_they_heard() -> None:
    state = ClusterState()
    sent: list[bytes] = []

    class Pub:
        connected = True

        def publish(self, _topic: str, payload: bytes, qos: int = 0) -> None:
            sent.append(payload)

    g, _bus, _clock = gate([])
    g.peer_heard("core-b", 1.0, n=41)
    ex = DigestExchange("core-a", state, Pub(), gate=g)  # type: ignore[arg-type]
    ex.publish_once()
    body = json.loads(sent[-1])
    assert body["heard"] == {"core-b": 41} and isinstance(body["n"], int)
    peer = DigestExchange("core-b", ClusterState(), Pub())  # type: ignore[arg-type]
    bad = json.dumps({"v": 1, "items": [], "n": 1,
                      "heard": {f"c{i}": 1 for i in range(100)}}).encode()
    peer.handle(Message(digest_topic("core-a"), bad))
    assert peer.bad_items == 1  # refused: more replicas than any digest names


def test_a_digest_missing_a_chunk_ends_no_wait() -> None:
    folded: list[TelemetryReport] = []
    g, bus, _clock = gate(folded)
    ex = DigestExchange("core-a", ClusterState(), object(), gate=g)  # type: ignore[arg-type]
    g.peer_heard("core-b", 1.0)
    bus.connects = 2  # back: core-b's next whole digest awaited
    mine = node_owned_by(0)
    assert g.check(rep(mine, 3)) == HOLD
    n_a = g.next_digest()[0]  # ours, saying we hold, heard by core-b
    items = [{"node": f"n{i}", "pad": "x" * 100} for i in range(30)]
    first = encode_digests(items, limit=1000, n=5, heard={"core-a": n_a})
    assert len(first) > 2 and json.loads(first[-1])["chunks"] == len(first)
    for c in first[1:]:  # its first chunk went out before our subscription came back
        ex.handle(Message(digest_topic("core-b"), c))
    assert g.disturbed and not folded
    for c in encode_digests(items, limit=1000, n=6, heard={"core-a": n_a}):
        ex.handle(Message(digest_topic("core-b"), c))
    assert not g.disturbed and [r.seq for r in folded] == [3]
    assert ex.bad_items == 0


class Link:
    """Two replicas' digest exchanges on one in-memory bus: a publish reaches every other
    replica's ``handle`` at once."""

    def __init__(self) -> None:
        self.connected = True
        self.exchanges: list[DigestExchange] = []

    def publish(self, topic: str, payload: bytes, qos: int = 0) -> None:
        for ex in self.exchanges:
            ex.handle(Message(topic, payload))


def test_a_wait_ends_on_prompt_digests_without_waiting_out_an_interval() -> None:
    link = Link()
    ga, bus_a, _clock = gate([])
    gb = FoldGate("core-b", lambda _r: None, connected=lambda: True, connects=lambda: 1,
                  clock=_clock)
    a = DigestExchange("core-a", ClusterState(), link, gate=ga)  # type: ignore[arg-type]
    b = DigestExchange("core-b", ClusterState(), link, gate=gb)  # type: ignore[arg-type]
    link.exchanges = [a, b]
    a.publish_once()
    b.publish_once()
    assert not a.prompt() and not b.prompt()  # calm: once per interval only
    bus_a.connects = 2  # core-a's connection came back: it holds, and says so at once
    mine = node_owned_by(0)
    assert ga.check(rep(mine, 4)) == HOLD
    assert a.prompt()
    a.publish_once()
    assert not a.prompt()  # said
    assert b.prompt()  # a holding peer's whole digest: answered before the interval
    b.publish_once()
    assert not b.prompt()
    assert not ga.disturbed  # the answer heard core-a's holding digest: the wait is over
    assert a.prompt()  # core-a stopped holding: it says so at once too
    a.publish_once()
    assert not b.prompt() and not a.prompt()  # calm again on both: nothing to answer


def test_a_calm_peers_digest_asks_for_no_answer() -> None:
    link = Link()
    ga, _bus, _clock = gate([])
    a = DigestExchange("core-a", ClusterState(), link, gate=ga)  # type: ignore[arg-type]
    link.exchanges = [a]
    for n, holding in ((1, False), (2, True)):
        (d,) = encode_digests([], holding=holding, n=n, heard={})
        a.handle(Message(digest_topic("core-b"), d))
        assert a.prompt() is holding
    link.connected = False
    assert not a.prompt()  # nothing goes out while the connection is down


def test_a_settle_keeps_only_owners_folding_after_the_connection_returns() -> None:
    folded: list[TelemetryReport] = []
    g, bus, clock = gate(folded, settle_s=2.0)
    g.peer_heard("core-b", 1.0)
    mine = node_owned_by(0)
    bus.connects = 2
    assert g.check(rep(mine, 5)) == HOLD
    n = g.next_digest()[0]
    g.peer_heard("core-b", 1.0, n=3, heard_me=n)  # answered at once: still settling
    assert g.disturbed and not folded
    clock.t += 2.1
    assert not g.disturbed and [r.seq for r in folded] == [5]


def test_a_peer_is_calm_only_from_a_whole_digest_saying_so() -> None:
    folded: list[TelemetryReport] = []
    g, _bus, _clock = gate(folded)
    ex = DigestExchange("core-a", ClusterState(), object(), gate=g)  # type: ignore[arg-type]
    theirs = node_owned_by(1)
    for c in encode_digests([], holding=True, n=1, heard={}):
        ex.handle(Message(digest_topic("core-b"), c))
    assert g.check(rep(theirs, 1)) == DROP  # core-b holds: its nodes are its own
    items = [{"node": f"n{i}", "pad": "x" * 100} for i in range(30)]
    calm = encode_digests(items, limit=1000, holding=False, n=2, heard={})
    assert len(calm) > 2
    for c in calm[:-1]:  # "calm", but what it released is named in chunks still to come
        ex.handle(Message(digest_topic("core-b"), c))
        assert g.check(rep(theirs, 2)) == DROP
    ex.handle(Message(digest_topic("core-b"), calm[-1]))
    assert g.check(rep(theirs, 3)) == FOLD
