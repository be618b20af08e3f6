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

from cloud_core.console.service import ConsoleService
from cloud_core.events import MAX_EVENT_MESSAGE, EventLog
from cloud_core.health import HealthConfig, all_health
from cloud_core.k8s.actuator import Actuator, ActuatorConfig, tune_gc
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.console import KubernetesCluster
from cloud_core.k8s.evict import DEFAULT_POLICY, EvictionPolicy
from cloud_core.k8s.leader import LeaderElector
from cloud_core.k8s.ledger import MoveLedger
from cloud_core.k8s.lines import no_line
from cloud_core.k8s.pools import PoolController
from cloud_core.k8s.prefetch import FirstLists
from cloud_core.k8s.registry import NodeRegistry, RegistryConfig
from cloud_core.placement import EngineConfig, ReplanConfig, solver
from cloud_core.placement.model import Health
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
    queued, never blocking the informer."""
    def emit(node: Mapping[str, Any], problems: tuple[str, ...]) -> None:
        md = node.get("metadata") or {}
        reason = ("NodeLabelIgnored" if any(" ignored: " in p for p in problems)
                  else "NodeLabelInvalid")
        client.record_event({"apiVersion": "v1", "kind": "Node",
                             "metadata": {"name": md.get("name"), "uid": md.get("uid")}},
                            reason=reason, message="; ".join(problems), event_type="Warning",
                            instance=identity, action="ReadNode")
    return emit


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

    def links() -> dict[tuple[str, str], Any]:
        names = registry.agent_names()
        return translated_links(state.snapshot(clock()), names.get)

    def agent_health() -> dict[str, Health]:
        """Node name -> its agent's verdict, as local mode judges it (cloud_core.health)."""
        snap = state.snapshot(clock())
        if not snap.nodes:
            return {}
        names = registry.agent_names()
        return {names[a]: h for a, h in all_health(snap, settings.health).items()
                if a in names}

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
    actuator = Actuator(
        client, registry, ActuatorConfig(identity=settings.identity, replan_config=settings.replan,
                                         engine_config=settings.engine,
                                         # bound() says each placement once it is made
                                         placement_events=False,
                                         eviction=settings.eviction or DEFAULT_POLICY),
        is_leader=elector.is_leader, on_alert=alert_to_event(events, line), links=links,
        on_bound=bound,
        events=events, agent_health=agent_health, first=first,
    )
    # planned moves outlive this leader on its Lease (ledger.py)
    actuator.ledger = MoveLedger(client, settings.lease_namespace, settings.lease_name,
                                 settings.identity)
    def agent_probes() -> dict[str, str]:
        """Node name -> the probe its agent reports with (the console's ``nodes``)."""
        names = registry.agent_names()
        return {names[a]: v.probe for a, v in state.snapshot(clock()).nodes.items()
                if a in names}

    if console is not None:
        console.use_cluster(KubernetesCluster(actuator, client, events, clock,
                                              agent_probes=agent_probes))
    pools = PoolController(client, actuator, is_leader=elector.is_leader)
    tune_gc()  # the core is this process: its caches are the scheduler's
    actuator.start()
    pools.start()
    # Campaign once the caches can decide (every node, every bound pod), as kube-scheduler
    # waits for its informers' sync before its leader elector runs: a replacement pod does
    # not take the Lease from a warm standby while it is still listing.
    elector.start(ready=actuator.wait_ready)
    def warm() -> None:
        # once the caches hold whole lists, and the first batch has had its moment
        # (first binding ~1 s after start), so the import does not compete with it; and
        # not during a burst (a batch that needs CP-SAT before then imports it itself)
        if actuator.wait_synced(600):
            until = time.monotonic() + WARM_UP_MAX_S
            time.sleep(WARM_UP_DELAY_S)
            while actuator.busy() and time.monotonic() < until:
                time.sleep(0.2)
            solver.warm_up()

    threading.Thread(target=warm, daemon=True, name="warm-up").start()
    if say is not None:
        def synced() -> None:
            if actuator.wait_ready(600):
                line("ready")  # nodes and bound pods listed: deciding starts
            if actuator.wait_synced(600):
                line("synced")

        threading.Thread(target=synced, daemon=True, name="synced").start()
    return KubeRunner(actuator, elector, pools, notices)
