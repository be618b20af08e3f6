"""The running core: MQTT ingest, the decide-and-act loop and the console service, wired.

This is where I/O meets the pure parts: messages from the broker are routed by
topic to ingest (telemetry, status) or to the console (requests); replies go
back on the operator's own response topic with the request's correlation data;
a loop thread runs the scheduler's steps; events go out on ``cfnet/v1/events``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cloud_core.acks import Acknowledger
from cloud_core.actuators import Actuator
from cloud_core.actuators.local import LocalActuator
from cloud_core.console.commands import COMMANDS
from cloud_core.console.context import ConsoleContext
from cloud_core.console.local import LocalCluster
from cloud_core.console.protocol import Response, encode_response
from cloud_core.console.service import ConsoleService
from cloud_core.events import Event, EventLog
from cloud_core.health import HealthConfig
from cloud_core.ingest import Ingest
from cloud_core.metrics import CoreMetrics
from cloud_core.mqtt_process import LATE_PROPERTY, MqttProcess
from cloud_core.ownership import FoldGate
from cloud_core.registry import Registry
from cloud_core.replicas import DigestExchange
from cloud_core.scheduler import Scheduler
from cloud_core.state import ClusterState
from cloud_core.store import Store
from edge_agent.wire import (
    DIGEST_WILDCARD,
    EVENTS_TOPIC,
    REQUEST_WILDCARD,
    STATUS_WILDCARD,
    TELEMETRY_WILDCARD,
    WireError,
    response_topic,
    split_topic,
)
from edge_agent.wire.bus import Bus, Message
from edge_agent.wire.mqtt import MqttClient, MqttSettings

if TYPE_CHECKING:  # the NATS adapter (asyncio: 0.1 s of start-up) only when it is used
    from cloud_core.bus_nats import NatsIngestSettings
    from cloud_core.bus_retained import NatsLogin, RetainedStore

log = logging.getLogger(__name__)

# Requests one operator may have queued or running; more are refused at once ("busy") so
# that one account's burst cannot starve the console workers other operators need.
MAX_INFLIGHT_PER_OPERATOR = 2


@dataclass(frozen=True, slots=True)
class CoreConfig:
    mqtt: MqttSettings
    db_path: Path = Path("/var/lib/cfnet-core/core.db")
    registry: Registry = field(default_factory=Registry)
    roles: dict[str, str] = field(default_factory=dict)  # operator -> viewer|operator|admin
    step_interval_s: float = 0.5
    apply_interval_s: float = 0.0
    # an unplaceable workload's minimal conflict and nearest changes (cloud_core/conflicts.py)
    # take at most this share of the interpreter, on their own thread; 0: none
    conflict_share: float = 0.2
    share_group: str | None = None
    health: HealthConfig = HealthConfig()
    place: bool = True  # False on a follower replica: ingest only
    console: bool = True  # answer console requests (the placing replica does)
    digest_interval_s: float = 1.0  # with share_group: how often replicas exchange digests
    metrics_port: int | None = None  # None: no /metrics endpoint; 0: any free port
    metrics_addr: str = "0.0.0.0"
    # MQTT in a child process (cloud_core/mqtt_process.py), so receiving and
    # ingesting use two CPUs: what cfnet-core runs. False only where a test or
    # benchmark says why it needs one process.
    mqtt_process: bool = True
    # End-to-end acks to agents (cloud_core/acks.py): how often, per node.
    ack_interval_s: float = 1.0
    # The NATS bus: shared ingest (share_group) through a JetStream consumer that
    # the replicas share (cloud_core/bus_nats_ingest.py); needs mqtt_process.
    nats: NatsIngestSettings | None = None
    # The NATS bus: the console's native connection to the bus's retained store, which
    # tells a request published with retain from a live one (cloud_core/bus_retained.py).
    nats_console: NatsLogin | None = None


class CoreService:
    def __init__(self, cfg: CoreConfig, *, clock: Callable[[], float] = time.time,
                 actuator: Actuator | None = None) -> None:
        self.cfg = cfg
        self._clock = clock
        self.state = ClusterState()
        self.ingest = Ingest(self.state, clock)
        self.store = Store(cfg.db_path, clock)
        self.events = EventLog(self._publish_event, clock)
        self.mqtt: Bus = (
            MqttProcess(cfg.mqtt, on_message=self._on_message, nats=cfg.nats)
            if cfg.mqtt_process
            else MqttClient(cfg.mqtt, on_message=self._on_message)
        )
        self.acks = Acknowledger(
            lambda topic, payload: self.mqtt.publish(topic, payload, qos=1),
            cfg.ack_interval_s, clock, connected=lambda: self.mqtt.connected)
        self.ingest.on_ingested = self.acks.record
        self.actuator = actuator or LocalActuator(
            lambda topic, payload: self.mqtt.publish(topic, payload, qos=1, retain=True),
            on_refused=lambda node, msg: self.events.emit(
                "placement", msg, severity="critical", node=node),
        )
        self.metrics = CoreMetrics(self.ingest, self.state, self.store, cfg.health, clock)
        self.metrics_port: int | None = None
        self.metrics.add_counters(
            "cfnet_acks", "End-to-end acks to agents: messages sent, reports acknowledged",
            "what", lambda: {"messages": self.acks.messages, "reports": self.acks.reports,
                             "retried": self.acks.retried})
        if isinstance(self.mqtt, MqttProcess):
            child = self.mqtt
            self.metrics.add_counters(
                "cfnet_bus_process_restarts", "MQTT child processes started again after "
                "exiting unasked", "what", lambda: {"restarts": child.restarts})
            if cfg.nats is not None:
                self.metrics.add_counters(
                    "cfnet_shared_ingest", "Shared ingest on NATS: reports fetched, dropped "
                    "with their JetStream ack unconfirmed, fetch errors", "what",
                    lambda: {k: child.ingest.get(k, 0)
                             for k in ("fetched", "unconfirmed", "errors")})
                self.metrics.add_gauges(
                    "cfnet_shared_ingest_behind", "Shared ingest on NATS: how long the last "
                    "fetched report waited in the stream (lag_ms), reports still waiting "
                    "(behind)", "what",
                    lambda: {k: child.ingest.get(k, 0) for k in ("lag_ms", "behind")})
        if self.mqtt.capabilities.edge_sites:
            bus = self.mqtt
            self.metrics.add_counters(
                "cfnet_edge_site_events", "Edge sites (--nats-sites): sources linked, link "
                "attempts failed, stalled sources re-armed, sources removed (site dropped), "
                "edge streams created again (wiped leaf store); summed over sites",
                "event", lambda: {k: sum(v.values()) for k, v in bus.edge_site_events().items()})
        self.scheduler = Scheduler(
            store=self.store, registry=cfg.registry, state=self.state, events=self.events,
            actuator=self.actuator, health_config=cfg.health, clock=clock,
            apply_interval_s=cfg.apply_interval_s, on_placement=self.metrics.observe_placement,
            # only where this loop places (with Kubernetes the actuator's reporter answers)
            conflict_share=cfg.conflict_share if cfg.place else 0.0,
        )
        if (conflicts := self.scheduler.conflicts) is not None:
            self.metrics.add_gauges("cfnet_unschedulable_pods", "Unschedulable pods by "
                                    "conflicting constraint", "constraint", conflicts.counts)
            self.metrics.add_counters("cfnet_conflict_answers", "Conflict answers of "
                                      "unplaceable workloads", "outcome",
                                      lambda: dict(conflicts.stats))
        local = LocalCluster(state=self.state, store=self.store, scheduler=self.scheduler,
                             events=self.events, registry=cfg.registry,
                             health_config=cfg.health, clock=clock)
        self.console = ConsoleService(
            cfg.roles.get, ConsoleContext(local, self.state, self.ingest, self.events,
                                          self.store.audit_log, clock),
            commands=COMMANDS, audit=self.store.audit, clock=clock)
        prefix = f"$share/{cfg.share_group}/" if cfg.share_group else ""
        self.digests: DigestExchange | None = None
        self.gate: FoldGate | None = None
        if cfg.share_group:
            self.digests = self._share(cfg, clock)
        for t in (TELEMETRY_WILDCARD, STATUS_WILDCARD):
            self.mqtt.subscribe(prefix + t, qos=1)
        # Console requests are never shared: a `submit` must reach the replica
        # that places, not whichever one the broker picks next.
        if cfg.console:
            # retain-as-published: a request sent with the retain flag shows it even when
            # delivered live, so it is refused at once, not only after a restart
            self.mqtt.subscribe(REQUEST_WILDCARD, qos=1, retain_as_published=True)
            # On NATS (MQTT 3.1.1) the flag is not shown live: the bus's retained store is
            # asked instead (cloud_core/bus_retained.py).
        self.retained: RetainedStore | None = None
        if cfg.console and cfg.nats_console is not None:
            from cloud_core.bus_retained import RetainedStore

            self.retained = RetainedStore(cfg.nats_console)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cfnet-console")
        self._inflight: dict[str, int] = {}
        self._inflight_lock = threading.Lock()
        self._stop = threading.Event()
        self._loop: threading.Thread | None = None
        self.steps = 0

    def start(self, *, connect: bool = True) -> None:
        """Start serving; ``connect=False`` leaves MQTT to :meth:`connect` (on leadership)."""
        if self.cfg.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.cfg.metrics_port, self.cfg.metrics_addr)
            log.info("metrics on http://%s:%d/metrics", self.cfg.metrics_addr, self.metrics_port)
        if self.retained is not None:
            self.retained.start()
        if connect:
            self.connect()
        self.acks.start()
        if self.digests is not None:
            self.digests.start()
        if self.cfg.place:
            self._loop = threading.Thread(target=self._run, name="cfnet-scheduler", daemon=True)
            self._loop.start()

    def _share(self, cfg: CoreConfig, clock: Callable[[], float]) -> DigestExchange:
        """Ingest shared with other replicas: the digests, and the fold gate that gives each
        node one owner while the replicas cannot hear each other (cloud_core/ownership.py)."""
        replica, bus = cfg.mqtt.username or "core", self.mqtt

        # The digests' own connection: on NATS the child's native one (cloud_core/mqtt_process.py).
        def up() -> bool:
            return bool(getattr(bus, "digests_up", bus.connected))

        # The gate watches the MQTT session too: on NATS its loss comes with a bus node's
        # death, when the streams elect leaders and the ingest stream can hold two fresh
        # copies of a report (an agent's publish, and its resend after the server gave up
        # on the first one's store), which two calm replicas would both fold.
        def connected() -> bool:
            return up() and bus.connected

        def connects() -> int:
            return int(getattr(bus, "digest_connects", 0)) + int(getattr(bus, "connects", 0))

        # On NATS the MQTT session's return comes while the streams may still hand out fresh
        # copies of reports published during their elections: only owners fold for two
        # digest intervals after it, however soon the peers' digests answer.
        settle = 2 * cfg.digest_interval_s if cfg.nats is not None else 0.0
        gate = self.gate = FoldGate(replica, self.ingest.fold, connected=connected,
                                    connects=connects, settle_s=settle)
        self.ingest.gate = gate
        self.metrics.add_counters(
            "cfnet_fold_gate", "Replicas during a bus disturbance: reports held for the "
            "peers' digests, released to the fold, dropped for their node's owner or at the "
            "bound, peers taken as gone, digests refused from replicas past the bound", "what",
            lambda: {k: v for k, v in gate.counts().items() if k != "holding"})
        self.mqtt.subscribe(DIGEST_WILDCARD, qos=0)
        return DigestExchange(replica, self.state, self.mqtt, cfg.digest_interval_s, clock,
                              gate=gate, connected=up)

    def connect(self) -> None:
        """Connect to the broker (again). With one MQTT account shared by replicas
        that take turns (Kubernetes leader election), the new leader's connection
        takes over the account's persistent session, queued reports included, and
        the broker drops the old leader's connection: MQTT fences a deposed leader."""
        if not self.mqtt.connected:
            self.mqtt.start()

    def disconnect(self) -> None:
        self.mqtt.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._loop is not None:
            self._loop.join(timeout=10)
        if self.digests is not None:
            self.digests.stop()
        self.acks.stop()  # last acks out before the connection goes
        self.mqtt.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.retained is not None:
            self.retained.stop()
        self.metrics.close()
        self.scheduler.close()
        self.store.close()

    def _run(self) -> None:
        # Give agents' retained status and first reports a moment to arrive, so
        # the first step does not judge every node 'unknown'.
        self._stop.wait(min(2.0, self.cfg.step_interval_s * 4))
        while not self._stop.is_set():
            if self.mqtt.connected:
                try:
                    self.scheduler.step()
                    self.steps += 1
                except Exception:
                    log.exception("scheduler step failed")
            self._stop.wait(self.cfg.step_interval_s)

    def _publish_event(self, ev: Event) -> None:
        log.info("event %s/%s: %s", ev.kind, ev.severity, ev.message)
        if self.mqtt.connected:
            self.mqtt.publish(EVENTS_TOPIC, ev.encode(), qos=1)

    def _on_message(self, m: Message) -> None:
        if m.topic.startswith("cfnet/v1/console/"):
            self._on_request(m)
        elif m.topic.startswith("cfnet/v1/core/"):
            if self.digests is not None:
                self.digests.handle(m)
        else:
            # Marked late by the NATS shared ingest only (agents there cannot set it).
            late = self.cfg.nats is not None and LATE_PROPERTY in m.user_properties
            self.ingest.handle(m.topic, m.payload, late=late)

    def _on_request(self, m: Message) -> None:
        try:
            _area, operator, leaf = split_topic(m.topic)
        except WireError as exc:  # not a topic the ACL lets anyone publish on
            log.warning("bad console topic %.80r: %s", m.topic, exc)
            return
        if leaf != "request":
            return
        # Parsing, bounds and commands run off paho's network thread (what-if on a big
        # cluster takes a while), so ingest never stalls behind them; every request,
        # retained, unparseable or refused, gets an answer and an audit entry.
        with self._inflight_lock:
            n = self._inflight.get(operator, 0)
            if n < MAX_INFLIGHT_PER_OPERATOR:
                self._inflight[operator] = n + 1
        if n >= MAX_INFLIGHT_PER_OPERATOR:
            # one operator's burst must not queue ahead of everyone else's requests
            self.reply(operator, m, self.console.refuse(
                operator, f"busy: {n} of your requests are still running; wait for their "
                f"answers (at most {MAX_INFLIGHT_PER_OPERATOR} at a time)"))
            return

        def run() -> None:
            try:
                self.reply(operator, m, self.handle_request(operator, m))
            finally:
                with self._inflight_lock:
                    self._inflight[operator] -= 1

        self._pool.submit(run)

    def handle_request(self, operator: str, m: Message) -> Response:
        """One console request as it came off the bus: on NATS first asked of the bus's
        retained store (refused when it holds the request or cannot tell), then handled."""
        retain = m.retain
        if self.retained is not None:
            from cloud_core.bus_retained import RetainedCheckError, Verdict

            try:
                found = self.retained.check(m.topic, m.payload, m.correlation_data)
            except RetainedCheckError as exc:
                log.warning("console request of %s: %s", operator, exc)
                return self.console.refuse(
                    operator, f"unavailable: cannot tell whether the request was published "
                    f"with retain ({exc}); send it again")
            retain = retain or found is Verdict.RETAINED
        return self.console.handle_message(operator, m.payload, retain=retain)

    def reply(self, operator: str, m: Message, resp: Response) -> None:
        # Answer only on the operator's own response topic: a request naming
        # another operator's topic must not make us deliver there.
        self.mqtt.publish(
            response_topic(operator), encode_response(resp), qos=1,
            correlation_data=m.correlation_data,
        )
