"""The decide-and-act loop: health -> place pending -> validate -> apply -> re-plan.

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
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cloud_core.actuators import Actuator
from cloud_core.errors import CoreError, SpecError
from cloud_core.events import EventLog
from cloud_core.health import Health as LiveHealth
from cloud_core.health import HealthConfig, all_health
from cloud_core.placement import (
    ClusterSnapshot,
    EngineConfig,
    PlacementResult,
    ReplanConfig,
    ReplanState,
    Workload,
    explain,
    parse_pod,
    parse_workload_yaml,
    place,
    plan_moves,
    validate,
)
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


@dataclass(frozen=True, slots=True)
class StepReport:
    placed: int = 0
    unplaceable: int = 0
    applied: int = 0
    moves: int = 0
    violations: int = 0


class Scheduler:
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
    ) -> None:
        self.store = store
        self.registry = registry
        self.state = state
        self.events = events
        self.actuator = actuator
        self.engine_config = engine_config or EngineConfig()
        self.replan_config = replan_config or ReplanConfig()
        self.health_config = health_config or HealthConfig()
        self._clock = clock
        # Pacing between node applies protects a slow control plane (and
        # lets an operator watch a large batch roll out).
        self._apply_interval_s = apply_interval_s
        self._on_placement = on_placement
        # The re-planner counts SLA strikes per call, and a strike should be
        # one *measurement* interval: calling it every 0.5 s step would turn
        # "3 intervals" into 1.5 s and let one spike report move a workload.
        # So it runs once per report interval, or at once when health changes.
        self._replan_interval_s = replan_interval_s
        self._last_replan = -1e18
        self._health_changed = False
        self._replan_state = ReplanState()
        self._health: dict[str, LiveHealth] = {}
        self._published: dict[str, frozenset[str]] = {}
        self._parsed: dict[str, Workload] = {}
        self.lock = threading.RLock()

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

    def health(self) -> dict[str, LiveHealth]:
        return all_health(self.state.snapshot(self._clock()), self.health_config)

    def snapshot(self) -> ClusterSnapshot:
        live = self.state.snapshot(self._clock())
        return build_snapshot(
            live,
            self.registry,
            all_health(live, self.health_config),
            self.store.cordoned(),
            self.running(),
        )

    # ------------------------------------------------------------------ steps

    def check_health(self) -> dict[str, LiveHealth]:
        now = self.health()
        for node, h in sorted(now.items()):
            old = self._health.get(node)
            if old != h and not (old is None and h is LiveHealth.UNKNOWN):
                self._health_changed = True
                sev = {"down": "critical", "unreachable": "warning", "suspect": "warning"}
                self.events.emit(
                    "health",
                    f"node {node}: {old or 'new'} -> {h}",
                    severity=sev.get(str(h), "info"),
                    node=node,
                )
        self._health = now
        return now

    def place_pending(self) -> tuple[int, int, int]:
        rows = self.store.workloads(("pending", "unplaceable"))
        if not rows:
            return 0, 0, 0
        workloads: list[Workload] = []
        bad: dict[str, str] = {}
        for r in rows:
            try:
                workloads.append(self.workload(r))
            except CoreError as exc:
                bad[r.uid] = f"invalid spec: {exc}"
        if bad:
            self.store.mark_unplaceable(bad)
        if not workloads:
            return 0, len(bad), 0
        t0 = time.perf_counter()
        snap = self.snapshot()
        result = place(snap, workloads, self.engine_config)
        assignments = dict(result.assignments)
        violations = validate(snap, workloads, assignments)
        if self._on_placement is not None:
            self._on_placement(time.perf_counter() - t0, len(workloads), dict(result.stats))
        for v in violations:
            # The validator is the last line of defence: a decision that breaks a
            # hard constraint is never acted on, whatever the engine said.
            log.error("engine proposed a violation, not acting: %s", v)
            self.events.emit("alert", f"validator rejected {v.workload_uid} on {v.node}: "
                             f"{v.constraint} ({v.detail})", severity="critical",
                             workload=v.workload_uid, node=v.node)
            assignments.pop(v.workload_uid, None)
        details = {d.workload_uid: d.summary for d in result.decisions}
        n = self.store.plan(assignments, details)
        failed = {
            d.workload_uid: d.summary or "; ".join(d.reasons)
            for d in result.decisions
            if d.workload_uid not in assignments
        }
        before = {r.uid: r.reason for r in rows}
        self.store.mark_unplaceable(failed)
        for d in result.decisions:
            if d.workload_uid in assignments:
                self.events.emit("placement", f"{d.workload_uid} -> {d.node}: {d.summary}",
                                 node=d.node, workload=d.workload_uid)
            elif before.get(d.workload_uid) != failed[d.workload_uid]:
                self.events.emit("placement", f"{d.workload_uid} unplaceable: "
                                 f"{failed[d.workload_uid]}", severity="warning",
                                 workload=d.workload_uid)
        return n, len(failed) + len(bad), len(violations)

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

    def replan(self, *, force: bool = False) -> int:
        now = self._clock()
        due = now - self._last_replan >= self._replan_interval_s or self._health_changed
        if not (due or force):
            return 0
        self._last_replan, self._health_changed = now, False
        running = self.running()
        if not running:
            return 0
        snap = self.snapshot()
        moves, self._replan_state = plan_moves(
            snap, running, self._replan_state, self.replan_config
        )
        n = 0
        for m in moves:
            if self.store.move(m.workload_uid, m.src, m.dst, m.reason):
                n += 1
                self.events.emit("placement", f"move {m.workload_uid}: {m.src} -> {m.dst} "
                                 f"({m.reason})", severity="warning", workload=m.workload_uid,
                                 node=m.dst)
        # A workload on a down node that the engine could not move anywhere goes
        # back to pending, so it is placed as soon as capacity appears.
        down = {n.name for n in snap.nodes if n.health == "down"}
        moved = {m.workload_uid for m in moves}
        for w, node in running:
            if node in down and w.uid not in moved and self.store.requeue(
                w.uid, f"node {node} is down"
            ):
                self.events.emit("placement", f"{w.uid}: node {node} down, requeued",
                                 severity="warning", workload=w.uid, node=node)
        return n

    def step(self) -> StepReport:
        with self.lock:
            self.check_health()
            placed, unplaceable, violations = self.place_pending()
            applied = self.apply()
            moves = self.replan()
            if moves:
                applied += self.apply()
            return StepReport(placed, unplaceable, applied, moves, violations)

    # ------------------------------------------------------------------ read-only

    def what_if(self, workloads: list[Workload]) -> PlacementResult:
        """The engine's answer for ``workloads`` now, without recording or applying anything."""
        with self.lock:
            return place(self.snapshot(), workloads, self.engine_config)

    def explain(self, uid: str) -> dict[str, Any]:
        with self.lock:
            row = self.store.get(uid)
            if row is None:
                raise CoreError(f"no workload {uid!r}")
            ex = explain(self.snapshot(), self.workload(row), self.engine_config, node=row.node)
            return {"workload": uid, "state": row.state, "node": row.node, "reason": row.reason,
                    "explanation": ex}
