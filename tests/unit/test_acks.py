"""End-to-end acks: the wire form, the core's batching, the agent's buffer and resend policy."""

from __future__ import annotations

import itertools
import json
import sqlite3
from pathlib import Path

import pytest

from cloud_core.acks import RETRY_S, Acknowledger
from edge_agent.buffer import ReportBuffer
from edge_agent.outbox import AckWindow
from edge_agent.wire import (
    MAX_ACK_RANGES,
    AckBatch,
    WireError,
    ack_topic,
    encode_ack,
    parse_ack,
    seq_ranges,
)


def test_seq_ranges_merge_and_dedupe() -> None:
    assert seq_ranges([5, 1, 2, 3, 3, 9, 10, 7]) == ((1, 3), (5, 5), (7, 7), (9, 10))
    assert seq_ranges([]) == ()


def test_ack_round_trip_and_refusals() -> None:
    b = AckBatch(node="edge-a", ts=1.5, acks=(("b1", ((1, 4), (6, 6))),))
    assert parse_ack(encode_ack(b), "edge-a") == b
    with pytest.raises(WireError) as e:
        parse_ack(encode_ack(b), "edge-b")  # not ours
    assert e.value.reason == "node_mismatch"
    for bad in ([[3, 1]], [[1]], [["1", 2]], [[-1, 2]], [[1.0, 2]], "x"):
        raw = json.dumps({"v": 1, "node": "edge-a", "ts": 1,
                          "acks": [{"boot": "b", "seqs": bad}]}).encode()
        with pytest.raises(WireError):
            parse_ack(raw, "edge-a")
    too_many = json.dumps({"v": 1, "node": "edge-a", "ts": 1, "acks": [
        {"boot": "b", "seqs": [[i, i] for i in range(0, 2 * MAX_ACK_RANGES + 2, 2)]}]}).encode()
    with pytest.raises(WireError):
        parse_ack(too_many, "edge-a")


def test_acknowledger_batches_per_node_after_record_only() -> None:
    out: list[tuple[str, bytes]] = []
    a = Acknowledger(lambda t, p: out.append((t, p)), interval_s=1.0, clock=lambda: 7.0)
    assert a.flush() == 0 and out == []  # nothing ingested, nothing acked
    for s in (1, 2, 3, 5, 3):
        a.record("edge-a", "b1", s)
    a.record("edge-a", "b0", 9)
    a.record("edge-b", "x", 1)
    assert a.flush() == 2
    got = {t: parse_ack(p) for t, p in out}
    assert got[ack_topic("edge-a")].acks == (("b1", ((1, 3), (5, 5))), ("b0", ((9, 9),)))
    assert got[ack_topic("edge-b")].acks == (("x", ((1, 1),)),)
    assert a.reports == 6 and a.messages == 2
    assert a.flush() == 0  # each record acknowledged once


class _Handle:
    def __init__(self, ok: bool | None) -> None:
        self.ok = ok  # None: not confirmed yet

    def done(self) -> bool:
        return bool(self.ok)


def test_acknowledger_keeps_acks_while_down_and_sends_unconfirmed_ones_again() -> None:
    now = [10.0]
    up = [False]
    sent: list[tuple[bytes, _Handle]] = []
    next_ok: list[bool | None] = [None]

    def publish(_t: str, p: bytes) -> _Handle:
        sent.append((p, _Handle(next_ok[0])))
        return sent[-1][1]

    a = Acknowledger(publish, interval_s=1.0, clock=lambda: now[0], connected=lambda: up[0])
    a.record("edge-a", "b", 1)
    a.record("edge-a", "b", 2)
    assert a.flush() == 0 and not sent  # connection down: kept, not lost
    up[0] = True
    assert a.flush() == 1  # out once the connection is back
    assert parse_ack(sent[0][0]).acks == (("b", ((1, 2),)),)
    now[0] += 1.0
    assert a.flush() == 0  # not confirmed yet, not due again either
    sent[0][1].ok = False  # the connection died with it: never confirmed
    now[0] += RETRY_S
    next_ok[0] = True
    assert a.flush() == 1 and a.retried == 2
    assert parse_ack(sent[1][0]).acks == (("b", ((1, 2),)),)
    now[0] += RETRY_S
    assert a.flush() == 0  # confirmed: done


