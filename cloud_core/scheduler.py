"""Local mode of the decide-and-act loop (health -> place -> validate -> apply -> re-plan).

The step itself is :class:`cloud_core.loop.DecisionLoop`, shared with Kubernetes mode.

It reads the live model only through snapshots, hands the pure engine a frozen
``ClusterSnapshot``, checks every result with the engine's independent
validator before acting, and records intent in the store *before* touching
the world, so a crash at any point is recovered by re-applying what was
planned (see ``cloud_core.store``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from cloud_core.actuators import Actuator
from cloud_core.conflicts import ConflictReporter
from cloud_core.errors import CoreError, SpecError
from cloud_core.events import EventLog
from cloud_core.health import Health, HealthConfig, all_health
from cloud_core.loop import (
    DecisionLoop,
    Move,
    Observation,
    PlaceOutcome,
    StepReport,
    what_if,
)
from cloud_core.placement import (
    ClusterSnapshot,
    EngineConfig,
    PlacementResult,
    ReplanConfig,
    Workload,
    explain,
    parse_pod,
    parse_workload_yaml,
)
from cloud_core.placement.quality import BatchQuality, QualityBook
from cloud_core.placement.relax import explain_extras
from cloud_core.registry import Registry
from cloud_core.snapshot import build_snapshot
from cloud_core.state import ClusterState
from cloud_core.store import Store, WorkloadRow

log = logging.getLogger(__name__)


def expand_doc(doc: dict[str, Any]) -> list[tuple[dict[str, Any], Workload]]:
    """One submitted document (a Pod, a controller, or the plain form, maybe with
    replicas) as stored specs, one per workload it expands to."""
    ws = parse_workload_yaml(json.dumps(doc))
    return [({"doc": doc, "index": i}, w) for i, w in enumerate(ws)]


def parse_spec(spec: dict[str, Any]) -> Workload:
    """A stored spec as the engine's Workload: ``{"doc", "index"}`` from a submit, or a Pod."""
    if "doc" in spec and "index" in spec:
        ws = parse_workload_yaml(json.dumps(spec["doc"]))
        i = spec["index"]
        if not isinstance(i, int) or not 0 <= i < len(ws):
            raise SpecError("index", f"document expands to {len(ws)} workloads, not {i}")
        return ws[i]
    if spec.get("kind") == "Pod" or "spec" in spec:
        return parse_pod(spec)
    docs = parse_workload_yaml(json.dumps(spec))
    if len(docs) != 1:
        raise SpecError("workload", "expected exactly one workload")
    return docs[0]


