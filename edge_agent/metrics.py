"""Prometheus metrics of the agent, read at scrape time from the running agent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from edge_agent.agent import Agent


class _AgentCollector(Collector):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Any]:
        a = self.agent
        c = CounterMetricFamily("cfnet_agent_reports", "Reports by stage", labels=["stage"])
        c.add_metric(["taken"], a.stats.reports)
        c.add_metric(["published"], a.stats.published)
        c.add_metric(["resent"], a.stats.resent)
        c.add_metric(["acked"], a.stats.acked)
        yield c
        t = CounterMetricFamily("cfnet_agent_bad_acks", "Core acks that did not validate")
        t.add_metric([], a.stats.bad_acks)
        yield t
        f = GaugeMetricFamily("cfnet_agent_in_flight", "Reports sent, not yet acked by the core")
        f.add_metric([], len(a.outbox.inflight))
        yield f
        e = CounterMetricFamily("cfnet_agent_probe_errors", "Probe collection failures")
        e.add_metric([], a.stats.probe_errors)
        yield e
        b = GaugeMetricFamily("cfnet_agent_buffer_reports", "Reports waiting in the buffer")
        b.add_metric([], a.buffer.depth())
        yield b
        bb = GaugeMetricFamily("cfnet_agent_buffer_bytes", "Bytes waiting in the buffer")
        bb.add_metric([], a.buffer.size_bytes())
        yield bb
        d = CounterMetricFamily("cfnet_agent_buffer_dropped", "Reports thinned, expired or refused",
                                labels=["why"])
        d.add_metric(["thinned"], a.buffer.thinned)
        d.add_metric(["expired"], a.buffer.expired)
        d.add_metric(["refused"], a.buffer.refused)
        yield d
        m = GaugeMetricFamily("cfnet_agent_connected", "1 while connected to the broker")
        m.add_metric([], 1 if a.mqtt.connected else 0)
        yield m
        p = GaugeMetricFamily("cfnet_agent_probe", "The link probe in use", labels=["probe"])
        p.add_metric([a.probe.name], 1)
        yield p


def serve_agent_metrics(agent: Agent, port: int, addr: str = "0.0.0.0") -> Any:
    """Start /metrics for ``agent``; returns the HTTP server (call shutdown() to stop)."""
    registry = CollectorRegistry()
    registry.register(_AgentCollector(agent))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