def test_acknowledger_splits_past_the_wire_bounds() -> None:
    out: list[bytes] = []
    a = Acknowledger(lambda t, p: out.append(p))
    for s in range(0, 2 * MAX_ACK_RANGES + 10, 2):  # all gaps: one range each
        a.record("n", "b", s)
    assert a.flush() == 1
    (batch,) = [parse_ack(p) for p in out]
    assert [len(r) for _b, r in batch.acks] == [MAX_ACK_RANGES, 5]


def test_buffer_keeps_until_core_ack_by_boot_and_seq(tmp_path: Path) -> None:
    b = ReportBuffer(tmp_path / "buf.db")
    for s in range(1, 6):
        b.put(s, 100.0 + s, b"r%d" % s, "bootA")
    b.put(1, 200.0, b"new", "bootB")
    assert b.ack_seqs("bootB", ((2, 9),)) == []  # nothing of bootB in 2..9
    gone = b.ack_seqs("bootA", ((2, 3), (5, 5)))
    assert len(gone) == 3
    assert [(p.boot, p.seq) for p in b.peek(10)] == [("bootA", 1), ("bootA", 4), ("bootB", 1)]
    b.give_up([b.peek(1)[0].id])
    assert b.refused == 1 and b.dropped == 1 and b.depth() == 2


def test_buffer_from_before_boot_column_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE reports (id INTEGER PRIMARY KEY AUTOINCREMENT, seq INTEGER NOT NULL,"
                " ts REAL NOT NULL, size INTEGER NOT NULL, payload BLOB NOT NULL)")
    con.execute("INSERT INTO reports (seq, ts, size, payload) VALUES (7, 1.0, 1, x'41')")
    con.execute("INSERT INTO reports (seq, ts, size, payload) VALUES (9, 1.0, 1, ?)",
                (b'{"v":1,"boot":"oldboot","seq":9}',))
    con.commit()
    con.close()
    b = ReportBuffer(db)
    assert [(p.boot, p.seq) for p in b.peek(5)] == [("", 7), ("oldboot", 9)]
    assert len(b.ack_seqs("oldboot", ((9, 9),))) == 1  # the core's ack finds it
    b.put(8, 2.0, b"B", "nb")
    assert len(b.ack_seqs("nb", ((8, 8),))) == 1 and b.depth() == 1


def test_window_sends_oldest_first_and_never_more_than_window() -> None:
    w: AckWindow[int] = AckWindow(window=3, resend_s=10.0)
    send, _ = w.due([1, 2, 3, 4, 5], 0.0)
    assert send == [1, 2, 3]
    w.sent(send, 0.0)
    assert w.due([1, 2, 3, 4, 5], 1.0) == ([], [])  # window full, nothing stale
    w.acked([1, 2], 1.5)
    send, _ = w.due([3, 4, 5], 2.0)
    assert send == [4, 5]