class Scheduler:
    """Local mode: the decision loop over the MQTT state model, the YAML registry and the
    SQLite store (:class:`SourceOfTruth`), acting through retained MQTT placement sets
    (:class:`StepActuator`). The rules themselves live in :class:`cloud_core.loop.DecisionLoop`.
    """

    def __init__(
        self,
        *,
        store: Store,
        registry: Registry,
        state: ClusterState,
        events: EventLog,
        actuator: Actuator,
        engine_config: EngineConfig | None = None,
        replan_config: ReplanConfig | None = None,
        health_config: HealthConfig | None = None,
        clock: Callable[[], float] = time.time,
        apply_interval_s: float = 0.0,
        on_placement: Callable[[float, int, dict[str, float]], None] | None = None,
        replan_interval_s: float = 1.0,
        conflict_share: float = 0.0,
    ) -> None:
        self.store = store
        self.registry = registry
        self.state = state
        self.events = events
        self.actuator = actuator
        self.health_config = health_config or HealthConfig()
        self._clock = clock
        # Pacing between node applies protects a slow control plane (and
        # lets an operator watch a large batch roll out).
        self._apply_interval_s = apply_interval_s
        self.loop = DecisionLoop(self, self, events, engine_config=engine_config,
                                 replan_config=replan_config,
                                 replan_interval_s=replan_interval_s, clock=clock,
                                 on_placement=on_placement)
        self._published: dict[str, frozenset[str]] = {}
        self._parsed: dict[str, Workload] = {}
        # the gap of the batch that placed each workload, for explain
        self.quality = QualityBook()
        self.lock = threading.RLock()
        # an unplaceable workload's minimal conflict and nearest changes, as a "conflict"
        # event, on the reporter's own thread (at most conflict_share of the interpreter;
        # 0: none), and the tally behind cfnet_unschedulable_pods
        self.conflicts: ConflictReporter | None = None
        self._answered: dict[str, str] = {}  # uid -> the message its answer was asked for
        if conflict_share > 0:
            # no PodDisruptionBudgets here: every eviction of lower priority may be suggested
            self.conflicts = ConflictReporter(self._locked_snapshot, self.engine_config,
                                              self._conflict_event, busy_share=conflict_share,
                                              budgets=lambda: ())

    @property
    def engine_config(self) -> EngineConfig:
        return self.loop.engine_config

    @engine_config.setter
    def engine_config(self, value: EngineConfig) -> None:
        self.loop.engine_config = value

    @property
    def replan_config(self) -> ReplanConfig:
        return self.loop.replan_config

    @replan_config.setter
    def replan_config(self, value: ReplanConfig) -> None:
        self.loop.replan_config = value

    # ------------------------------------------------------------------ model

    def workload(self, row: WorkloadRow) -> Workload:
        w = self._parsed.get(row.uid)
        if w is None:
            w = parse_spec(row.spec)
            if w.uid != row.uid:
                w = replace(w, uid=row.uid)
            self._parsed[row.uid] = w
        return w

    def running(self) -> list[tuple[Workload, str]]:
        out = []
        for row in self.store.workloads(("planned", "placed")):
            if row.node:
                out.append((self.workload(row), row.node))
        return out

    def health(self) -> dict[str, Health]:
        return all_health(self.state.snapshot(self._clock()), self.health_config)

    def snapshot(self) -> ClusterSnapshot:
        return self._observe_world()[1]

    def _observe_world(self) -> tuple[dict[str, Health], ClusterSnapshot,
                                      list[tuple[Workload, str]]]:
        live = self.state.snapshot(self._clock())
        health = all_health(live, self.health_config)
        running = self.running()
        snap = build_snapshot(live, self.registry, health, self.store.cordoned(), running)
        return health, snap, running

    # ------------------------------------------------------------------ SourceOfTruth

    def observe(self) -> Observation:
        pending: list[Workload] = []
        bad: dict[str, str] = {}
        for r in self.store.workloads(("pending", "unplaceable")):
            try:
                pending.append(self.workload(r))
            except CoreError as exc:
                bad[r.uid] = f"invalid spec: {exc}"
        if bad:
            self.store.mark_unplaceable(bad)
        health, snap, running = self._observe_world()
        return Observation(health=health, snapshot=snap, pending=pending, running=running,
                           invalid=bad)

    # ------------------------------------------------------------------ StepActuator

    def commit_placements(self, obs: Observation, outcome: PlaceOutcome) -> int:
        if not obs.pending:
            self._ask_conflicts(obs, {})
            return 0
        n = self.store.plan(outcome.assignments, outcome.summaries)
        self.quality.record(outcome.assignments, BatchQuality.of(outcome.stats, self._clock()))
        self.store.mark_unplaceable(outcome.failures)
        self._ask_conflicts(obs, outcome.failures)
        return n

    def _ask_conflicts(self, obs: Observation, failures: Mapping[str, str]) -> None:
        """Each workload left unplaceable gets its answer once per message (a step places
        every waiting workload, so ``failures`` is every one unplaceable now)."""
        if self.conflicts is None:
            return
        self.conflicts.retain(set(failures))
        self._answered = {u: m for u, m in self._answered.items() if u in failures}
        by_uid = {w.uid: w for w in obs.pending}
        for u, msg in failures.items():
            if u in by_uid and self._answered.get(u) != msg:
                self._answered[u] = msg
                self.conflicts.submit({"metadata": {"uid": u}}, by_uid[u], msg)

    def _locked_snapshot(self) -> ClusterSnapshot:
        with self.lock:
            return self.snapshot()

    def _conflict_event(self, pod: dict[str, Any], message: str) -> None:
        uid = str(pod["metadata"]["uid"])
        self.events.emit("conflict", f"{uid} unplaceable: {message}", severity="warning",
                         workload=uid)

    def close(self) -> None:
        """Stop the conflict reporter's thread."""
        if self.conflicts is not None:
            self.conflicts.close()

    def apply(self) -> int:
        """Push every node whose workload set changed; record planned ones as applied."""
        by_node: dict[str, list[WorkloadRow]] = {}
        for row in self.store.workloads(("planned", "placed")):
            if row.node:
                by_node.setdefault(row.node, []).append(row)
        nodes = set(by_node) | {n for n, s in self._published.items() if s}
        applied = 0
        for node in sorted(nodes):
            rows = by_node.get(node, [])
            uids = frozenset(r.uid for r in rows)
            planned = [r for r in rows if r.state == "planned"]
            if self._published.get(node) == uids and not planned:
                continue
            try:
                self.actuator.apply(node, rows)
            except CoreError as exc:
                log.warning("apply to %s failed, will retry: %s", node, exc)
                continue
            self._published[node] = uids
            for r in planned:
                if self.store.mark_applied(r.uid, node):
                    applied += 1
            if self._apply_interval_s > 0:
                time.sleep(self._apply_interval_s)
        return applied

    def commit_moves(self, obs: Observation, moves: Sequence[Move]) -> list[Move]:
        done = [m for m in moves if self.store.move(m.workload_uid, m.src, m.dst, m.reason)]
        for m in done:  # placed by the re-plan now, not by the batch that placed it first
            self.quality.forget(m.workload_uid)
        return done

    def requeue(self, stranded: Sequence[tuple[Workload, str]]) -> int:
        n = 0
        for w, node in stranded:
            if self.store.requeue(w.uid, f"node {node} is down"):
                n += 1
                self.events.emit("placement", f"{w.uid}: node {node} down, requeued",
                                 severity="warning", workload=w.uid, node=node)
        return n

    # ------------------------------------------------------------------ steps

    def report_misfits(self, obs: Observation,
                       misfits: Mapping[str, tuple[str, list[str]]]) -> None:
        """Local mode's registry is read once: no node's facts change under a running
        workload (``Observation.revalidate`` stays empty)."""

    def step(self) -> StepReport:
        with self.lock:
            return self.loop.step()

    # ------------------------------------------------------------------ read-only

    def what_if(self, workloads: list[Workload]) -> PlacementResult:
        """The engine's answer for ``workloads`` now, without recording or applying anything."""
        with self.lock:
            return what_if(self.snapshot(), workloads, self.engine_config)

    def explain(self, uid: str) -> dict[str, Any]:
        with self.lock:
            row = self.store.get(uid)
            if row is None:
                raise CoreError(f"no workload {uid!r}")
            snap, w = self.snapshot(), self.workload(row)
            ex = explain(snap, w, self.engine_config, node=row.node)
            q = self.quality.get(uid) if row.node else None
            return {"workload": uid, "state": row.state, "node": row.node, "reason": row.reason,
                    "explanation": ex,
                    **({"batch": q.doc(self._clock())} if q is not None else {}),
                    # a pod on no node although nodes fit waits on capacity: no conflict
                    **(explain_extras(snap, w, row.node, self.engine_config)
                       if row.node or not ex.fit else {})}
