"""The Kubernetes loop's scheduling queue (cloud_core/k8s/queue.py) on a fake clock:
backoff as kube-scheduler's defaults, moves driven by queueing hints, fairness across
namespaces, in-flight events. The same queue against a real API server:
tests/k8s/test_tenancy.py."""

from __future__ import annotations

from cloud_core.k8s.queue import (
    ClusterEvent,
    Event,
    Reject,
    SchedulingQueue,
    rejections,
)


def test_backoff_doubles_from_1s_to_10s_as_upstream_defaults() -> None:
    q = SchedulingQueue()
    assert [q.backoff_s(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_a_namespace_backlog_does_not_hide_another_namespaces_pod() -> None:
    q = SchedulingQueue()
    for i in range(1000):
        q.add(f"noisy/p{i}", "noisy", 0, now=float(i) / 1000)
    q.add("quiet/canary", "quiet", 0, now=5.0)  # newest of all
    batch = q.pop_batch(10, now=5.0)
    assert "quiet/canary" in batch
    assert len(batch) == 10


def test_round_robin_takes_each_namespace_in_turn_priority_first() -> None:
    q = SchedulingQueue()
    q.add("a/low", "a", 0, now=0.0)
    q.add("a/high", "a", 100, now=1.0)
    q.add("b/x", "b", 0, now=0.5)
    assert q.pop_batch(3, now=2.0) in (["a/high", "b/x", "a/low"], ["b/x", "a/high", "a/low"])


def test_unschedulable_pod_waits_for_a_helpful_event_not_any_change() -> None:
    q = SchedulingQueue()
    q.add("t/p", "t", 0, now=0.0)
    assert q.pop_batch(10, now=0.0) == ["t/p"]
    q.failed("t/p", rejections("0/3 nodes fit: 3 residency"), now=0.0)
    assert q.state("t/p") == "unschedulable"
    # a pod deletion frees room: no help to a pod a node's residency rejected
    assert q.on_event(ClusterEvent(Event.POD_DELETED, node="n1"), now=5.0) == 0
    assert not q.has_active(5.0)
    # a node change may help: back to active (its 1 s backoff is over)
    assert q.on_event(ClusterEvent(Event.NODE_CHANGED, node="n1"), now=5.0) == 1
    assert q.pop_batch(10, now=5.0) == ["t/p"]


def test_resource_hint_asks_whether_the_freed_room_is_enough() -> None:
    q = SchedulingQueue()
    q.add("t/big", "t", 0, now=0.0)
    q.pop_batch(1, now=0.0)
    q.failed("t/big", rejections("0/2 nodes fit: 2 insufficient cpu"), now=0.0)
    assert q.on_event(ClusterEvent(Event.POD_DELETED, node="n1"), 3.0,
                      fits_after=lambda key, node: False) == 0
    assert q.on_event(ClusterEvent(Event.POD_DELETED, node="n1"), 3.0,
                      fits_after=lambda key, node: True) == 1


def test_moved_pod_still_backing_off_goes_to_backoff_then_active() -> None:
    q = SchedulingQueue()
    q.add("t/p", "t", 0, now=0.0)
    for attempt in range(1, 4):  # 1 s, 2 s, then 4 s of backoff
        now = 100.0 * attempt
        assert q.pop_batch(1, now=now) == ["t/p"]
        q.failed("t/p", [Reject.RESOURCES], now=now)
        q.on_event(ClusterEvent(Event.NODE_CHANGED), now=now)
    assert q.state("t/p") == "backoff"
    assert not q.has_active(303.9)
    assert q.has_active(304.0)


def test_event_while_in_flight_sends_the_failed_pod_to_backoff() -> None:
    q = SchedulingQueue()
    q.add("t/p", "t", 0, now=0.0)
    q.pop_batch(1, now=0.0)
    q.on_event(ClusterEvent(Event.NODE_CHANGED), now=0.1)  # while it was being decided
    q.failed("t/p", [Reject.NODE], now=0.2)
    assert q.state("t/p") == "backoff"


def test_unschedulable_pod_is_retried_after_max_wait_without_events() -> None:
    q = SchedulingQueue(max_unschedulable_s=30.0)
    q.add("t/p", "t", 0, now=0.0)
    q.pop_batch(1, now=0.0)
    q.failed("t/p", [Reject.SPEC], now=0.0)
    assert not q.has_active(29.0)
    assert q.has_active(30.0)


def test_gang_hint_is_per_namespace() -> None:
    q = SchedulingQueue()
    q.add("a/w0", "a", 0, now=0.0, gang="train")
    q.pop_batch(1, now=0.0)
    q.failed("a/w0", rejections("gang train: 1 of 2 placed"), now=0.0)
    assert q.on_event(ClusterEvent(Event.PENDING_ADDED, namespace="b", gang="train"), 5) == 0
    assert q.on_event(ClusterEvent(Event.PENDING_ADDED, namespace="a", gang="train"), 5) == 1


def test_lost_in_flight_pods_are_tried_again_and_removed_pods_never() -> None:
    q = SchedulingQueue()
    q.add("t/a", "t", 0, now=0.0)
    q.add("t/b", "t", 0, now=0.0)
    assert q.pop_batch(5, now=0.0) == ["t/a", "t/b"]
    q.remove("t/b")  # bound
    assert q.pop_batch(5, now=1.0) == ["t/a"]  # the step never reported t/a
    assert len(q) == 1


def test_rejections_read_from_engine_messages() -> None:
    assert rejections("invalid workload spec: spec.x: bad") == {Reject.SPEC}
    assert Reject.RESOURCES in rejections("0/5 nodes fit: 5 insufficient memory")
    assert Reject.ANTI_AFFINITY in rejections("0/5 nodes fit: 5 pod anti-affinity")
    assert rejections("something new") == {Reject.UNKNOWN}


class FakeKubeClient:
    """A fake at the actuator's I/O edge (events, bindings): the same path against a real
    API server is tests/k8s/test_tenancy.py."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.bound: list[tuple[str, str, str]] = []

    def record_event(self, pod: dict, **kw: object) -> None:
        self.events.append((pod["metadata"]["name"], str(kw.get("reason"))))

    emit_event = record_event

    def bind_pod(self, ns: str, name: str, uid: str, node: str, **kw: object) -> None:
        self.bound.append((ns, name, node))


def test_actuator_backlog_plus_deletions_leaves_the_canary_first() -> None:
    from cloud_core.k8s.config import ActuatorConfig
    from cloud_core.k8s.registry import NodeRegistry
    from cloud_core.k8s.wiring import build_actuator

    fake = FakeKubeClient()
    act = build_actuator(fake, NodeRegistry(),  # type: ignore[arg-type]
                   ActuatorConfig(max_batch=50, first_batch=50))
    rv = [0]

    def pod(ns: str, name: str, cpu: str, node: str | None = None) -> dict:
        rv[0] += 1
        spec: dict = {"schedulerName": "cfnet-scheduler" if node is None else "other",
                      "containers": [{"name": "c", "image": "x",
                                      "resources": {"requests": {"cpu": cpu}}}]}
        if node:
            spec["nodeName"] = node
        return {"metadata": {"name": name, "namespace": ns, "uid": f"{ns}-{name}",
                             "resourceVersion": str(rv[0])},
                "spec": spec, "status": {"phase": "Pending"}}

    try:
        act.handlers.on_node("ADDED", {
            "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/region": "eu"}},
            "spec": {}, "status": {"allocatable": {"cpu": "8", "memory": "8Gi"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}, None)
        for i in range(120):  # distinct, fit no node; more than a batch
            act.handlers.on_pod("ADDED", pod("noisy", f"big-{i}", str(100 + i)), None)
        busy = [pod("noisy", f"busy-{i}", "10m", "n1") for i in range(10)]
        for b in busy:
            act.handlers.on_pod("ADDED", b, None)
        for _ in range(3):
            act.schedule_once()
        assert act.stats.failed_scheduling == 120
        act.handlers.on_pod("ADDED", pod("canary", "c0", "100m"), None)
        for k in range(30):  # deletions that free 10m: no help to any backlog pod
            act.handlers.on_pod("DELETED", busy.pop(0), None)
            busy.append(pod("noisy", f"busy-x{k}", "10m", "n1"))
            act.handlers.on_pod("ADDED", busy[-1], None)
        popped = act.queue.stats.popped
        act.schedule_once()
        assert act.queue.stats.popped - popped == 1  # the canary alone
    finally:
        act.stop()
    assert ("canary", "c0", "n1") in fake.bound


def test_retries_are_taken_in_short_batches_new_pods_not_held_back() -> None:
    q = SchedulingQueue(max_unschedulable_s=30.0)
    for i in range(300):
        q.add(f"noisy/p{i}", "noisy", 0, now=0.0)
    first = q.pop_batch(1000, now=0.0)
    assert len(first) == 300
    for k in first:
        q.failed(k, [Reject.RESOURCES], now=0.0)
    q.add("canary/c", "canary", 0, now=40.0)
    batch = q.pop_batch(1000, now=40.0, retry_limit=100)  # all 300 flushed at 30 s
    assert "canary/c" in batch and len(batch) == 101
    for k in batch:
        q.remove(k)  # bound (or reported): nothing left in flight
    assert len(q.pop_batch(1000, now=40.0, retry_limit=100)) == 100


def test_the_pods_list_is_held_while_the_first_batch_is_decided() -> None:
    """The actuator closes its pod list's page gate (informer.Reflector(page_gate=)) while
    its first batch is decided, and opens it once that batch's bindings are submitted;
    later batches do not close it."""
    from cloud_core.k8s.config import ActuatorConfig
    from cloud_core.k8s.registry import NodeRegistry
    from cloud_core.k8s.wiring import build_actuator

    fake = FakeKubeClient()
    act = build_actuator(fake, NodeRegistry(),  # type: ignore[arg-type]
                   ActuatorConfig(max_batch=5, first_batch=2))
    assert act.pods.page_gate is act.pages_go and act.pages_go.is_set()
    seen: list[bool] = []
    place = act.loop.place

    def placing(obs):  # type: ignore[no-untyped-def]
        seen.append(act.pages_go.is_set())
        return place(obs)

    act.loop.place = placing  # type: ignore[method-assign]
    try:
        act.handlers.on_node("ADDED", {
            "metadata": {"name": "n1"}, "spec": {},
            "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}, None)
        for i in range(6):
            act.handlers.on_pod("ADDED", {
                "metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}",
                             "resourceVersion": str(i + 1)},
                "spec": {"schedulerName": "cfnet-scheduler",
                         "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Pending"}}, None)
        act.schedule_once()
        assert act.pages_go.is_set()  # open again once the first batch is out
        act.schedule_once()
    finally:
        act.stop()
    assert seen == [False, True]
    assert len(fake.bound) == 2 + 4
