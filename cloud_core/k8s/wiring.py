"""Run the Kubernetes actuator inside `cfnet-core`, fed by the core's measured links.

`cfnet-core --kubernetes` keeps MQTT ingest, health and the console of the
core, and runs the decision loop (``cloud_core.loop``) with the Kubernetes actuator as its
source of truth and actuator (pods with ``schedulerName: cfnet-scheduler``: binding,
re-placement by eviction), with Lease-based leader election between replicas. The
actuator sees the links the agents measure, translated from agent ids to Node names
through the registry's ``node-restriction.kubernetes.io/cfnet-agent-id`` labels (a label
only an administrator can set: cloud_core.k8s.registry).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cloud_core.conflicts import ConflictReporter
from cloud_core.console.service import ConsoleService
from cloud_core.events import MAX_EVENT_MESSAGE, EventLog
from cloud_core.health import HealthConfig, all_health
from cloud_core.k8s import objects
from cloud_core.k8s.actuator import Actuator, Effects, Parts
from cloud_core.k8s.binder import Binder
from cloud_core.k8s.budgets import BudgetReader
from cloud_core.k8s.cache import SchedulerCache
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.config import ActuatorConfig, ActuatorStats
from cloud_core.k8s.console import KubernetesCluster
from cloud_core.k8s.evict import DEFAULT_POLICY, EvictionPolicy
from cloud_core.k8s.gc_tuning import settle_listed, tune_gc
from cloud_core.k8s.handlers import EventHandlers
from cloud_core.k8s.informer import Reflector
from cloud_core.k8s.leader import LeaderElector
from cloud_core.k8s.ledger import MoveLedger
from cloud_core.k8s.lines import no_line
from cloud_core.k8s.moves import Moves
from cloud_core.k8s.pending import PendingPods
from cloud_core.k8s.pools import PoolController
from cloud_core.k8s.prefetch import BOUND_PODS, NODES_PATH, PAGE_SIZE, PODS_PATH, FirstLists
from cloud_core.k8s.queue import SchedulingQueue
from cloud_core.k8s.registry import NodeRegistry, RegistryConfig
from cloud_core.k8s.source import Source, SourceInputs
from cloud_core.k8s.workloads import Workloads
from cloud_core.loop import DecisionLoop
from cloud_core.placement import EngineConfig, ReplanConfig, solver
from cloud_core.placement.model import Health
from cloud_core.placement.spec import SCHEDULER_NAME as PARSER_SCHEDULER
from cloud_core.snapshot import translated_links
from cloud_core.state import ClusterState

# Seconds after the caches are synced before CP-SAT is imported in the background; then it
# waits for a lull (no pod to try, none binding), at most WARM_UP_MAX_S after the sync: the
# import (pandas, ~0.5-0.8 CPU-s holding the interpreter in long stretches) in the middle
# of a backlog's burst slowed its bindings, on the CPUs the API server shares.
WARM_UP_DELAY_S = 2.0
WARM_UP_MAX_S = 60.0


@dataclass(frozen=True, slots=True)
class KubeSettings:
    identity: str
    lease_namespace: str = "cfnet-system"
    lease_name: str = "cfnet-core"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    edge_taint: str = "respect"
    replan: ReplanConfig | None = None  # None: the engine's defaults, as in local mode
    # None: EngineConfig's defaults; cfnet-core passes what --placement-policy and
    # --exact-packing select (k8s/flags.py), as python -m cloud_core.k8s does
    engine: EngineConfig | None = None
    # what cfnet never evicts (--evict-exclude-namespaces; None: the DefaultEvictor's defaults)
    eviction: EvictionPolicy | None = None
    # how agents' silence, will and peers' links are judged (as in local mode)
    health: HealthConfig = field(default_factory=HealthConfig)


@dataclass
class KubeRunner:
    actuator: Actuator
    elector: LeaderElector
    pools: PoolController
    notices: BindingNotices | None = None

    def stop(self) -> None:
        self.elector.stop(release=True)
        self.pools.stop()
        self.actuator.stop()
        if self.notices is not None:
            self.notices.stop()  # the last bindings said before the core's connection goes


def alert_to_event(events: EventLog, say: Callable[..., None] = no_line
                   ) -> Callable[[dict[str, Any]], None]:
    """The actuator's alerts (``on_alert``) as the core's events, in the alert's own words."""

    def alert(a: dict[str, Any]) -> None:
        events.emit("alert", str(a["message"]), severity="warning", node=a.get("node"),
                    workload=a.get("pod"))
        say("alert", **a)

    return alert


