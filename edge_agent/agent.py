"""The agent loop: probes -> sample -> buffer -> publish.

One thread samples once per interval and writes the report to the persistent
buffer; another sends the buffer, oldest first, to the broker with QoS 1. A
report is deleted only when the *core* acknowledges it on
``cfnet/v1/nodes/{node}/ack`` (after ingesting it), never on the broker's
PUBACK: the broker's queue for a core that is down is bounded, and a core
killed with reports in its pipe has them PUBACKed but not ingested. Which
reports go when (a window in flight, resends) is ``edge_agent.outbox``. The
threads meet only at the buffer, so a slow or absent broker or core never
delays a measurement.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from edge_agent import __version__
from edge_agent.buffer import ReportBuffer
from edge_agent.host import HostSampler, local_addresses, read_interfaces
from edge_agent.outbox import AckWindow
from edge_agent.probes import LinkProbe
from edge_agent.wire import (
    LinkSample,
    NodeStatus,
    TelemetryReport,
    WireError,
    ack_topic,
    encode_report,
    encode_status,
    parse_ack,
    status_topic,
    telemetry_topic,
)
from edge_agent.wire.bus import Bus, Message

log = logging.getLogger(__name__)


@dataclass(slots=True)
class AgentStats:
    """What the agent did since it started (counters; logged at stop, read by tests)."""
    reports: int = 0
    published: int = 0  # sends, resends included
    resent: int = 0
    acked: int = 0  # reports the core acknowledged (deleted from the buffer)
    bad_acks: int = 0  # ack messages that did not validate (ignored)
    probe_errors: int = 0
    # time.monotonic() of the latest report taken, ack applied and probe failure (0: none
    # yet): what the agent's liveness and readiness (edge_agent.health) judge by
    last_report: float = 0.0
    last_ack: float = 0.0
    last_probe_error: float = 0.0


def offline_status(node: str, boot: str) -> bytes:
    return encode_status(NodeStatus(node=node, state="offline", ts=time.time(), boot=boot))


class Agent:
    def __init__(
        self,
        *,
        node: str,
        interval_s: float,
        probe: LinkProbe,
        host: HostSampler,
        mqtt: Bus,
        buffer: ReportBuffer,
        labels: tuple[tuple[str, str], ...] = (),
        boot: str | None = None,
        active_probe: Callable[[list[str]], object] | None = None,
        peers: tuple[str, ...] = (),
        include_interfaces: bool = True,
        window: int = 100,
        resend_s: float = 10.0,
    ) -> None:
        self.node = node
        self.interval_s = interval_s
        self.probe = probe
        self.host = host
        self.mqtt = mqtt
        self.buffer = buffer
        self.labels = labels
        self.boot = boot or uuid.uuid4().hex[:16]
        self.seq = 0
        self.stats = AgentStats()
        self._active_probe = active_probe
        self._peers = peers
        self._include_interfaces = include_interfaces
        self._stop = threading.Event()
        self._wake_sender = threading.Event()
        self._threads: list[threading.Thread] = []
        self.outbox: AckWindow[int] = AckWindow(window=window, resend_s=resend_s)
        self._outbox_lock = threading.Lock()
        # Re-sent on every (re)connect by the bus; the persistent session keeps acks
        # the core sent while we were away. Where a QoS 1 subscription is dear (NATS: a
        # JetStream consumer replicated on three servers, about 2 MiB and 4 ms of CPU a
        # second per agent, docs/nats.md): QoS 0, and an ack sent while we were away is
        # made up by resending, which the core deduplicates.
        qos = 1 if self.mqtt.capabilities.cheap_qos1_subscriptions else 0
        self.mqtt.subscribe(ack_topic(node), qos=qos)

    # ------------------------------------------------------------------ reports

    def sample(self) -> TelemetryReport:
        """Take one report now (probe counters are read and reset)."""
        try:
            links = self.probe.collect()
        except Exception as exc:
            # A probe failing once must not stop host metrics or the heartbeat.
            self.stats.probe_errors += 1
            self.stats.last_probe_error = time.monotonic()
            log.warning("probe %s failed: %s", self.probe.name, exc)
            links = []
        self._probe_idle_peers(links)
        self.seq += 1
        ifaces: tuple[dict[str, object], ...] = ()
        if self._include_interfaces:
            ifaces = tuple(
                {"name": i.name, "rx_bytes": i.rx_bytes, "tx_bytes": i.tx_bytes,
                 "speed_mbps": i.speed_mbps, "up": i.oper_up}
                for i in read_interfaces()
            )
        return TelemetryReport(
            node=self.node,
            seq=self.seq,
            boot=self.boot,
            ts=time.time(),
            interval_s=self.interval_s,
            probe=self.probe.name,
            resources=self.host.sample(),
            links=tuple(links),
            buffered=self.buffer.depth(),
            dropped=self.buffer.dropped,
            interfaces=ifaces,
        )

    def _probe_idle_peers(self, links: list[LinkSample]) -> None:
        if self._active_probe is None or not self._peers:
            return
        seen = {lk.peer for lk in links if lk.samples > 0}
        idle = [p for p in self._peers if p not in seen]
        if idle:
            try:
                self._active_probe(idle)
            except Exception as exc:
                log.debug("active probe failed: %s", exc)

    def tick(self) -> TelemetryReport:
        report = self.sample()
        self.buffer.put(report.seq, report.ts, encode_report(report), report.boot)
        self.stats.reports += 1
        self.stats.last_report = time.monotonic()
        self._wake_sender.set()
        return report

    # ------------------------------------------------------------------ sending

    def announce(self) -> None:
        """Retained `online` status; called on every (re)connect."""
        status = NodeStatus(
            node=self.node,
            state="online",
            ts=time.time(),
            boot=self.boot,
            addresses=local_addresses(),
            labels=self.labels,
            version=__version__,
        )
        self.mqtt.publish(status_topic(self.node), encode_status(status), qos=1, retain=True)
        self._wake_sender.set()

    def on_message(self, m: Message) -> None:
        """MQTT handler (paho's thread): the core's acks delete reports from the buffer."""
        if m.topic != ack_topic(self.node):
            return
        try:
            batch = parse_ack(m.payload, self.node)
        except WireError as exc:
            self.stats.bad_acks += 1
            log.warning("ignored an ack that does not validate: %s", exc)
            return
        ids: list[int] = []
        for boot, ranges in batch.acks:
            ids.extend(self.buffer.ack_seqs(boot, ranges))
        with self._outbox_lock:
            self.outbox.acked(ids, time.monotonic())
        self.stats.acked += len(ids)
        if ids:
            self.stats.last_ack = time.monotonic()
        self._wake_sender.set()

    def drain_once(self) -> int:
        """Send what the outbox says is due (new reports, resends); returns how many."""
        if not self.mqtt.connected:
            return 0
        head = self.buffer.peek(self.outbox.window)
        by_id = {p.id: p for p in head}
        now = time.monotonic()
        with self._outbox_lock:
            send, give_up = self.outbox.due([p.id for p in head], now)
            resent = sum(1 for i in send if i in self.outbox.inflight)
        if give_up:
            log.warning("giving up %d report(s) the core keeps not acknowledging", len(give_up))
            self.buffer.give_up(give_up)
        topic = telemetry_topic(self.node)
        for pid in send:
            self.mqtt.publish(topic, by_id[pid].payload, qos=1)
        with self._outbox_lock:
            self.outbox.sent(send, now)
        self.stats.published += len(send)
        self.stats.resent += resent
        return len(send)

    # ------------------------------------------------------------------ threads

    def _sample_loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("sampling failed")
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # we fell behind (suspended?): skip, don't burst
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            self._wake_sender.wait(self.interval_s)
            self._wake_sender.clear()
            try:
                while not self._stop.is_set() and self.drain_once() > 0:
                    pass
            except Exception:
                log.exception("publishing failed")

    def start(self) -> None:
        for target, name in ((self._sample_loop, "sampler"), (self._send_loop, "sender")):
            t = threading.Thread(target=target, name=f"cfnet-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._wake_sender.set()
        for t in self._threads:
            t.join(timeout=10)
