"""The one decision loop: health -> place -> validate -> apply -> re-plan, for every mode.

Both ways cfnet runs share this code. A :class:`SourceOfTruth` says what the world looks like
(the MQTT state model + YAML registry + SQLite store in local mode; informers + the Node
registry + the agents' measured links on Kubernetes) as one :class:`Observation` per step:
one health map and one ``ClusterSnapshot``, handed to every stage instead of being rebuilt
by each. A :class:`StepActuator` turns the step's decisions into effects (retained MQTT
placement sets, or ``pods/binding`` + the Eviction API).

So a rule of placement or re-placement (the validator as last line of defence, the
re-planner's hysteresis, strikes and cool-down, what happens to a workload stranded on a
down node) is written once, here and in ``cloud_core.placement``, and holds in both modes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cloud_core.events import EventLog
from cloud_core.placement import (
    Carry,
    ClusterSnapshot,
    EngineConfig,
    NodeFacts,
    PlacementResult,
    ReplanConfig,
    ReplanState,
    Workload,
    place,
    plan_moves,
    validate,
)
from cloud_core.placement.model import Health, Resources, RunningPod
from cloud_core.placement.replan import Move

log = logging.getLogger(__name__)

__all__ = [
    "DecisionLoop",
    "Move",
    "Observation",
    "PlaceOutcome",
    "SourceOfTruth",
    "StepActuator",
    "StepReport",
    "what_if",
    "with_placements",
]


@dataclass(frozen=True)
class Observation:
    """The world as one step sees it: taken once, handed to every stage."""

    # node -> health (the one health map of the step); a map once handed is never changed
    # (the loop takes the same object again as "no change": a source may hand it every step)
    health: Mapping[str, Health]
    snapshot: ClusterSnapshot  # the engine's view, built with ``health``
    pending: Sequence[Workload]  # to place now
    running: Sequence[tuple[Workload, str]]  # (workload, node) placed and counted in snapshot
    invalid: Mapping[str, str] = field(default_factory=dict)  # uid -> why it cannot be parsed
    # uid -> (node, predecessor uid): a pending replacement for a workload the loop moved;
    # it goes where the move planned (checked by the validator), keeping the cool-down.
    pinned: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # More workloads wait beyond ``pending`` (a backlog taken batch by batch), or the
    # placements of one are still being carried out: re-planning waits for it, up to
    # ``DecisionLoop.REPLAN_BACKLOG_DEFER_S`` past its due time.
    backlog: bool = False
    # node -> what changed of its residency / security facts since the last observation
    # (region, zone, security level): the running workloads there are checked again, and one
    # that no longer fits is moved by the re-planner like any other move.
    revalidate: Mapping[str, str] = field(default_factory=dict)
    # What the sink needs to act on this step's decisions, carried here rather than parked
    # on the adapter between observe() and commit: uid -> the source's own object for that
    # workload (a Pod on Kubernetes; opaque to the loop), and the source's version of the
    # world the observation was taken at (events written for it say which one they saw).
    objects: Mapping[str, Any] = field(default_factory=dict)
    generation: int = 0
    # A token for the nodes' facts: two observations with the same token (not None) have the
    # same nodes, in the same order, with the same facts, and differ at most in allocation,
    # pods and links; the engine then keeps its indexes of the nodes from one
    # step to the next (placement.carry). None: no such promise (prepared afresh each step).
    facts: Hashable | None = None


@dataclass(frozen=True)
class PlaceOutcome:
    """The engine's decisions for the pending workloads, after the validator."""

    assignments: dict[str, str]  # uid -> node, validated
    failures: dict[str, str]  # uid -> why it was not placed (engine or validator)
    summaries: dict[str, str]  # uid -> the engine's words for a placement
    rejected: list[Any]  # validator Violations of the engine's own choices
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepReport:
    placed: int = 0
    unplaceable: int = 0
    applied: int = 0
    moves: int = 0
    violations: int = 0


class SourceOfTruth(Protocol):
    """Where a step reads the world from."""

    def observe(self) -> Observation: ...


