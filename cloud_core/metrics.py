"""Prometheus metrics of the core, read at scrape time from the live objects.

A collector (not counters kept twice) reads ingest's counters and a state
snapshot when Prometheus scrapes, so the endpoint always shows exactly the
numbers the core itself reports (and benchmarks print). Only what has no
other home — placement latency and solver statistics — is recorded here.
Each core owns its registry: no module-level state.

The same HTTP server answers ``/healthz`` and ``/readyz`` (``cloud_core.readiness``), so the
chart's probes and Prometheus use one port. Beside cfnet's own families it exports the
standard ``process_*`` metrics (prometheus_client's ProcessCollector), ``cfnet_build_info``
and, on a Kubernetes replica, ``cfnet_leader`` (1 while this replica holds the Lease).
"""

from __future__ import annotations

import dataclasses
import math
import platform
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cloud_core import __version__
from cloud_core.errors import CoreError
from cloud_core.health import Health, HealthConfig, all_health
from cloud_core.ingest import Ingest
from cloud_core.readiness import Readiness
from cloud_core.state import ClusterState
from cloud_core.store import Store


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


class _Live(Collector):
    def __init__(self, ingest: Ingest, state: ClusterState, store: Store | None,
                 health: HealthConfig, clock: Callable[[], float]) -> None:
        self.ingest, self.state, self.store = ingest, state, store
        self.health, self.clock = health, clock

    def collect(self) -> Iterator[Any]:
        c = self.ingest.counters()
        rep = CounterMetricFamily("cfnet_reports", "Telemetry reports by outcome",
                                  labels=["result"])
        rep.add_metric(["accepted"], c.accepted)
        rep.add_metric(["duplicate"], c.duplicates)
        yield rep
        rej = CounterMetricFamily("cfnet_messages_rejected", "Messages dropped, by reason",
                                  labels=["reason"])
        for reason, n in sorted(c.rejected.items()):
            rej.add_metric([reason], n)
        yield rej
        st = CounterMetricFamily("cfnet_status_messages", "Node status messages ingested")
        st.add_metric([], c.statuses)
        yield st
        snap = self.state.snapshot(self.clock())
        health = all_health(snap, self.health)
        g = GaugeMetricFamily("cfnet_nodes", "Nodes by health", labels=["health"])
        for h in Health:
            g.add_metric([str(h)], sum(1 for v in health.values() if v is h))
        yield g
        ages = [snap.node_age(n) for n in snap.nodes if snap.nodes[n].last_report]
        s = GaugeMetricFamily("cfnet_node_staleness_seconds",
                              "Age of each node's latest report, quantiles over nodes",
                              labels=["quantile"])
        for q in (0.5, 0.9, 0.99, 1.0):
            s.add_metric([str(q)], _quantile(ages, q))
        yield s
        lk = GaugeMetricFamily("cfnet_links", "Directed links in the model")
        lk.add_metric([], len(snap.links))
        yield lk
        if self.store is not None:
            w = GaugeMetricFamily("cfnet_workloads", "Workloads by state", labels=["state"])
            counts: dict[str, int] = {}
            try:
                rows = self.store.workloads()
            except (sqlite3.Error, CoreError):
                return  # a scrape racing the core's shutdown: the store is closed
            for row in rows:
                counts[row.state] = counts.get(row.state, 0) + 1
            for k in ("pending", "planned", "placed", "unplaceable"):
                w.add_metric([k], counts.get(k, 0))
            yield w


class _Counters(Collector):
    """Counters another part keeps (read at scrape time), one labelled family."""

    def __init__(self, name: str, doc: str, label: str,
                 read: Callable[[], dict[str, int]]) -> None:
        self.name, self.doc, self.label, self.read = name, doc, label, read

    def collect(self) -> Iterator[Any]:
        fam = CounterMetricFamily(self.name, self.doc, labels=[self.label])
        for k, v in sorted(self.read().items()):
            fam.add_metric([k], v)
        yield fam