class BindingNotices:
    """The bindings made, said as the core's ``placement`` events, coalesced per
    ``window_s``: one event (ring, log line, ``cfnet/v1/events`` publish) per window instead
    of one per pod. During a burst the per-pod log line and QoS 1 publish (a pickle to the
    MQTT process, paho, TLS, the broker, the PUBACK back) cost as much CPU as the binding
    itself, on the same two cores as the API server (bench_k8s --profile), and flushed
    every other event out of the console's ring. A single binding is still said alone
    ("ns/pod bound to node"); a window with more says "N pods bound: ns/a bound to n1, ..."
    naming as many as fit the event's message bound ("(+K more)" after them). Each pod's
    own record is its Kubernetes ``Scheduled`` Event, written as kube-scheduler writes it."""

    def __init__(self, events: EventLog, window_s: float = 0.5) -> None:
        self.events = events
        self.window_s = window_s
        self._items: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, pod: str, node: str) -> None:
        with self._lock:
            self._items.append((pod, node))
            first = len(self._items) == 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="binding-notices",
                                                daemon=True)
                self._thread.start()
        if first:
            self._due.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._due.wait()
            self._due.clear()
            self._stop.wait(self.window_s)  # gather the rest of the window
            self.flush()

    def flush(self) -> None:
        """Say what is gathered now."""
        with self._lock:
            items, self._items = self._items, []
        if len(items) == 1:
            pod, node = items[0]
            self.events.emit("placement", f"{pod} bound to {node}", node=node, workload=pod)
            return
        if not items:
            return
        named: list[str] = []
        size = 0
        for pod, node in items:
            part = f"{pod} bound to {node}"
            if size + len(part) > MAX_EVENT_MESSAGE - 200:
                break
            named.append(part)
            size += len(part) + 2
        more = len(items) - len(named)
        nodes = {node for _, node in items}
        self.events.emit("placement", f"{len(items)} pods bound: " + ", ".join(named)
                         + (f" (+{more} more)" if more else ""),
                         node=next(iter(nodes)) if len(nodes) == 1 else None)

    def stop(self) -> None:
        self._stop.set()
        self._due.set()
        if self._thread is not None:
            self._thread.join(5)
        self.flush()


def node_label_events(client: KubeClient, identity: str
                      ) -> Callable[[Mapping[str, Any], tuple[str, ...]], None]:
    """The registry's label problems as one Warning event on the Node (``NodeLabelIgnored``
    when a node-writable key cfnet no longer reads is there, else ``NodeLabelInvalid``),
    queued in the recorder's paced lane, never blocking the informer."""
    def emit(node: Mapping[str, Any], problems: tuple[str, ...]) -> None:
        md = node.get("metadata") or {}
        reason = ("NodeLabelIgnored" if any(" ignored: " in p for p in problems)
                  else "NodeLabelInvalid")
        client.record_event({"apiVersion": "v1", "kind": "Node",
                             "metadata": {"name": md.get("name"), "uid": md.get("uid")}},
                            reason=reason, message="; ".join(problems), event_type="Warning",
                            instance=identity, action="ReadNode",
                            background=True)  # 5,000 at start-up: not before bindings
    return emit