class StepActuator(Protocol):
    """Where a step's decisions take effect. Each method returns how many took effect."""

    def commit_placements(self, obs: Observation, outcome: PlaceOutcome) -> int: ...

    def apply(self) -> int: ...

    def commit_moves(self, obs: Observation, moves: Sequence[Move]) -> list[Move]: ...

    def requeue(self, stranded: Sequence[tuple[Workload, str]]) -> int: ...

    def report_misfits(self, obs: Observation,
                       misfits: Mapping[str, tuple[str, list[str]]]) -> None:
        """Running workloads (uid -> (node, the validator's complaints)) that no longer fit
        their node after its facts changed; said once per workload, before they move."""


def without(snapshot: ClusterSnapshot, w: Workload, node: str) -> ClusterSnapshot:
    """``snapshot`` without running workload ``w`` on ``node`` (its pod and its requests), so
    that the validator can judge the binding afresh."""
    pods = tuple(p for p in snapshot.pods if p.uid != w.uid)
    nodes = tuple(dataclasses.replace(n, allocated=n.allocated - w.requests)
                  if n.name == node else n for n in snapshot.nodes)
    return dataclasses.replace(snapshot, nodes=nodes, pods=pods)


def with_placements(snapshot: ClusterSnapshot, workloads: Sequence[Workload],
                    assignments: Mapping[str, str]) -> ClusterSnapshot:
    """``snapshot`` with ``assignments`` counted as running (allocation and pods)."""
    if not assignments:
        return snapshot
    by_uid = {w.uid: w for w in workloads}
    extra: dict[str, Resources] = {}
    pods = list(snapshot.pods)
    for uid, node in assignments.items():
        w = by_uid.get(uid)
        if w is None:
            continue
        extra[node] = extra.get(node, Resources()) + w.requests
        pods.append(RunningPod.of(w, node))
    nodes = tuple(dataclasses.replace(n, allocated=n.allocated + extra[n.name])
                  if n.name in extra else n for n in snapshot.nodes)
    return dataclasses.replace(snapshot, nodes=nodes, pods=tuple(pods))


_SEVERITY = {"down": "critical", "unreachable": "warning", "suspect": "warning"}
# Nodes first seen online in one step are each an event up to this many; more (a cluster
# listed at start-up) are one event that names the first of them
ARRIVALS_SAID_SINGLY = 16


