"""The FailedScheduling event's conflict answer (cloud_core.k8s.conflicts): the scheduler's
message first, cfnet's after it; bounded by a queue; the per-kind tally for the metric."""

from __future__ import annotations

import threading
from typing import Any

from cloud_core.k8s.conflicts import ConflictReporter
from cloud_core.placement import (
    ClusterSnapshot,
    EngineConfig,
    LinkInfo,
    NodeInfo,
    Resources,
    Workload,
)


def _snap() -> ClusterSnapshot:
    nodes = (NodeInfo("zurich-1", "ch", "ch-a", security_level=3,
                      capacity=Resources(4000, 1 << 33)),
             NodeInfo("paris-1", "eu", "eu-a", security_level=1,
                      capacity=Resources(4000, 1 << 33)))
    return ClusterSnapshot(nodes, {("paris-1", "user"): LinkInfo(2, 3, samples=40, age_s=2)})


def _pod(uid: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "default"}}


def _stuck(uid: str) -> Workload:
    return Workload(uid, uid, requests=Resources(100, 1 << 20),
                    residency=frozenset({"eu"}), min_security_level=3)


def test_event_carries_the_conflict_after_the_scheduler_message() -> None:
    got: list[tuple[str, str]] = []
    r = ConflictReporter(_snap, EngineConfig(), lambda p, m: got.append(
        (p["metadata"]["uid"], m)), start=False)
    r.submit(_pod("a"), _stuck("a"), "0/2 nodes fit: 1 residency, 1 security level < 3")
    r.submit(_pod("a"), _stuck("a"), "0/2 nodes fit: 1 residency, 1 security level < 3")
    assert r.drain() == 1 and r.drain() == 0  # a repeat while queued is one job
    ((uid, msg),) = got
    assert uid == "a"
    assert msg.startswith("0/2 nodes fit: 1 residency, 1 security level < 3. cfnet: ")
    assert "residency eu + security level 3 admit no node" in msg
    assert "residency eu -> eu,ch: zurich-1 fits" in msg
    assert "security level 3 -> 1: paris-1 fits" in msg
    assert len(msg) <= 1024
    assert r.counts() == {"residency": 1, "security": 1}
    r.forget("a")
    assert r.counts() == {}


def test_full_queue_records_the_plain_message_at_once() -> None:
    got: list[str] = []
    r = ConflictReporter(_snap, EngineConfig(), lambda p, m: got.append(m), queue_max=1,
                         start=False)
    r.submit(_pod("a"), _stuck("a"), "first")
    r.submit(_pod("b"), _stuck("b"), "second")
    assert got == ["second"] and r.stats["skipped"] == 1
    r.drain()
    assert got[1].startswith("first. cfnet: ")


def test_a_failing_diagnosis_still_records_the_event() -> None:
    got: list[str] = []

    def broken() -> ClusterSnapshot:
        raise RuntimeError("snapshot unavailable")

    r = ConflictReporter(broken, EngineConfig(), lambda p, m: got.append(m), start=False)
    r.submit(_pod("x"), _stuck("x"), "0/2 nodes fit")
    assert r.drain() == 1
    assert got == ["0/2 nodes fit"] and r.stats["failed"] == 1 and r.counts() == {}


def test_worker_thread_records_in_the_background() -> None:
    done = threading.Event()
    got: list[str] = []

    def record(p: Any, m: str) -> None:
        got.append(m)
        done.set()

    r = ConflictReporter(_snap, EngineConfig(), record)
    try:
        r.submit(_pod("a"), _stuck("a"), "0/2 nodes fit")
        assert done.wait(30)
        assert "cfnet: " in got[0]
    finally:
        r.close()


def test_worker_waits_for_a_lull() -> None:
    got: list[str] = []
    busy = threading.Event()
    busy.set()
    done = threading.Event()

    def record(p: Any, m: str) -> None:
        got.append(m)
        done.set()

    r = ConflictReporter(_snap, EngineConfig(), record, busy=busy.is_set, max_wait_s=60)
    try:
        r.submit(_pod("a"), _stuck("a"), "0/2 nodes fit")
        assert not done.wait(0.5) and got == []  # a burst: the answer waits
        busy.clear()
        assert done.wait(30) and "cfnet: " in got[0]
    finally:
        r.close()
