"""End-to-end acknowledgements: tell each agent which of its reports the core ingested.

Ingest records ``(node, boot, seq)`` of every report it accepted or already had
(a duplicate is acknowledged too: the agent resent it because our earlier ack
was lost). Every ``interval_s`` this module publishes, per node that sent
anything, one message on ``cfnet/v1/nodes/{node}/ack`` (QoS 1) listing the
ingested seqs as ranges per boot. The agent deletes a report from its buffer
only on such an ack, so the ack is sent strictly after the fold into state --
in the parent process, whatever the MQTT child has PUBACKed -- and a core
killed before its next flush merely makes the agents resend the reports of the
last interval, which a fresh core folds in (a surviving one drops them as
duplicates).

Recording is one locked ``list.append`` on the ingest path; grouping and
encoding happen on this module's thread, once per interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from edge_agent.wire import (
    MAX_ACK_BOOTS,
    MAX_ACK_RANGES,
    AckBatch,
    ack_topic,
    encode_ack,
    seq_ranges,
)

log = logging.getLogger(__name__)


class Acknowledger:
    def __init__(self, publish: Callable[[str, bytes], object], interval_s: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        if interval_s <= 0:
            raise ValueError("ack interval must be > 0")
        self._publish = publish
        self.interval_s = interval_s
        self._clock = clock
        self._pending: list[tuple[str, str, int]] = []
        # Without it a record() that had fetched the old list before a swap
        # could append to it after the flush read it: an ack lost (healed by
        # the agent's resend, but a resend for nothing).
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.messages = 0  # ack messages published
        self.reports = 0  # (node, boot, seq) acknowledged, duplicates within a flush once

    def record(self, node: str, boot: str, seq: int) -> None:
        """Called by ingest after the report is folded into state (or was already there)."""
        with self._lock:
            self._pending.append((node, boot, seq))

    def flush(self) -> int:
        """Publish what was recorded since the last flush; returns the number of messages."""
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return 0
        per_node: dict[str, dict[str, list[int]]] = {}
        for node, boot, seq in batch:
            per_node.setdefault(node, {}).setdefault(boot, []).append(seq)
        now = self._clock()
        sent = 0
        for node, boots in per_node.items():
            acks: list[tuple[str, tuple[tuple[int, int], ...]]] = []
            for boot, seqs in boots.items():
                ranges = seq_ranges(seqs)
                self.reports += sum(hi - lo + 1 for lo, hi in ranges)
                for i in range(0, len(ranges), MAX_ACK_RANGES):
                    acks.append((boot, ranges[i:i + MAX_ACK_RANGES]))
            for i in range(0, len(acks), MAX_ACK_BOOTS):
                try:
                    self._publish(ack_topic(node), encode_ack(
                        AckBatch(node=node, ts=now, acks=tuple(acks[i:i + MAX_ACK_BOOTS]))))
                    sent += 1
                except Exception as exc:  # a lost ack costs a resend, never the loop
                    log.warning("ack to %s not sent: %s", node, exc)
        self.messages += sent
        return sent

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="cfnet-acks", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception:
                log.exception("ack flush failed")