class DecisionLoop:
    """One step of deciding, the same in every mode (see the module docstring)."""

    def __init__(self, source: SourceOfTruth, actuator: StepActuator, events: EventLog, *,
                 engine_config: EngineConfig | None = None,
                 replan_config: ReplanConfig | None = None, replan_interval_s: float = 1.0,
                 replan_max_share: float | None = None,
                 clock: Callable[[], float] = time.time,
                 on_placement: Callable[[float, int, dict[str, float]], None] | None = None,
                 report_assignments: bool = True) -> None:
        self.source = source
        # an event per placed workload; off where the actuator says the same once the
        # placement is made (Kubernetes: "bound to", cloud_core.k8s.wiring)
        self.report_assignments = report_assignments
        self.actuator = actuator
        self.events = events
        self.engine_config = engine_config or EngineConfig()
        self.replan_config = replan_config or ReplanConfig()
        self._clock = clock
        self._on_placement = on_placement
        # The re-planner counts SLA strikes per call, and a strike should be one
        # *measurement* interval: calling it every step would turn "3 intervals" into a
        # fraction of that and let one spike move a workload. So it runs once per report
        # interval, or at once when health changes.
        self.replan_interval_s = replan_interval_s
        # At scale an observation plus plan_moves over every running pod costs a good part
        # of a second (10,000 pods: 0.1-0.5 s): with ``replan_max_share`` set, the interval
        # stretches so that re-planning takes at most that share of the loop's time. The cost
        # is this thread's CPU time (time.thread_time), not the wall clock: on a machine
        # whose CPUs other processes share (load 17-22 on 2 cores), a three-node re-plan's
        # wall time reached 0.43 s, stretched the interval to 4.25 s and delayed an SLA move
        # by as much (tools/bench_reaction_k8s.py), while the core spent no more of its CPU.
        self.replan_max_share = replan_max_share
        self._replan_cost = 0.0  # CPU seconds the last re-planning step took (observe + plan)
        self._last_replan = -1e18
        # A re-plan not yet run is overdue from the loop's start, not from the epoch: the
        # first one may wait for a backlog like any other (see _defer)
        self._started = clock()
        self._health_changed = False
        self._deferred_at: float | None = None  # when a backlog last deferred a due re-plan
        self.replan_state = ReplanState()
        self.health: dict[str, Health] = {}
        self._health_seen: Mapping[str, Health] | None = None  # the map last found equal
        self._reported: dict[str, str] = {}  # uid -> last unplaceable reason reported
        # node -> what changed: nodes whose running workloads are checked at each re-plan
        # until none there is left that no longer fits (a move a budget refused is retried)
        self._revalidate: dict[str, str] = {}
        self._misfits_said: set[str] = set()
        self._carry = Carry()  # the last step's prepared cluster (Observation.facts)
        # the validator's reading of the nodes, kept from step to step (validate.NodeFacts)
        self._node_facts = NodeFacts()
        # this thread's CPU (time.thread_time) at the start of the step under way, if any:
        # a small batch's CPU budget (placement/budget.py) counts from it
        self._step_cpu0: float | None = None

    @staticmethod
    def what_if(snapshot: ClusterSnapshot, workloads: Sequence[Workload],
                config: EngineConfig | None = None) -> PlacementResult:
        """The engine's answer for ``workloads`` on ``snapshot``, decided nothing and acted on
        nothing (the consoles' ``what-if``). A member of the loop so that the loop is the only
        caller of the engine's ``place`` and ``plan_moves`` in the core
        (tests/unit/test_one_loop.py)."""
        return place(snapshot, list(workloads), config or EngineConfig())

    # ------------------------------------------------------------------ stages

    def note_health(self, now: Mapping[str, Health]) -> None:
        if now is self._health_seen or now == self.health:
            # The usual step: nothing changed. The source's own map again (a source hands
            # the same map while no node changed, and never changes one it handed), or a
            # dict comparison (in C) instead of sorting and walking 5,000 nodes every step.
            self._health_seen = now
            return
        arrived: list[str] = []  # first seen, online
        for node, h in sorted(now.items()):
            old = self.health.get(node)
            if old != h and not (old is None and h is Health.UNKNOWN):
                if old is None and h is Health.ONLINE:
                    # A node first seen online strands no running workload: it needs no
                    # re-plan before the interval's. (At start-up every listed Node
                    # arrives: forcing one there ran plan_moves over 5,000 nodes inside
                    # the first batch's step, ahead of the backlog it would defer to.)
                    arrived.append(node)
                    continue
                self._health_changed = True
                self.events.emit("health", f"node {node}: {old or 'new'} -> {h}",
                                 severity=_SEVERITY.get(str(h), "info"), node=node)
        if len(arrived) > ARRIVALS_SAID_SINGLY:
            # A cluster listed at start-up (5,000 Nodes) is not 5,000 changes: one event, not
            # one each (each is logged and published: 0.5 s of CPU before the first decision,
            # and the ring of recent events flushed of everything else)
            shown = ", ".join(arrived[:ARRIVALS_SAID_SINGLY])
            more = f" (+{len(arrived) - ARRIVALS_SAID_SINGLY} more)"
            self.events.emit("health", f"{len(arrived)} nodes new -> online: {shown}{more}")
        else:
            for node in arrived:
                self.events.emit("health", f"node {node}: new -> online", node=node)
        self.health = dict(now)
        self._health_seen = now

    def note_changes(self, revalidate: Mapping[str, str]) -> None:
        """Nodes whose residency / security facts changed: re-plan now, checking their
        running workloads."""
        for node, what in revalidate.items():
            old = self._revalidate.get(node)
            self._revalidate[node] = f"{old}, {what}" if old else what
            self._health_changed = True

    def _misfits(self, snap: ClusterSnapshot, running: Sequence[tuple[Workload, str]]
                 ) -> dict[str, tuple[str, list[str]]]:
        """The running workloads on changed nodes that no longer fit there."""
        out: dict[str, tuple[str, list[str]]] = {}
        for w, node in running:
            if node not in self._revalidate:
                continue
            bad = validate(without(snap, w, node), [w], {w.uid: node}, self.engine_config)
            if bad:
                out[w.uid] = (node, [f"{v.constraint}: {v.detail}" for v in bad])
        return out

    def place(self, obs: Observation) -> PlaceOutcome:
        """Engine + validator for ``obs.pending``; pinned replacements go where planned.
        Within ``step``, the engine's step budget counts from the step's start (reading the
        pending pods included: ``_step_cpu0``)."""
        workloads = list(obs.pending)
        if not workloads:
            return PlaceOutcome({}, {}, {}, [])
        snap = obs.snapshot
        assignments: dict[str, str] = {}
        summaries: dict[str, str] = {}
        rejected: list[Any] = []
        pinned = {w.uid: w for w in workloads if w.uid in obs.pinned}
        if pinned:
            want = {u: obs.pinned[u][0] for u in pinned}
            bad = {v.workload_uid for v in validate(snap, list(pinned.values()), want,
                                                    self.engine_config,
                                                    facts=self._node_facts)}
            for u, node in want.items():
                if u in bad:
                    continue  # the plan no longer holds: the engine decides afresh below
                assignments[u] = node
                summaries[u] = "replacement placed where the move planned"
                prev = obs.pinned[u][1]
                last = self.replan_state.last_move.get(prev)
                if last is not None:  # the cool-down follows the workload, not the pod
                    self.replan_state = dataclasses.replace(
                        self.replan_state, last_move={**self.replan_state.last_move, u: last})
            snap = with_placements(snap, workloads, assignments)
        rest = [w for w in workloads if w.uid not in assignments]
        if not rest:
            return PlaceOutcome(assignments, {}, summaries, [])
        t0 = time.perf_counter()
        try:
            result = place(snap, rest, self.engine_config, carry=self._carry, facts=obs.facts,
                           cpu_start=self._step_cpu0)
        except Exception:
            # One bad workload must not block the whole batch: place them one by one and
            # report the ones the engine chokes on.
            log.exception("placing a batch of %d failed; placing one by one", len(rest))
            return self._place_singly(snap, rest, assignments, summaries)
        chosen = {u: n for u, n in result.assignments.items() if n}
        violations = validate(snap, rest, chosen, self.engine_config, facts=self._node_facts)
        if self._on_placement is not None:
            self._on_placement(time.perf_counter() - t0, len(rest), dict(result.stats))
        bad_uids: dict[str, list[str]] = {}
        for v in violations:
            # The validator is the last line of defence: a decision that breaks a hard
            # constraint is never acted on, whatever the engine said.
            log.error("engine proposed a violation, not acting: %s", v)
            self.events.emit("alert", f"validator rejected {v.workload_uid} on {v.node}: "
                             f"{v.constraint} ({v.detail})", severity="critical",
                             workload=v.workload_uid, node=v.node)
            bad_uids.setdefault(v.workload_uid, []).append(f"{v.constraint}: {v.detail}")
            rejected.append(v)
        failures: dict[str, str] = {}
        # how good the batch is: its cost above the engine's lower bound (PlacementResult)
        gap = result.stats.get("gap")
        note = f"; batch within {gap * 100:.1f} % of the best possible" if gap is not None else ""
        for d in result.decisions:
            u = d.workload_uid
            if u in chosen and u not in bad_uids:
                assignments[u] = chosen[u]
                summaries[u] = d.summary + note
            elif u in bad_uids:
                failures[u] = "validator rejected the engine's choice: " + "; ".join(bad_uids[u])
            else:
                failures[u] = d.summary or "; ".join(d.reasons)
        # the batch's cost and size beside its bound and gap: explain shows them per pod
        return PlaceOutcome(assignments, failures, summaries, rejected,
                            {**result.stats, "cost": result.total_cost,
                             "pods": float(len(rest))})

    def _place_singly(self, snap: ClusterSnapshot, rest: Sequence[Workload],
                      assignments: dict[str, str], summaries: dict[str, str]) -> PlaceOutcome:
        failures: dict[str, str] = {}
        rejected: list[Any] = []
        for w in rest:
            try:
                res = place(snap, [w], self.engine_config)
            except Exception as e:
                failures[w.uid] = f"placement engine error: {type(e).__name__}: {e}"
                continue
            node = res.assignments.get(w.uid)
            bad = validate(snap, [w], {w.uid: node}, self.engine_config) if node else []
            if node and not bad:
                assignments[w.uid] = node
                summaries[w.uid] = next((d.summary for d in res.decisions), "")
                snap = with_placements(snap, [w], {w.uid: node})  # count it for the next
            elif bad:
                rejected.extend(bad)
                failures[w.uid] = "validator rejected the engine's choice: " + "; ".join(
                    f"{v.constraint}: {v.detail}" for v in bad)
            else:
                failures[w.uid] = next((d.summary or "; ".join(d.reasons)
                                        for d in res.decisions), "not placed")
        return PlaceOutcome(assignments, failures, summaries, rejected)

    def report(self, outcome: PlaceOutcome, pending: Sequence[Workload]) -> None:
        """The placement events, in the engine's words (an unchanged failure is said once)."""
        for u, node in outcome.assignments.items():
            self._reported.pop(u, None)
            if self.report_assignments:
                self.events.emit("placement", f"{u} -> {node}: {outcome.summaries.get(u, '')}",
                                 node=node, workload=u)
        for u, why in outcome.failures.items():
            if self._reported.get(u) != why:
                self._reported[u] = why
                self.events.emit("placement", f"{u} unplaceable: {why}", severity="warning",
                                 workload=u)
        live = {w.uid for w in pending}
        for u in [u for u in self._reported if u not in live]:
            del self._reported[u]

    def replan_every(self) -> float:
        """Seconds between re-plans: the interval, stretched by ``replan_max_share``."""
        if self.replan_max_share:
            return max(self.replan_interval_s, self._replan_cost / self.replan_max_share)
        return self.replan_interval_s

    def replan_in(self) -> float:
        """Seconds until a re-plan is worth a step of its own (0: now), for a caller that
        sleeps between steps: waking on time keeps the strikes one report interval apart. A
        re-plan a backlog deferred is looked at again one interval after the deferral, not at
        every wake-up: each look is a step with a snapshot of every node and pod, and a caller
        that woke every 50 ms for it spent a third of the core's CPU on them during a burst
        (bench_k8s). A step that runs anyway (the next batch) re-plans as soon as the backlog
        is gone (``replan`` goes by ``replan_due``)."""
        if self._health_changed:
            return 0.0
        at = self._last_replan + self.replan_every()
        if self._deferred_at is not None:
            at = max(at, self._deferred_at + self.replan_every())
        return max(0.0, at - self._clock())

    def replan_wanted(self) -> bool:
        """A re-plan is worth a step of its own now (see :meth:`replan_in`)."""
        return self.replan_in() <= 0.0

    def defer_replan(self) -> bool:
        """For a caller that knows a backlog is still being taken without observing: defer a
        due re-plan as :meth:`replan` would (True), unless it may not wait (a health change,
        or overdue by ``REPLAN_BACKLOG_DEFER_S``: False, step now)."""
        return self._defer()

    def replan_due(self) -> bool:
        return (self._clock() - self._last_replan >= self.replan_every()
                or self._health_changed)

    # Moving running pods while new ones still queue only delays the queue (and what the
    # moves would weigh changes batch by batch); a node's health change is not deferred, and
    # neither is a re-plan once it is this long overdue (a backlog that never ends).
    REPLAN_BACKLOG_DEFER_S = 30.0

    def _defer(self) -> bool:
        """Defer a due re-plan for a backlog (noted for :meth:`replan_in`), unless it may not
        wait: a health change, or overdue by ``REPLAN_BACKLOG_DEFER_S``."""
        since = max(self._last_replan, self._started)
        if self._health_changed or (self._clock() - since
                                    >= self.replan_every() + self.REPLAN_BACKLOG_DEFER_S):
            return False
        self._deferred_at = self._clock()
        return True

    def replan(self, obs: Observation, outcome: PlaceOutcome, *, force: bool = False) -> int:
        """Re-plan running workloads (SLA strikes, forecasts, cool-down) and act on moves."""
        if not (self.replan_due() or force):
            return 0
        if obs.backlog and not force and self._defer():
            return 0
        self._last_replan, self._health_changed = self._clock(), False
        self._deferred_at = None
        by_uid = {w.uid: w for w in obs.pending}
        running = list(obs.running) + [(by_uid[u], n) for u, n in outcome.assignments.items()
                                       if u in by_uid]
        if not running:
            return 0
        snap = with_placements(obs.snapshot, list(obs.pending), outcome.assignments)
        before = self.replan_state
        misfits = self._misfits(snap, running) if self._revalidate else {}
        new = {u: m for u, m in misfits.items() if u not in self._misfits_said}
        if new:
            for u, (node, problems) in new.items():
                self.events.emit("alert", f"{u} no longer fits {node} "
                                 f"({self._revalidate[node]}): {'; '.join(problems)}",
                                 severity="warning", workload=u, node=node)
            self.actuator.report_misfits(obs, new)
            self._misfits_said |= set(new)
        reasons = {u: f"node {node} changed ({self._revalidate[node]}); no longer fits: "
                   + "; ".join(problems) for u, (node, problems) in misfits.items()}
        moves, self.replan_state = plan_moves(snap, running, before, self.replan_config,
                                              misfits=reasons,
                                              base=self._carry.index(obs.facts))
        done = self.actuator.commit_moves(obs, moves) if moves else []
        undone = {m.workload_uid for m in moves} - {m.workload_uid for m in done}
        if undone:
            # A move that did not happen (a disruption budget said no, the workload changed
            # meanwhile) starts no cool-down: it is planned again once it strikes out again.
            last = dict(self.replan_state.last_move)
            for u in undone:
                if u in before.last_move:
                    last[u] = before.last_move[u]
                else:
                    last.pop(u, None)
            self.replan_state = dataclasses.replace(self.replan_state, last_move=last)
        for m in done:
            self.events.emit("placement", f"move {m.workload_uid}: {m.src} -> {m.dst} "
                             f"({m.reason})", severity="warning", workload=m.workload_uid,
                             node=m.dst)
        if self._revalidate:
            # a changed node is checked again while a workload there still does not fit
            # (its move refused by a budget, or held back by the cool-down)
            keep = {node for u, (node, _) in misfits.items()
                    if u not in {m.workload_uid for m in done}}
            self._revalidate = {n: w for n, w in self._revalidate.items() if n in keep}
            live = {w.uid for w, _ in running}
            self._misfits_said &= live
        # A workload on a down node that the engine could not move anywhere goes back to
        # pending, so it is placed as soon as capacity appears.
        down = {n.name for n in snap.nodes if n.health == Health.DOWN}
        moved = {m.workload_uid for m in moves}
        stranded = [(w, node) for w, node in running if node in down and w.uid not in moved]
        if stranded:
            self.actuator.requeue(stranded)
        return len(done)

    # ------------------------------------------------------------------ the step

    def step(self) -> StepReport:
        t0 = time.thread_time()
        obs = self.source.observe()
        observed = time.thread_time() - t0
        self.note_health(obs.health)
        if obs.revalidate:
            self.note_changes(obs.revalidate)
        self._step_cpu0 = t0
        try:
            outcome = self.place(obs)
        finally:
            self._step_cpu0 = None
        self.report(outcome, obs.pending)
        placed = self.actuator.commit_placements(obs, outcome)
        applied = self.actuator.apply()
        last, t1 = self._last_replan, time.thread_time()
        moves = self.replan(obs, outcome)
        if self._last_replan != last:  # it ran
            self._replan_cost = observed + time.thread_time() - t1
        if moves:
            applied += self.actuator.apply()
        return StepReport(placed, len(outcome.failures) + len(obs.invalid), applied, moves,
                          len(outcome.rejected))


# the consoles' what-if (k8s/console.py, scheduler.py), by its old name
what_if = DecisionLoop.what_if