def build_actuator(client: KubeClient, registry: NodeRegistry | None = None,
                   config: ActuatorConfig | None = None, *,
                   is_leader: Callable[[], bool] = lambda: True,
                   on_alert: Callable[[dict[str, Any]], None] | None = None,
                   on_bound: Callable[[str, str], None] | None = None,
                   links: Callable[[], Mapping[tuple[str, str], Any]] | None = None,
                   events: EventLog | None = None,
                   agent_health: Callable[[], Mapping[str, Health]] | None = None,
                   first: FirstLists | None = None,
                   ledger: MoveLedger | None = None) -> Actuator:
    """The Kubernetes core's parts, each built once and handed what it needs, and the
    :class:`~cloud_core.k8s.actuator.Actuator` that runs them (not started).

    ``agent_health``: Node name -> its agent's verdict (heartbeats, will, peers' links:
    cloud_core.health), combined with the Node's Ready condition. ``first``: the first lists,
    asked for at the process start (prefetch.FirstLists); each reflector takes its own if it
    was asked as the reflector would ask. ``ledger``: where planned moves outlive this leader
    (the Lease, ledger.py)."""
    registry = registry or NodeRegistry()
    config = config or ActuatorConfig()
    stats = ActuatorStats()
    wake = threading.Event()
    # the pods' list pages go on: closed while the first batch is decided (Actuator.schedule_
    # once; the backlog's later pages would only compete with it for the interpreter: first
    # binding at 5,000 nodes / 10,000 pods, 20 pages of 500, ~40 ms each to decode and handle)
    pages_go = threading.Event()
    pages_go.set()
    cache = SchedulerCache(config.assumed_ttl_s)
    workloads = Workloads()
    # activeQ / backoffQ / unschedulable pods with queueing hints, fair across namespaces
    pending = PendingPods(config.scheduler_name,
                          SchedulingQueue(max_unschedulable_s=config.retry_unschedulable_s),
                          cache, registry, workloads)
    forget: list[Callable[[str], None]] = []  # what else forgets a deleted pod
    handlers = EventHandlers(client, config, stats, registry, cache, pending, workloads,
                             wake.set, on_deleted=forget)
    moves = Moves(client, config, stats, is_leader=is_leader, on_alert=on_alert, ledger=ledger,
                  recent_changes=handlers.recent_changes)
    conflicts = None
    built: list[Actuator] = []  # the actuator, once built: its lulls are the reporter's
    if config.conflict_share > 0:  # the events' conflict answers, on the cluster as it is
        conflicts = ConflictReporter(lambda: source.snapshot(), config.engine_config,
                                     lambda pod, msg: binder.record_failed(pod, msg),
                                     busy_share=config.conflict_share,
                                     busy=lambda: not built or built[0].busy(),
                                     budgets=BudgetReader(client))
    binder = Binder(client, config, stats, cache, pending, is_leader=is_leader,
                    wake=wake.set, consume_reservation=moves.consume_reservation,
                    pages_go=pages_go, on_bound=on_bound, conflicts=conflicts)
    forget += [binder.forget_pod, moves.forget_pod]
    nodes, pods = reflectors(client, config, handlers, pages_go, first)
    source = Source(config, cache, pending, SourceInputs(
        registry=registry, workloads=workloads, generation=handlers.generation,
        label_changes=handlers.take_label_changes, pinned=moves.pinned,
        bindings=binder.in_flight, bind_error=binder.has_error, pods_synced=pods.synced,
        links=links or (lambda: {}), agent_health=agent_health))
    loop = DecisionLoop(
        source, Effects(binder, moves), events or EventLog(lambda ev: None),
        engine_config=config.engine_config, replan_config=config.replan_config,
        replan_interval_s=config.replan_interval_s, replan_max_share=config.replan_max_share,
        report_assignments=config.placement_events)
    built.append(Actuator(Parts(
        config=config, stats=stats, is_leader=is_leader, registry=registry, cache=cache,
        pending=pending, workloads=workloads, handlers=handlers, source=source, binder=binder,
        moves=moves, loop=loop, nodes=nodes, pods=pods, wake=wake, pages_go=pages_go)))
    return built[0]


