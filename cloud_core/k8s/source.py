"""The decision loop's source of truth on Kubernetes (``loop.SourceOfTruth``).

``observe`` takes the next batch from the pending pods (``pending.py``; fair across
namespaces), parses it, and reads one consistent snapshot from the scheduler cache
(``cache.py``: the bound pods' sums plus the bindings made and not yet seen), the Node
registry and the agents' links and health; with it the pods cfnet may move, the replacements
pinned to where a move planned them (``moves.py``), and the label changes to re-validate.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from cloud_core.errors import SpecError
from cloud_core.health import combined_health
from cloud_core.k8s.cache import SchedulerCache
from cloud_core.k8s.client import JSON
from cloud_core.k8s.config import ActuatorConfig
from cloud_core.k8s.pending import PendingPods
from cloud_core.k8s.registry import LabelChange, NodeRegistry
from cloud_core.k8s.workloads import Workloads
from cloud_core.loop import Observation
from cloud_core.placement.model import (
    ClusterSnapshot,
    Health,
    NodeInfo,
    Resources,
    Workload,
    bounded_resources,
)
from cloud_core.placement.spec import PodParser


def _with_agent(n: NodeInfo, agent: Health | None) -> NodeInfo:
    """``n`` with its health as the Node's condition and its agent's verdict make it (the
    same object when nothing changes: the engine's per-node caches keep)."""
    h = combined_health(n.health, agent)
    return n if h is n.health else dataclasses.replace(n, health=h)


@dataclasses.dataclass(frozen=True, slots=True)
class SourceInputs:
    """What the source reads besides the cache and the pending pods (wiring.py)."""

    registry: NodeRegistry
    workloads: Workloads
    generation: Callable[[], int]  # the cluster generation (handlers.py)
    label_changes: Callable[[], list[LabelChange]]  # label changes since the last step
    # pending workloads, their pods by uid -> uid -> (node, moved pod uid) (moves.py)
    pinned: Callable[[list[Workload], Mapping[str, JSON]], dict[str, tuple[str, str]]]
    bindings: Callable[[], int]  # bindings in flight (binder.py)
    bind_error: Callable[[], bool]  # a binding met an unreachable API server (binder.py)
    pods_synced: threading.Event  # the pods' list is whole
    links: Callable[[], Mapping[tuple[str, str], Any]]
    agent_health: Callable[[], Mapping[str, Health]] | None = None


@dataclasses.dataclass
class _LastScan:
    """What ``Source._scan_changes`` built its last snapshot from."""

    nodes: tuple[NodeInfo, ...] | None = None
    pos: dict[str, int] = dataclasses.field(default_factory=dict)  # node -> index in nodes
    health: dict[str, Health] = dataclasses.field(default_factory=dict)
    version: int = -1  # the registry's
    agents: dict[str, Health] = dataclasses.field(default_factory=dict)
    facts: int = 0  # bumped each time the nodes' facts are read afresh


class Source:
    """The loop's source of truth (see the module docstring). ``observe`` runs on the loop's
    thread only; ``snapshot`` on any."""

    def __init__(self, config: ActuatorConfig, cache: SchedulerCache, pending: PendingPods,
                 inputs: SourceInputs) -> None:
        self._config = config
        self._cache = cache
        self._pending = pending
        self._in = inputs
        self._parser = PodParser()  # the loop thread's: a controller's pods parsed once
        self.batches = 0  # steps that had pending pods to place
        self.more = False  # the last batch was full: more wait
        self._obs_gen = 0  # the cluster generation the last step saw
        self._last = _LastScan()  # what observe's last snapshot was built from


    def snapshot(self, exclude: frozenset[str] = frozenset()) -> ClusterSnapshot:
        """Registry nodes + running pods (+ assumed bindings) as the engine's snapshot.

        Pods whose uid is in ``exclude`` are left out (to re-validate them).
        """
        return self._scan(exclude)[0]

    def _scan(self, exclude: frozenset[str] = frozenset()
              ) -> tuple[ClusterSnapshot, list[tuple[JSON, Workload, str]]]:
        """The snapshot (the cache's consistent view), and cfnet's own bound, live pods."""
        view = self._cache.view(exclude)
        # a node's sum past what cfnet counts (pods of other schedulers asking for more than
        # any node has) is that much: the node is full, and no int64 sum overflows
        allocated = {n: bounded_resources(Resources(*a)) for n, a in view.usage.items()}
        nodes = self._in.registry.node_infos(allocated)
        agents = self._in.agent_health() if self._in.agent_health is not None else None
        if agents:
            nodes = tuple(_with_agent(n, agents.get(n.name)) for n in nodes)
        snap = ClusterSnapshot(nodes=nodes, links=dict(self._in.links()), now=time.time(),
                               pods=tuple(view.running))
        return snap, view.own

    def _scan_changes(self) -> tuple[ClusterSnapshot, list[tuple[JSON, Workload, str]]]:
        """``_scan()`` for the loop's thread, built on the last one: when no Node or agent
        verdict changed since, only the nodes whose sums changed are read again
        (the cache says which), and the snapshot's facts token stays (``self.facts``): the
        engine then keeps its indexes of the nodes (placement.carry). The same snapshot as
        ``_scan()`` would give."""
        last = self._last
        view = self._cache.view(changes=True)
        reg = self._in.registry
        version = reg.version
        agents = dict(self._in.agent_health()) if self._in.agent_health is not None else {}
        links = dict(self._in.links())
        same = (last.nodes is not None and view.changed is not None
                and version == last.version and agents == last.agents)
        if not same or last.nodes is None:
            if view.changed is not None:  # the sums of the nodes not changed: the last ones
                view = self._cache.view()
            allocated = {n: bounded_resources(Resources(*a)) for n, a in view.usage.items()}
            nodes = reg.node_infos(allocated)
            if agents:
                nodes = tuple(_with_agent(n, agents.get(n.name)) for n in nodes)
            last.facts += 1
            last.pos = {n.name: i for i, n in enumerate(nodes)}
            last.health = {n.name: Health.ONLINE if n.health is Health.CORDONED else n.health
                           for n in nodes}
        else:
            changed = list(last.nodes)
            zero = [0, 0, 0]
            for name in view.changed or ():
                i = last.pos.get(name)
                info = reg.node_info(name, bounded_resources(Resources(
                    *view.usage.get(name, zero))))
                if i is None or info is None:
                    continue  # a Node gone meanwhile: the registry's version says so next
                changed[i] = _with_agent(info, agents.get(name)) if agents else info
            nodes = tuple(changed)
        last.nodes, last.version, last.agents = nodes, version, agents
        snap = ClusterSnapshot(nodes=nodes, links=links, now=time.time(),
                               pods=tuple(view.running))
        return snap, view.own

    def work_waiting(self) -> bool:
        """Whether a step has anything to do besides re-planning: pods to place, a cluster
        change since the last step, a binding error to report."""
        return (self._in.bind_error() or self._in.generation() != self._obs_gen
                or self._pending.has_active(time.monotonic()))

    def backlog(self) -> bool:
        """Pods are still being taken batch by batch: more queued than a batch took, the
        first list still arriving, or more bindings in flight than the workers take at once
        (the end of a burst is still on its way out)."""
        return (self.more or not self._in.pods_synced.is_set()
                or self._in.bindings() > self._config.bind_workers)

    def batch_limit(self) -> int:
        return self._config.max_batch if self.batches else min(self._config.first_batch,
                                                                self._config.max_batch)

    def pending(self) -> list[JSON]:
        """The next batch from the scheduling queue (fair across namespaces; see queue.py).
        The pods stay in flight until the step reports them placed or not."""
        return self._pending.pop(self.batch_limit(), time.monotonic(),
                                 self._config.max_retries_per_batch, self._cache.is_assumed)

    def observe(self) -> Observation:
        gen = self._in.generation()
        limit = self.batch_limit()
        pods = self.pending()
        self.more = len(pods) >= limit
        self.batches += bool(pods)
        obs_pods: dict[str, JSON] = {}
        pending: list[Workload] = []
        invalid: dict[str, str] = {}
        for pod in pods:
            uid = str((pod.get("metadata") or {}).get("uid"))
            obs_pods[uid] = pod
            try:
                w = self._parser.parse(pod)
            except SpecError as e:
                invalid[uid] = f"invalid workload spec: {e}"
                continue
            pending.append(w)
            self._in.workloads.put(uid, w)
        snap, own = self._scan_changes()
        running = []
        for pod, w, node in own:
            obs_pods[w.uid] = pod
            running.append((w, node))
        pinned = self._in.pinned(pending, obs_pods)
        # the loop's health map (a cordoned node is alive: its pods stay), built with the
        # facts: allocation changes no node's health
        health = self._last.health
        revalidate: dict[str, str] = {}
        for c in self._in.label_changes():
            what = f"{c.key}: {c.old} -> {c.new}"
            revalidate[c.node] = f"{revalidate[c.node]}, {what}" \
                if c.node in revalidate else what
        self._obs_gen = gen  # the source's own: work_waiting compares against it
        return Observation(health=health, snapshot=snap, pending=pending, running=running,
                           invalid=invalid, pinned=pinned,
                           backlog=self.backlog(),
                           revalidate=revalidate, objects=obs_pods, generation=gen,
                           facts=(id(self), self._last.facts))
