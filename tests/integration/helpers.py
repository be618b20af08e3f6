"""Helpers for integration tests: MQTT settings from broker credentials, bounded waits,
and simulated agents that publish schema-valid reports (a stand-in for the agent
process, named as such; the real agent is exercised in the end-to-end tests)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from cloud_core.bus_retained import NatsLogin
from edge_agent.agent import offline_status
from edge_agent.wire import (
    LinkSample,
    NodeStatus,
    Resources,
    RttStats,
    TelemetryReport,
    encode_report,
    encode_status,
    status_topic,
    telemetry_topic,
)
from edge_agent.wire.mqtt import MqttClient, MqttSettings, Will
from tools.broker import Broker, Credentials


def settings(broker: Broker, creds: Credentials, **kw: Any) -> MqttSettings:
    """Settings for either bus: a ``tools.nats.cluster.NatsCluster`` (it has ``failover``)
    gets MQTT 3.1.1 and every node's address, Mosquitto MQTT 5."""
    failover = getattr(broker, "failover", None)
    if failover is not None:
        kw.setdefault("protocol", "mqtt311")
        kw.setdefault("failover", failover)
    return MqttSettings(
        host=broker.host, port=broker.port, username=creds.username, password=creds.password,
        tls=broker.tls, ca_file=creds.ca_file if broker.tls else None,
        client_id=kw.pop("client_id", f"{creds.username}-{uuid.uuid4().hex[:6]}"), **kw,
    )


def nats_console(broker: Broker, creds: Credentials) -> NatsLogin | None:
    """The core's native login for the retained-request check on a NATS cluster (it has
    ``nats_urls``); None on Mosquitto, whose retain-as-published does that job."""
    urls = getattr(broker, "nats_urls", None)
    if urls is None:
        return None
    return NatsLogin(urls=tuple(urls), username=creds.username, password=creds.password,
                     ca_file=creds.ca_file if broker.tls else None)


def wait_for(pred: Callable[[], Any], timeout_s: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class FakeAgent:
    """Publishes valid status and telemetry for one node (no probes): a test stand-in."""

    def __init__(self, broker: Broker, creds: Credentials, addr: str,
                 peers: dict[str, float] | None = None, cores: int = 8,
                 mem_gib: int = 16, will: bool = False) -> None:
        self.node = creds.username
        self.addr = addr
        self.peers = peers or {}  # peer address -> rtt ms
        self.cores, self.mem = cores, mem_gib << 30
        self.boot = uuid.uuid4().hex[:8]
        self.seq = 0
        # will: the retained 'offline' status the real agent leaves with the broker
        # (edge_agent.main), sent by the broker when the connection drops (crash())
        self.client = MqttClient(settings(broker, creds), will=Will(
            status_topic(self.node), offline_status(self.node, self.boot)) if will else None)
        self.client.start()
        assert self.client.wait_connected(10), self.client.last_refusal

    def announce(self) -> None:
        st = NodeStatus(node=self.node, state="online", ts=time.time(), boot=self.boot,
                        addresses=(self.addr,))
        assert self.client.publish(status_topic(self.node), encode_status(st), retain=True).wait(5)

    def report(self) -> None:
        self.seq += 1
        links = tuple(
            LinkSample(peer=p, rtt_us=RttStats(rtt * 1000, rtt * 1100, rtt * 900), retrans=0,
                       segs_out=100, loss=0.0, tx_bps=1e6, rx_bps=1e6, samples=10)
            for p, rtt in self.peers.items()
        )
        r = TelemetryReport(
            node=self.node, seq=self.seq, boot=self.boot, ts=time.time(), interval_s=1.0,
            probe="ebpf", resources=Resources(cpu_cores=self.cores, cpu_util=0.1,
                                              mem_total_bytes=self.mem, mem_used_bytes=1 << 30),
            links=links,
        )
        assert self.client.publish(telemetry_topic(self.node), encode_report(r)).wait(5)

    def crash(self) -> None:
        """Drop the connection without DISCONNECT, as a crashed agent does (its will fires)."""
        self.client.stop(graceful=False)

    def close(self) -> None:
        self.client.stop()