def test_window_resends_all_lost_while_core_acks_one_probe_while_it_is_silent() -> None:
    w: AckWindow[int] = AckWindow(window=10, resend_s=10.0, max_resend_s=40.0)
    w.acked([], 0.0)  # the core acks (others): alive
    w.sent([1, 2, 3], 0.5)
    w.acked([], 5.0)
    send, _ = w.due([1, 2, 3], 11.0)  # our three vanished (e.g. in a killed core's pipe)
    assert send == [1, 2, 3]
    w.sent(send, 11.0)
    # Core silent from now on: one probe per delay, the delay doubling to the cap.
    probes = []
    for t in range(12, 200):
        s, _ = w.due([1, 2, 3], float(t))
        if s:
            assert s == [1]
            w.sent(s, float(t))
            probes.append(t)
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps[:3] == [20, 40, 40] and max(gaps) == 40, probes
    # The core answers: the others go again once the broker had resend_s / 2 to
    # deliver what it may still hold for the core -- with no other ack meanwhile (the
    # agent's only traffic is these), so while the core still counts as alive.
    w.acked([1], 200.0)
    assert w.due([2, 3], 200.5) == ([], [])
    assert w.due([2, 3], 204.9) == ([], [])
    send, _ = w.due([2, 3], 205.0)
    assert send == [2]  # restarting from one in flight, paced by the acks
    assert w.cwnd == 1.0
    w.sent(send, 205.0)
    w.acked([2], 205.2)
    send, _ = w.due([3], 205.3)
    assert send == [3]


def test_window_drains_a_backlog_soon_after_a_silent_core_returns() -> None:
    """One agent, nothing else acked (a simulated clock; the agent's sender wakes on
    every ack and once a second): the core starts after the agent has sent its first
    window, which is lost, and the backlog drains in seconds once the core answers,
    not one report per resend delay (the agent stepped back into probing each time)."""
    w: AckWindow[int] = AckWindow(window=100, initial=16, resend_s=10.0)
    backlog = list(range(1, 301))
    rtt, t, up_at = 0.2, 0.0, 25.0
    delivered: list[int] = []
    pending: list[tuple[float, list[int]]] = []  # (ack arrival time, keys)
    while backlog and t < 200.0:
        send, gave = w.due(backlog[:100], t)
        assert not gave
        w.sent(send, t)
        if t >= up_at and send:  # the core is up: it ingests and acks
            delivered += send
            pending.append((t + rtt, send))
        # next wake-up: the next ack or a second later
        nxt = min([a for a, _ in pending] + [t + 1.0])
        t = nxt
        for a, keys in [p for p in pending if p[0] <= t]:
            w.acked(keys, a)
            backlog = [k for k in backlog if k not in keys]
        pending = [p for p in pending if p[0] > t]
    assert not backlog, f"{len(backlog)} left at t={t}"
    drained = t - up_at
    print(f"drained {drained:.1f} s after the core came up")
    # The first probe after up_at comes at most one resend delay later; then the
    # lost window settles for resend_s / 2 and slow start doubles per round trip.
    assert drained <= 2 * 10.0 + 10.0 / 2 + 5.0, drained


def test_window_grows_on_acks_and_halves_on_loss() -> None:
    w: AckWindow[int] = AckWindow(window=64, initial=2, resend_s=10.0)
    backlog = list(range(1, 500))
    t = 0.0
    sizes = []
    for _ in range(5):  # five acknowledged rounds: slow start doubles
        send, _ = w.due(backlog[:64], t)
        w.sent(send, t)
        sizes.append(len(send))
        t += 1.0
        w.acked(send, t)
        backlog = [k for k in backlog if k not in send]
    assert sizes == [2, 4, 8, 16, 32], sizes
    send, _ = w.due(backlog[:64], t)
    w.sent(send, t)
    assert len(send) == 64  # capped at the window
    w.acked(send[32:], t + 1)  # the older half is lost
    w.acked([], t + 9)  # the core goes on acknowledging (others)
    send, _ = w.due(backlog[:64], t + 11)
    assert w.cwnd == 32.0 and send == backlog[:32]  # halved; the lost ones first


def test_window_gives_up_a_report_the_core_keeps_refusing() -> None:
    w: AckWindow[int] = AckWindow(window=10, resend_s=1.0, max_tries=3)
    t = 0.0
    w.acked([], t)
    w.sent([1], t)
    gave: list[int] = []
    while not gave and t < 100:
        t += 1.0
        w.acked([], t)  # the core acks others all along
        send, gave = w.due([1], t)
        w.sent(send, t)
    assert gave == [1] and 1 not in w.inflight and t <= 5