def reflectors(client: KubeClient, config: ActuatorConfig, handlers: EventHandlers,
               pages_go: threading.Event, first: FirstLists | None
               ) -> tuple[Reflector, Reflector]:
    """The nodes' and the pods' reflectors, feeding ``handlers``.

    The pods already on a node are listed first: with them and the nodes the engine can
    decide, so the first bindings go out while the backlog's pages still arrive. Those pages
    are asked for once the nodes are in: nothing can be placed before, and until then they
    only compete with the node list for the interpreter. Decoded into what cfnet reads of
    them (objects.py): the rest is most of the bytes. A pod's spec is whole when this
    scheduler places it, or when the spec parser would read past its schedulerName (which
    refuses any other)."""
    nodes = Reflector(client, NODES_PATH, handlers.on_node, name="nodes",
                      after_page=settle_listed, schema=objects.NODE, page_size=PAGE_SIZE,
                      first=first.nodes if first is not None else None)
    pods = Reflector(client, PODS_PATH, handlers.on_pod, name="pods",
                     # the spec parser's own name (not prefetch's copy of it): a first list
                     # asked with another is not taken
                     schema=objects.PodSchema(frozenset(
                         {config.scheduler_name, PARSER_SCHEDULER})),
                     prime=dict(BOUND_PODS), page_size=PAGE_SIZE,
                     pages_after=nodes.synced, after_page=settle_listed,
                     first=first.pods if first is not None else None,
                     first_prime=first.bound_pods if first is not None else None,
                     page_gate=pages_go)
    return nodes, pods


class AgentView:
    """What the agents say (``ClusterState``), by Node name: the registry's
    ``node-restriction.kubernetes.io/cfnet-agent-id`` labels translate agent ids."""

    def __init__(self, registry: NodeRegistry, state: ClusterState, health: HealthConfig,
                 clock: Callable[[], float]) -> None:
        self.registry = registry
        self.state = state
        self.health_config = health
        self.clock = clock

    def links(self) -> dict[tuple[str, str], Any]:
        names = self.registry.agent_names()
        return translated_links(self.state.snapshot(self.clock()), names.get)

    def health(self) -> dict[str, Health]:
        """Node name -> its agent's verdict, as local mode judges it (cloud_core.health)."""
        snap = self.state.snapshot(self.clock())
        if not snap.nodes:
            return {}
        names = self.registry.agent_names()
        return {names[a]: h for a, h in all_health(snap, self.health_config).items()
                if a in names}

    def probes(self) -> dict[str, str]:
        """Node name -> the probe its agent reports with (the console's ``nodes``)."""
        names = self.registry.agent_names()
        return {names[a]: v.probe for a, v in self.state.snapshot(self.clock()).nodes.items()
                if a in names}


def warm_up_when_quiet(actuator: Actuator, done: Callable[[], None] = lambda: None) -> None:
    """Import CP-SAT in the background once the caches hold whole lists and the first batch
    has had its moment (first binding ~1 s after start), so the import does not compete with
    it; and not during a burst (a batch that needs CP-SAT before then imports it itself).
    ``done`` once imported (the ``warm`` line: the start-up's last tail is over)."""
    def warm() -> None:
        if actuator.wait_synced(600):
            until = time.monotonic() + WARM_UP_MAX_S
            time.sleep(WARM_UP_DELAY_S)
            while actuator.busy() and time.monotonic() < until:
                time.sleep(0.2)
            solver.warm_up()
            done()

    threading.Thread(target=warm, daemon=True, name="warm-up").start()


def say_when_synced(actuator: Actuator, line: Callable[..., None]) -> None:
    """Say ``ready`` once nodes and bound pods are listed (deciding starts), ``synced``
    once the pods' list is whole."""
    def synced() -> None:
        if actuator.wait_ready(600):
            line("ready")
        if actuator.wait_synced(600):
            line("synced")

    threading.Thread(target=synced, daemon=True, name="synced").start()


