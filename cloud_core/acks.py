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

What is recorded survives the loss of the core's bus connection (its MQTT child killed,
a bus node gone): while the connection is down nothing is flushed, and an ack message the
bus never confirmed within ``RETRY_S`` (its connection died with it) is sent again. Every
report the core folded is thus acknowledged once the connection is back, well within the
agent's ``resend_s`` of a short outage, instead of being resent by the agent and offered
to another replica that might fold it a second time. An ack sent twice costs nothing: the
agent ignores an ack for a report it no longer holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from edge_agent.wire import (
    MAX_ACK_BOOTS,
    MAX_ACK_RANGES,
    AckBatch,
    ack_topic,
    encode_ack,
    seq_ranges,
)

log = logging.getLogger(__name__)

# An ack message the bus has not confirmed this long after it went out is sent again.
RETRY_S = 3.0
# (node, boot, seq) kept while the connection is down, at most: past it the oldest go (the
# agents resend those reports, which the core takes as duplicates and acknowledges).
MAX_KEPT = 200_000

_Entry = tuple[str, str, int]


class Acknowledger:
    def __init__(self, publish: Callable[[str, bytes], Any], interval_s: float = 1.0,
                 clock: Callable[[], float] = time.time,
                 connected: Callable[[], bool] = lambda: True) -> None:
        if interval_s <= 0:
            raise ValueError("ack interval must be > 0")
        self._publish = publish
        self.interval_s = interval_s
        self._clock = clock
        self._connected = connected
        self._pending: list[_Entry] = []
        # Ack messages out and not yet confirmed: (sent at, delivery handle or None when
        # the publish failed, entries).
        self._unconfirmed: list[tuple[float, Any, list[_Entry]]] = []
        # Without it a record() that had fetched the old list before a swap
        # could append to it after the flush read it: an ack lost (healed by
        # the agent's resend, but a resend for nothing).
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.messages = 0  # ack messages published
        self.reports = 0  # (node, boot, seq) acknowledged, duplicates within a flush once
        self.retried = 0  # (node, boot, seq) sent again: their first ack was not confirmed

    def flush(self) -> int:
        """Publish what was recorded since the last flush, and again what the bus did not
        confirm; returns the number of messages (0 while the connection is down)."""
        if not self._connected():
            return 0
        now = self._clock()
        with self._lock:
            batch, self._pending = self._pending, []
        kept: list[tuple[float, Any, list[_Entry]]] = []
        for t, h, entries in self._unconfirmed:
            if h is not None and h.done():
                continue
            if h is not None and now - t < RETRY_S:
                kept.append((t, h, entries))
            else:  # not sent, or not confirmed in time (its connection died with it)
                batch.extend(entries)
                self.retried += len(entries)
        self._unconfirmed = kept
        if not batch:
            return 0
        per_node: dict[str, dict[str, list[int]]] = {}
        for node, boot, seq in batch:
            per_node.setdefault(node, {}).setdefault(boot, []).append(seq)
        sent = 0
        for node, boots in per_node.items():
            acks: list[tuple[str, tuple[tuple[int, int], ...]]] = []
            for boot, seqs in boots.items():
                ranges = seq_ranges(seqs)
                self.reports += sum(hi - lo + 1 for lo, hi in ranges)
                for i in range(0, len(ranges), MAX_ACK_RANGES):
                    acks.append((boot, ranges[i:i + MAX_ACK_RANGES]))
            for i in range(0, len(acks), MAX_ACK_BOOTS):
                part = acks[i:i + MAX_ACK_BOOTS]
                entries = [(node, b, q) for b, rs in part for lo, hi in rs
                           for q in range(lo, hi + 1)]
                try:
                    h = self._publish(ack_topic(node), encode_ack(
                        AckBatch(node=node, ts=now, acks=tuple(part))))
                    sent += 1
                except Exception as exc:  # a lost ack costs a retry, never the loop
                    log.warning("ack to %s not sent: %s", node, exc)
                    self._unconfirmed.append((now, None, entries))
                    continue
                if callable(getattr(h, "done", None)):  # else nothing to ask: taken as sent
                    self._unconfirmed.append((now, h, entries))
        del self._unconfirmed[:-MAX_KEPT]
        self.messages += sent
        return sent

    def record(self, node: str, boot: str, seq: int) -> None:
        """Called by ingest after the report is folded into state (or was already there)."""
        with self._lock:
            self._pending.append((node, boot, seq))
            if len(self._pending) > 2 * MAX_KEPT:  # connection down a long while
                del self._pending[:MAX_KEPT]

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
