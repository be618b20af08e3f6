"""MQTT ingest: validate every message, count and drop bad ones, fold good ones into state.

Nothing that arrives here can crash the loop or touch state unless it fully
validates: parsing is done into the wire contract's frozen dataclasses first
(by the compiled decoder in ``decode.py``, which answers as the contract does),
and only a complete report is applied. Drops are counted by reason so an
operator can see *why* a device's data is missing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from cloud_core.decode import ReportDecoder
from cloud_core.ownership import FOLD, FoldGate
from cloud_core.state import ClusterState
from edge_agent.wire import TelemetryReport, WireError, parse_status, split_topic

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestCounters:
    accepted: int
    duplicates: int
    statuses: int
    rejected: dict[str, int]

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


class Ingest:
    def __init__(self, state: ClusterState, clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self._clock = clock
        self.decoder = ReportDecoder()
        self._lock = threading.Lock()
        self._accepted = 0
        self._duplicates = 0
        self._statuses = 0
        self._rejected: Counter[str] = Counter()
        # Log the first few drops per reason, then only count: a flood of
        # garbage must not become a flood of log lines.
        self._logged: Counter[str] = Counter()
        # Called with (node, boot, seq) once a report is in state (accepted or a
        # duplicate of one that is): the end-to-end ack (cloud_core/acks.py).
        self.on_ingested: Callable[[str, str, int], None] | None = None
        # Replicas sharing ingest: while they cannot hear each other, a report is folded
        # by its node's owner only (cloud_core/ownership.py); None: every report folded.
        self.gate: FoldGate | None = None

    def counters(self) -> IngestCounters:
        with self._lock:
            return IngestCounters(
                self._accepted, self._duplicates, self._statuses, dict(self._rejected)
            )

    def _reject(self, reason: str, topic: str, detail: str) -> str:
        with self._lock:
            self._rejected[reason] += 1
            n = self._logged[reason] = self._logged[reason] + 1
        if n <= 5:
            log.warning("dropped message on %.80s: %s: %s", topic, reason, detail[:200])
        return f"rejected:{reason}"

    def fold(self, report: TelemetryReport) -> str:
        """Fold a validated report into state and record it for the end-to-end ack;
        'accepted', or 'duplicate' when state already had it (here, or named by a peer)."""
        fresh = self.state.apply_report(report, self._clock())
        if self.on_ingested is not None:
            self.on_ingested(report.node, report.boot, report.seq)
        with self._lock:
            if not fresh:
                self._duplicates += 1
                return "duplicate"
            self._accepted += 1
        return "accepted"

    def handle(self, topic: str, payload: bytes, *, late: bool = False) -> str:
        """Process one message; returns 'accepted', 'duplicate', 'status', 'rejected:<reason>',
        or with a gate 'hold' (folded later by the gate) or 'drop' (its owner's to fold).
        ``late``: the bus says a copy of it may be with another replica (the gate's)."""
        try:
            area, ident, leaf = split_topic(topic)
            if area != "nodes":
                raise WireError("topic", f"not a node topic: {topic[:80]}")
            now = self._clock()
            if leaf == "telemetry":
                report = self.decoder.decode(payload, ident)
                gate = self.gate
                if gate is not None and (verdict := gate.check(report, late=late)) != FOLD:
                    return verdict
                return self.fold(report)
            if leaf == "status":
                if not payload:  # a cleared retained message
                    return "status"
                self.state.apply_status(parse_status(payload, topic_node=ident), now)
                with self._lock:
                    self._statuses += 1
                return "status"
            raise WireError("topic", f"unexpected leaf {leaf[:32]!r}")
        except WireError as exc:
            return self._reject(exc.reason, topic, exc.detail)
        except Exception as exc:  # a bug in validation must not kill ingest
            with self._lock:
                first = self._rejected["internal"] < 5
            if first:  # a traceback for the first few, then only the throttled count
                log.exception("ingest failed on %.80s", topic)
            return self._reject("internal", topic, repr(exc)[:200])
