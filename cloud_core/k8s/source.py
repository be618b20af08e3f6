"""The actuator as the decision loop's source of truth (``loop.SourceOfTruth``).

``observe`` takes the next batch from the scheduling queue (``queue.py``; fair across
namespaces), parses it, and reads one consistent snapshot from the pod cache's sums
(``podcache.py``) plus the bindings made and not yet seen, the Node registry and the agents'
links and health; with it the pods cfnet may move, the replacements pinned to where a move
planned them (``moves.py``), and the label changes to re-validate.
"""

from __future__ import annotations

import dataclasses
import time

from cloud_core.errors import SpecError
from cloud_core.health import combined_health
from cloud_core.k8s.actuator_state import ActuatorState
from cloud_core.k8s.client import JSON
from cloud_core.k8s.podcache import _accumulate
from cloud_core.loop import Observation
from cloud_core.placement.model import (
    ClusterSnapshot,
    Health,
    NodeInfo,
    Resources,
    Workload,
    bounded_resources,
)


def _with_agent(n: NodeInfo, agent: Health | None) -> NodeInfo:
    """``n`` with its health as the Node's condition and its agent's verdict make it (the
    same object when nothing changes: the engine's per-node caches keep)."""
    h = combined_health(n.health, agent)
    return n if h is n.health else dataclasses.replace(n, health=h)


class Source(ActuatorState):
    """The loop's source of truth (see the module docstring)."""

    def snapshot(self, exclude: frozenset[str] = frozenset()) -> ClusterSnapshot:
        """Registry nodes + running pods (+ assumed bindings) as the engine's snapshot.

        Pods whose uid is in ``exclude`` are left out (to re-validate them).
        """
        return self._scan(exclude)[0]

    def _scan(self, exclude: frozenset[str] = frozenset()
              ) -> tuple[ClusterSnapshot, list[tuple[JSON, Workload, str]]]:
        """The snapshot (the pod handler's sums per node, plus the assumed bindings the
        watch has not delivered yet), and cfnet's own bound, live pods. One consistent
        view: the handler updates the sums and spends an assumption under the same lock."""
        with self._lock:
            usage = {n: a[:3] for n, a in self._usage.items()}
            running = list(self._live.values())
            own = list(self._own.values())
            assumed = [(k, v) for k, v in self._assumed.items() if k not in self._bound_keys]
            gone = [self._running_cache[u] for u in exclude if u in self._live]
        for b in gone:  # left out to be re-validated
            _accumulate(usage[b.node], b.pod.requests, -1)
        if gone:
            running = [p for p in running if p.uid not in exclude]
            own = [o for o in own if o[1].uid not in exclude]
        for _, (node, _, rp) in assumed:
            if rp is not None:
                running.append(rp)
                _accumulate(usage.setdefault(node, [0, 0, 0]), rp.requests, 1)
        # a node's sum past what cfnet counts (pods of other schedulers asking for more than
        # any node has) is that much: the node is full, and no int64 sum overflows
        allocated = {n: bounded_resources(Resources(*a)) for n, a in usage.items()}
        nodes = self.registry.node_infos(allocated)
        agents = self.agent_health() if self.agent_health is not None else None
        if agents:
            nodes = tuple(_with_agent(n, agents.get(n.name)) for n in nodes)
        snap = ClusterSnapshot(nodes=nodes, links=dict(self.links()), now=time.time(),
                               pods=tuple(running))
        return snap, own

    def _work_waiting(self) -> bool:
        """Whether a step has anything to do besides re-planning: pods to place, a cluster
        change since the last step, a binding error to report."""
        now = time.monotonic()
        with self._lock:
            gen = self._generation
            return (self._bind_error is not None or gen != self._obs_gen
                    or self.queue.has_active(now))

    def _backlog(self) -> bool:
        """Pods are still being taken batch by batch: more queued than a batch took, the
        first list still arriving, or more bindings in flight than the workers take at once
        (the end of a burst is still on its way out)."""
        return (self._more or not self.pods.synced.is_set()
                or self._binding > self.config.bind_workers)

    def pending(self) -> list[JSON]:
        """The next batch from the scheduling queue (fair across namespaces; see queue.py).
        The pods stay in flight until the step reports them placed or not."""
        now = time.monotonic()
        with self._lock:
            keys = self.queue.pop_batch(self._batch_limit(), now,
                                        self.config.max_retries_per_batch)
            out = []
            for k in keys:
                pod = self._pending.get(k)
                if pod is None or k in self._assumed:
                    self.queue.remove(k)
                else:
                    out.append(pod)
        return out

    def _batch_limit(self) -> int:
        return self.config.max_batch if self._batches else min(self.config.first_batch,
                                                                 self.config.max_batch)

    def observe(self) -> Observation:
        with self._lock:
            gen = self._generation
        limit = self._batch_limit()
        pods = self.pending()
        self._more = len(pods) >= limit
        self._batches += bool(pods)
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
            with self._lock:
                self._workloads[uid] = w
        snap, own = self._scan()
        running = []
        for pod, w, node in own:
            obs_pods[w.uid] = pod
            running.append((w, node))
        pinned = self._pinned(pending, obs_pods)
        # the loop's health map: a cordoned node is alive (its pods stay)
        health = {n.name: Health.ONLINE if n.health is Health.CORDONED else n.health
                  for n in snap.nodes}
        with self._lock:
            changes, self._pending_changes = self._pending_changes, []
            revalidate: dict[str, str] = {}
            for c in changes:
                kept = self._changes.setdefault(c.node, [])
                kept.append(c)
                del kept[:-8]  # what an alert names: the latest few changes of the node
                what = f"{c.key}: {c.old} -> {c.new}"
                revalidate[c.node] = f"{revalidate[c.node]}, {what}" \
                    if c.node in revalidate else what
        self._obs_gen = gen  # the source's own: _work_waiting compares against it
        return Observation(health=health, snapshot=snap, pending=pending, running=running,
                           invalid=invalid, pinned=pinned,
                           backlog=self._backlog(),
                           revalidate=revalidate, objects=obs_pods, generation=gen)
