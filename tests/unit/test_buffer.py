"""Store-and-forward buffer: oldest-first, survives reopen, thins with an exact count when full."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.buffer import ReportBuffer


def test_oldest_first_and_ack(tmp_path: Path) -> None:
    b = ReportBuffer(tmp_path / "b.db")
    for i in range(1, 6):
        b.put(i, 100.0 + i, f"r{i}".encode())
    got = b.peek(3)
    assert [p.seq for p in got] == [1, 2, 3]
    b.ack([got[0].id, got[1].id])
    assert [p.seq for p in b.peek(10)] == [3, 4, 5]
    assert b.depth() == 3


def test_survives_reopen(tmp_path: Path) -> None:
    b = ReportBuffer(tmp_path / "b.db")
    b.put(1, 1.0, b"x")
    b.close()
    b2 = ReportBuffer(tmp_path / "b.db")
    assert [p.payload for p in b2.peek(5)] == [b"x"]


def test_full_buffer_thins_oldest_half_and_counts_exactly(tmp_path: Path) -> None:
    payload = b"p" * 100
    b = ReportBuffer(tmp_path / "b.db", max_bytes=1000, keep_every=2)  # room for 10
    for i in range(1, 101):
        b.put(i, float(i), payload)
        assert b.size_bytes() <= 1000
    kept = [p.seq for p in b.peek(1000)]
    assert len(kept) + b.thinned == 100  # every report is either kept or counted
    assert kept == sorted(kept)
    assert kept[-1] == 100  # the newest is never thinned
    assert b.dropped == b.thinned and b.expired == 0
    # Thinning spreads over the outage rather than cutting one end: the kept
    # reports are not all from its last moments.
    assert kept[0] < 50


def test_expiry_by_age_is_counted(tmp_path: Path) -> None:
    b = ReportBuffer(tmp_path / "b.db", max_age_s=10)
    b.put(1, 0.0, b"a")
    b.put(2, 5.0, b"b")
    b.put(3, 20.0, b"c")  # now=20: the first two are older than 10 s
    assert [p.seq for p in b.peek(5)] == [3]
    assert b.expired == 2


def test_keep_every_must_free_something(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ReportBuffer(tmp_path / "b.db", keep_every=1)
