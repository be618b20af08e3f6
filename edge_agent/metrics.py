"""Prometheus metrics of the agent, read at scrape time from the running agent.

Served on the agent's metrics port by :mod:`edge_agent.health`, which imports this module
at the first scrape. ``cfnet_agent_loader`` names the eBPF loader in use and why (value 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from edge_agent.agent import Agent
from edge_agent.loaderinfo import Loader


class _AgentCollector(Collector):
    def __init__(self, agent: Agent, loader: Loader) -> None:
        self.agent = agent
        self.loader = loader

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
        ld = GaugeMetricFamily("cfnet_agent_loader", "The eBPF loader in use (core, bcc; none:"
                               " a probe without eBPF) and why (value 1)",
                               labels=["loader", "reason"])
        ld.add_metric([self.loader.name, self.loader.why[:200]], 1)
        yield ld


def exposition(agent: Agent, loader: Loader) -> Callable[[], bytes]:
    """A function returning ``agent``'s metrics in Prometheus' text format, read when called."""
    registry = CollectorRegistry()
    registry.register(_AgentCollector(agent, loader))
    return lambda: generate_latest(registry)
