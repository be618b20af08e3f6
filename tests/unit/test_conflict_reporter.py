"""The FailedScheduling event's conflict answer (cloud_core.conflicts): the scheduler's
message first, cfnet's after it; bounded by a queue; the per-kind tally for the metric."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cloud_core.conflicts import ConflictReporter
from cloud_core.errors import KubeForbidden, KubeUnavailable
from cloud_core.k8s.budgets import BudgetReader
from cloud_core.placement import (
    ClusterSnapshot,
    EngineConfig,
    LinkInfo,
    NodeInfo,
    Resources,
    RunningPod,
    Workload,
)
from cloud_core.placement.preempt import DisruptionBudget


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


def _crowded() -> ClusterSnapshot:
    """One node, its cpu held by a pod of priority 0 (counted on the node)."""
    low = RunningPod("low", "low", "default", "n1", requests=Resources(3000, 0))
    n1 = NodeInfo("n1", "eu", "eu-a", capacity=Resources(4000, 1 << 33),
                  allocated=Resources(3000, 0))
    return ClusterSnapshot((n1,), {}, pods=(low,))


def _recorder(out: list[str]) -> Callable[[dict[str, Any], str], None]:
    return lambda pod, msg: out.append(msg)


def _const(b: list[DisruptionBudget] | None) -> Callable[[], list[DisruptionBudget] | None]:
    return lambda: b


def test_event_suggests_an_eviction_only_with_the_budgets_known() -> None:
    big = Workload("big", "big", requests=Resources(2000, 1 << 20), priority=1000)
    known: list[DisruptionBudget] = []
    for budgets, said in ((known, True), (None, False)):
        got: list[str] = []
        r = ConflictReporter(_crowded, EngineConfig(), _recorder(got), start=False,
                             budgets=_const(budgets))
        r.submit(_pod("big"), big, "0/1 nodes fit: 1 insufficient cpu")
        assert r.drain() == 1
        assert "cpu 2 -> 1: n1 fits" in got[0]
        assert ("evict default/low to free 1 cpu: n1 fits (1 pod of lower priority, "
                "PodDisruptionBudgets allowing)" in got[0]) is said, got[0]


class _Lister:
    """KubeClient.list_pages at the I/O edge: pages of PodDisruptionBudgets, or an error."""

    def __init__(self, pages: list[list[dict[str, Any]]] | Exception) -> None:
        self.pages = pages
        self.calls = 0

    def list_pages(self, path: str, *, limit: int) -> Any:
        self.calls += 1
        assert path == "/apis/policy/v1/poddisruptionbudgets" and limit == 500
        if isinstance(self.pages, Exception):
            raise self.pages
        return ((p, "1") for p in self.pages)


def _pdb(name: str, selector: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": name},
            "spec": {"selector": selector}, "status": {"disruptionsAllowed": 0}}


def test_budget_reader_caches_skips_the_unreadable_and_says_none_when_refused() -> None:
    now = [0.0]
    ok = _Lister([[_pdb("db", {"matchLabels": {"app": "db"}}),
                   _pdb("bad", {"matchExpressions": [{"key": "a", "operator": "Nope"}]})]])
    reader = BudgetReader(ok, ttl_s=10.0, clock=lambda: now[0])  # type: ignore[arg-type]
    got = reader()
    assert got is not None and [b.name for b in got] == ["db"]  # as preemption skips it
    now[0] = 5.0
    assert reader() is got and ok.calls == 1  # within the ttl: no second list
    now[0] = 11.0
    reader()
    assert ok.calls == 2
    for exc in (KubeForbidden("poddisruptionbudgets is forbidden"), KubeUnavailable("down")):
        refused = BudgetReader(_Lister(exc))  # type: ignore[arg-type]
        assert refused() is None and refused.errors == 1


def test_retain_forgets_pods_no_longer_waiting() -> None:
    got: list[str] = []
    r = ConflictReporter(_snap, EngineConfig(), _recorder(got), start=False)
    for u in ("a", "b"):
        r.submit(_pod(u), _stuck(u), "0/2 nodes fit")
    assert r.drain() == 2 and r.counts() == {"residency": 2, "security": 2}
    r.submit(_pod("c"), _stuck("c"), "0/2 nodes fit")
    r.retain({"a"})  # b placed, c deleted before its answer: neither is counted nor answered
    assert r.counts() == {"residency": 1, "security": 1} and r.drain() == 0 and len(got) == 2