def start_kubernetes(
    client: KubeClient,
    state: ClusterState,
    events: EventLog,
    settings: KubeSettings,
    clock: Callable[[], float] = time.time,
    on_lead: Callable[[], None] | None = None,
    on_follow: Callable[[], None] | None = None,
    console: ConsoleService | None = None,
    say: Callable[..., None] | None = None,
    say_bindings: bool = False,
    first: FirstLists | None = None,
) -> KubeRunner:
    """Start the actuator and the election. ``on_lead``/``on_follow`` run when this
    replica gains or loses the Lease (`cfnet-core` connects to MQTT only while leading).
    With ``console``, its cluster commands answer from and act on the cluster
    (``k8s.console.KubernetesCluster``), given to it before this replica can lead, so before
    any request can arrive. With ``say``
    (``k8s.lines.say_line``), lifecycle lines: leading, following, ready, synced, alerts and,
    with ``say_bindings``, one per binding. ``first``: the actuator's first lists, asked
    for at the process start (``prefetch.FirstLists``)."""
    line = say or no_line
    registry = NodeRegistry(RegistryConfig(edge_taint=settings.edge_taint))
    registry.on_problems = node_label_events(client, settings.identity)
    agents = AgentView(registry, state, settings.health, clock)

    def leading() -> None:
        if on_lead is not None:
            on_lead()
        events.emit("health", f"{settings.identity} is the leader")
        line("leading", identity=settings.identity)
        actuator.forget_moves()  # read the planned moves back from the Lease (moves.py)
        pools.forget_plans()  # ... and the pool plans from the pool objects (pools.py)
        actuator.wake()  # pods that arrived while following are waiting: don't sleep on them

    def following() -> None:
        events.emit("health", f"{settings.identity} stopped leading")
        line("following", identity=settings.identity)
        actuator.forget_moves()
        pools.forget_plans()
        if on_follow is not None:
            on_follow()

    notices = BindingNotices(events)

    def bound(pod: str, node: str) -> None:
        notices.add(pod, node)
        if say_bindings:
            line("bound", pod=pod, node=node)

    elector = LeaderElector(
        client, settings.lease_namespace, settings.lease_name, settings.identity,
        lease_duration_s=settings.lease_duration_s, renew_deadline_s=settings.renew_deadline_s,
        retry_period_s=settings.retry_period_s, on_started=leading, on_stopped=following,
    )
    actuator = build_actuator(
        client, registry, ActuatorConfig(identity=settings.identity, replan_config=settings.replan,
                                         engine_config=settings.engine,
                                         # bound() says each placement once it is made
                                         placement_events=False,
                                         eviction=settings.eviction or DEFAULT_POLICY),
        is_leader=elector.is_leader, on_alert=alert_to_event(events, line), links=agents.links,
        on_bound=bound, events=events, agent_health=agents.health, first=first,
        # planned moves outlive this leader on its Lease (ledger.py)
        ledger=MoveLedger(client, settings.lease_namespace, settings.lease_name,
                          settings.identity))
    if console is not None:
        console.use_cluster(KubernetesCluster(actuator, client, events, clock,
                                              agent_probes=agents.probes))
    pools = PoolController(client, actuator, is_leader=elector.is_leader)
    tune_gc()  # the core is this process: its caches are the scheduler's
    actuator.start()
    pools.start()
    # Campaign once the caches can decide (every node, every bound pod), as kube-scheduler
    # waits for its informers' sync before its leader elector runs: a replacement pod does
    # not take the Lease from a warm standby while it is still listing.
    elector.start(ready=actuator.wait_ready)
    warm_up_when_quiet(actuator, lambda: line("warm"))
    if say is not None:
        say_when_synced(actuator, line)
    return KubeRunner(actuator, elector, pools, notices)
