"""Core events (placement, health, alert): kept in a bounded ring and published to MQTT."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Event:
    ts: float
    kind: str  # placement | health | alert | console
    message: str
    severity: str = "info"  # info | warning | critical
    node: str | None = None
    workload: str | None = None

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


MAX_EVENT_MESSAGE = 4000


class EventLog:
    def __init__(
        self,
        publish: Callable[[Event], None] | None = None,
        clock: Callable[[], float] = time.time,
        keep: int = 2000,
    ) -> None:
        self._publish = publish
        self._clock = clock
        self._ring: deque[Event] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def emit(
        self,
        kind: str,
        message: str,
        *,
        severity: str = "info",
        node: str | None = None,
        workload: str | None = None,
    ) -> Event:
        # an event is published as one message: its text is bounded (the size budget of
        # everything the core publishes), whatever a reason or summary grew to
        if len(message) > MAX_EVENT_MESSAGE:
            message = message[:MAX_EVENT_MESSAGE] + f"...(+{len(message) - MAX_EVENT_MESSAGE})"
        ev = Event(self._clock(), kind, message, severity, node, workload)
        with self._lock:
            self._ring.append(ev)
        if self._publish is not None:
            self._publish(ev)
        return ev

    def recent(self, limit: int = 100, kind: str | None = None) -> list[Event]:
        with self._lock:
            evs = [e for e in self._ring if kind is None or e.kind == kind]
        return evs[-limit:]