class _Gauges(Collector):
    """Gauges another part keeps (read at scrape time), one labelled family."""

    def __init__(self, name: str, doc: str, label: str,
                 read: Callable[[], dict[str, int]]) -> None:
        self.name, self.doc, self.label, self.read = name, doc, label, read

    def collect(self) -> Iterator[Any]:
        fam = GaugeMetricFamily(self.name, self.doc, labels=[self.label])
        for k, v in sorted(self.read().items()):
            fam.add_metric([k], v)
        yield fam


class _Leader(Collector):
    """``cfnet_leader``: read at scrape time from the election (absent without one)."""

    def __init__(self) -> None:
        self.read: Callable[[], bool] | None = None

    def collect(self) -> Iterator[Any]:
        if self.read is None:
            return
        g = GaugeMetricFamily("cfnet_leader", "1 while this replica holds the leader Lease")
        g.add_metric([], 1.0 if self.read() else 0.0)
        yield g


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log."""


App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def probe_app(metrics: App, readiness: Readiness) -> App:
    """``/healthz`` and ``/readyz`` in front of the Prometheus app (every other path)."""

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/livez"):
            start("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n"]
        if path == "/readyz":
            ready, body = readiness.report()
            start("200 OK" if ready else "503 Service Unavailable",
                  [("Content-Type", "text/plain; charset=utf-8")])
            return [body.encode()]
        return metrics(environ, start)

    return app


def int_fields(obj: Any) -> Callable[[], dict[str, int]]:
    """A reader of a dataclass's int fields (e.g. the Kubernetes actuator's stats)."""
    names = [f.name for f in dataclasses.fields(obj) if f.type in (int, "int")]
    return lambda: {n: int(getattr(obj, n)) for n in names}


class CoreMetrics:
    def __init__(self, ingest: Ingest, state: ClusterState, store: Store | None = None,
                 health: HealthConfig | None = None, clock: Callable[[], float] = time.time
                 ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_Live(ingest, state, store, health or HealthConfig(), clock))
        self.placement_seconds = Histogram(
            "cfnet_placement_seconds", "Wall time of one batch placement (engine + validator)",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.placement_batch = Gauge("cfnet_placement_batch_size",
                                     "Workloads in the latest placement batch",
                                     registry=self.registry)
        self.solver_gap = Gauge("cfnet_solver_gap",
                                "Relative gap of the latest solve to its bound (0: proven optimal;"
                                " NaN: no bound computed)", registry=self.registry)
        self.solver_gap.set(math.nan)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, ..._memory_...
        build = Gauge("cfnet_build_info", "The running cfnet build (value 1)",
                      ["version", "python"], registry=self.registry)
        build.labels(__version__, platform.python_version()).set(1)
        self._leader = _Leader()
        self.registry.register(self._leader)
        self.readiness = Readiness()
        self._server: _Server | None = None

    def observe_placement(self, seconds: float, batch: int, stats: dict[str, float]) -> None:
        self.placement_seconds.observe(seconds)
        self.placement_batch.set(batch)
        if "gap" in stats:
            self.solver_gap.set(stats["gap"])

    def add_counters(self, name: str, doc: str, label: str,
                     read: Callable[[], dict[str, int]]) -> None:
        """Export counters kept elsewhere (read when scraped, never copied)."""
        self.registry.register(_Counters(name, doc, label, read))

    def add_gauges(self, name: str, doc: str, label: str,
                   read: Callable[[], dict[str, int]]) -> None:
        """Export gauges kept elsewhere (read when scraped, never copied)."""
        self.registry.register(_Gauges(name, doc, label, read))

    def set_leader(self, read: Callable[[], bool]) -> None:
        """Export ``cfnet_leader`` from ``read`` (the Lease election's ``is_leader``)."""
        self._leader.read = read

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Start /metrics, /healthz and /readyz; returns the bound port (``port=0``: any)."""
        cls = _Server6 if ":" in addr else _Server
        server = make_server(addr, port, probe_app(make_wsgi_app(self.registry), self.readiness),
                             cls, handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
        self._server = server
        return int(server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
