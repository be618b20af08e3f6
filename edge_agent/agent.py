"""The agent loop: probes -> sample -> buffer -> publish.

One thread samples once per interval and writes the report to the persistent
buffer; another drains the buffer, oldest first, to the broker with QoS 1 and
deletes a report only when the broker has acknowledged it. The two meet only at
the buffer, so a slow or absent broker never delays a measurement.
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
from edge_agent.mqtt import MqttClient, PublishHandle
from edge_agent.probes import LinkProbe
from edge_agent.wire import (
    LinkSample,
    NodeStatus,
    TelemetryReport,
    encode_report,
    encode_status,
    status_topic,
    telemetry_topic,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class AgentStats:
    reports: int = 0
    published: int = 0
    publish_timeouts: int = 0
    probe_errors: int = 0


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
        mqtt: MqttClient,
        buffer: ReportBuffer,
        labels: tuple[tuple[str, str], ...] = (),
        boot: str | None = None,
        active_probe: Callable[[list[str]], object] | None = None,
        peers: tuple[str, ...] = (),
        include_interfaces: bool = True,
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

    # ------------------------------------------------------------------ reports

    def sample(self) -> TelemetryReport:
        """Take one report now (probe counters are read and reset)."""
        try:
            links = self.probe.collect()
        except Exception as exc:
            # A probe failing once must not stop host metrics or the heartbeat.
            self.stats.probe_errors += 1
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
        self.buffer.put(report.seq, report.ts, encode_report(report))
        self.stats.reports += 1
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

    def drain_once(self, batch: int = 20, ack_timeout_s: float = 5.0) -> int:
        """Publish up to ``batch`` buffered reports, oldest first; returns how many were acked."""
        if not self.mqtt.connected:
            return 0
        pending = self.buffer.peek(batch)
        handles: list[tuple[int, PublishHandle]] = []
        topic = telemetry_topic(self.node)
        for p in pending:
            handles.append((p.id, self.mqtt.publish(topic, p.payload, qos=1)))
        acked: list[int] = []
        for pid, h in handles:
            # Stop at the first unacknowledged one: acking later ones would let
            # a retry deliver out of order.
            if not h.wait(ack_timeout_s):
                self.stats.publish_timeouts += 1
                break
            acked.append(pid)
        self.buffer.ack(acked)
        self.stats.published += len(acked)
        return len(acked)

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
