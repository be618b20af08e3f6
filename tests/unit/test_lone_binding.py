"""A step's only binding is made on the loop's own thread (binder.py); a 429 there goes to the
lane, which waits as the server asks; a step of several pods binds on the lane."""

from __future__ import annotations

import threading
import time
from typing import Any

from cloud_core.errors import KubeUnavailable
from cloud_core.k8s.config import ActuatorConfig
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.k8s.wiring import build_actuator


class Bindings:
    """A fake of the API client at the binder's I/O edge: records who bound what, and
    answers 429 to the first ``throttle`` bindings sent without waiting."""

    def __init__(self, throttle: int = 0) -> None:
        self.throttle = throttle
        self.calls: list[tuple[str, str, bool]] = []  # (pod, thread, retry_after)
        self.bound: dict[str, str] = {}
        self.done = threading.Event()

    def bind_pod(self, ns: str, name: str, uid: str, node: str, *,
                 retry_after: bool = True) -> None:
        self.calls.append((name, threading.current_thread().name, retry_after))
        if not retry_after and self.throttle:
            self.throttle -= 1
            raise KubeUnavailable("POST binding: HTTP 429 TooManyRequests", 429)
        self.bound[name] = node
        self.done.set()

    def record_event(self, *a: Any, **kw: Any) -> None:
        pass


def _actuator(fake: Bindings) -> Any:
    act = build_actuator(fake, NodeRegistry(), ActuatorConfig())  # type: ignore[arg-type]
    act.handlers.on_node("ADDED", {
        "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/region": "eu"}},
        "spec": {}, "status": {"allocatable": {"cpu": "8", "memory": "8Gi"},
                               "conditions": [{"type": "Ready", "status": "True"}]}}, None)
    return act


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}",
                         "resourceVersion": "1"},
            "spec": {"schedulerName": "cfnet-scheduler",
                     "containers": [{"name": "c", "image": "x",
                                     "resources": {"requests": {"cpu": "10m"}}}]},
            "status": {"phase": "Pending"}}


def test_a_lone_pod_is_bound_on_the_loop_thread_and_a_pair_on_the_lane() -> None:
    fake = Bindings()
    act = _actuator(fake)
    try:
        act.handlers.on_pod("ADDED", _pod("alone"), None)
        act.schedule_once()
        # bound before the step returned, by the thread that ran it, not waiting on a 429
        assert fake.bound == {"alone": "n1"}
        assert fake.calls == [("alone", threading.current_thread().name, False)]
        assert act.binder.in_flight() == 0
        act.handlers.on_pod("ADDED", _pod("a"), None)
        act.handlers.on_pod("ADDED", _pod("b"), None)
        act.schedule_once()
        deadline = time.monotonic() + 10
        while len(fake.bound) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {t for n, t, _ in fake.calls[1:]} <= {f"bind-lane_{i}" for i in range(4)}
        assert [r for _, _, r in fake.calls[1:]] == [True, True]
    finally:
        act.stop()


def test_a_throttled_lone_binding_goes_to_the_lane_which_waits_as_asked() -> None:
    fake = Bindings(throttle=1)
    act = _actuator(fake)
    try:
        act.handlers.on_pod("ADDED", _pod("alone"), None)
        act.schedule_once()
        assert fake.done.wait(10)
        assert fake.bound == {"alone": "n1"}
        (p1, t1, r1), (p2, t2, r2) = fake.calls
        assert (p1, t1, r1) == ("alone", threading.current_thread().name, False)
        assert p2 == "alone" and t2.startswith("bind-lane") and r2 is True
        deadline = time.monotonic() + 10
        while act.binder.in_flight() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert act.binder.in_flight() == 0 and act.stats.bound == 1
        assert not act.binder.has_error()  # a 429 is not an unreachable API server
    finally:
        act.stop()
