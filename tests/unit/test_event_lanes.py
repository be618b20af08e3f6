"""The event recorder's two lanes: a Node's label problems (the paced lane) are written after
the pods' events queued with them, at most ``background_per_s`` a second, and a full lane
drops and counts without blocking the caller."""

from __future__ import annotations

import threading
import time
from typing import Any

from cloud_core.k8s.events import EventRecorder, event_body


class SlowHTTP:
    """The API server's events endpoint, as seen by the recorder: records each POST's
    reason and when it came, and takes ``delay`` per write (a loaded API server)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.writes: list[tuple[float, str]] = []

    def request(self, method: str, path: str, body: Any = None, *a: Any, **kw: Any) -> None:
        time.sleep(self.delay)
        with self.lock:
            self.writes.append((time.monotonic(), str(body.get("reason"))))


def _ev(kind: str, name: str, reason: str) -> dict[str, Any]:
    return event_body({"apiVersion": "v1", "kind": kind,
                       "metadata": {"name": name, "namespace": "ns", "uid": name}},
                      reason=reason, message="m", event_type="Normal", action="A",
                      controller="cfnet-scheduler", instance="core-0")


def test_node_events_wait_for_the_pods_events_queued_with_them() -> None:
    http = SlowHTTP(delay=0.005)
    rec = EventRecorder(http, workers=2, background_per_s=1000.0)  # type: ignore[arg-type]
    for i in range(40):  # the Nodes read at start-up, before the first bindings
        rec.record(_ev("Node", f"n{i}", "NodeLabelIgnored"), background=True)
    for i in range(100):
        rec.record(_ev("Pod", f"p{i}", "Scheduled"))
    assert rec.flush(20.0)
    reasons = [r for _t, r in http.writes]
    assert reasons.count("Scheduled") == 100 and reasons.count("NodeLabelIgnored") == 40
    last_pod = max(i for i, r in enumerate(reasons) if r == "Scheduled")
    # at most the one Node event the paced writer had taken before the pods' were queued
    assert reasons[:last_pod].count("NodeLabelIgnored") <= 1, reasons
    rec.close()


def test_the_paced_lane_keeps_its_rate() -> None:
    http = SlowHTTP()
    rec = EventRecorder(http, workers=1, background_per_s=20.0)  # type: ignore[arg-type]
    t0 = time.monotonic()
    for i in range(10):
        rec.record(_ev("Node", f"n{i}", "NodeLabelInvalid"), background=True)
    deadline = time.monotonic() + 5
    while len(http.writes) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(http.writes) == 10
    took = http.writes[-1][0] - t0
    assert 0.4 <= took < 3.0, took  # 9 gaps of 50 ms, not all at once
    rec.close()


def test_a_full_paced_lane_drops_and_counts_never_blocks() -> None:
    http = SlowHTTP(delay=0.05)
    rec = EventRecorder(http, workers=1, max_queue=5,  # type: ignore[arg-type]
                        background_per_s=1.0)
    t0 = time.monotonic()
    for i in range(50):
        rec.record(_ev("Node", f"n{i}", "NodeLabelIgnored"), background=True)
    assert time.monotonic() - t0 < 0.5
    assert rec.stats["background_dropped"] >= 40
    assert rec.stats["dropped"] == 0
    assert rec.flush(10.0)  # flush lifts the pacing
    rec.close()
