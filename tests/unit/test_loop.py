"""The one decision loop (cloud_core/loop.py) with a fake source of truth and a fake actuator.

Both fakes are named as such: they stand at the loop's I/O edges. The same paths run against
the real parts in tests/integration/test_core_loop.py (local mode: MQTT, SQLite) and
tests/k8s/test_workloads.py (Kubernetes mode: API server, controllers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest

from cloud_core.events import EventLog
from cloud_core.health import Health as LiveHealth
from cloud_core.loop import DecisionLoop, Move, Observation, PlaceOutcome
from cloud_core.placement import ReplanConfig
from cloud_core.placement.model import (
    ClusterSnapshot,
    LinkInfo,
    NodeInfo,
    Resources,
    RunningPod,
    Workload,
)

CAP = Resources(4000, 8 << 30, 0)
SMALL = Resources(100, 1 << 20, 0)


@dataclass
class FakeSource:
    obs: Observation

    def observe(self) -> Observation:
        return self.obs


@dataclass
class FakeActuator:
    refuse_moves: bool = False
    placed: list[dict[str, str]] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)

    def commit_placements(self, obs: Observation, outcome: PlaceOutcome) -> int:
        self.placed.append(dict(outcome.assignments))
        return len(outcome.assignments)

    def apply(self) -> int:
        return 0

    def commit_moves(self, obs: Observation, moves: Sequence[Move]) -> list[Move]:
        if self.refuse_moves:
            return []
        self.moves.extend(moves)
        return list(moves)

    def requeue(self, stranded: Sequence[tuple[Workload, str]]) -> int:
        return 0

    misfits: list[dict[str, tuple[str, list[str]]]] = field(default_factory=list)

    def report_misfits(self, obs: Observation,
                       misfits: Mapping[str, tuple[str, list[str]]]) -> None:
        self.misfits.append(dict(misfits))


def snapshot(ab_ms: float, pods: tuple[RunningPod, ...] = ()) -> ClusterSnapshot:
    nodes = (NodeInfo("a", "eu", "eu-1", capacity=Resources(50, 1 << 30, 0)),
             NodeInfo("b", "eu", "eu-2", capacity=CAP), NodeInfo("c", "eu", "eu-3", capacity=CAP))
    links = {("b", "a"): LinkInfo(ab_ms * 0.8, ab_ms), ("c", "a"): LinkInfo(4.0, 5.0)}
    return ClusterSnapshot(nodes=nodes, links=links, now=0.0, pods=pods)


NEAR = Workload("near", "near", requests=SMALL, max_latency_ms=20.0, latency_to="a")
HEALTH = {"a": LiveHealth.ONLINE, "b": LiveHealth.ONLINE, "c": LiveHealth.ONLINE}


def loop_for(obs: Observation, act: FakeActuator) -> DecisionLoop:
    return DecisionLoop(FakeSource(obs), act, EventLog(lambda ev: None),
                        replan_config=replace(ReplanConfig(), horizon=0.0),
                        replan_interval_s=0.0, clock=lambda: 0.0)


def test_pinned_replacement_goes_where_planned_unless_the_validator_objects() -> None:
    act = FakeActuator()
    repl = replace(NEAR, uid="near-2")
    obs = Observation(HEALTH, snapshot(5.0), [repl], [], pinned={"near-2": ("c", "near")})
    loop = loop_for(obs, act)
    loop.replan_state = replace(loop.replan_state, last_move={"near": 123.0})
    loop.step()
    assert act.placed == [{"near-2": "c"}]
    assert loop.replan_state.last_move["near-2"] == 123.0  # the cool-down follows the workload
    # A plan that no longer holds (node a is too small) is not acted on: the engine decides.
    act2 = FakeActuator()
    obs2 = Observation(HEALTH, snapshot(5.0), [repl], [], pinned={"near-2": ("a", "near")})
    loop_for(obs2, act2).step()
    assert act2.placed and act2.placed[0]["near-2"] in ("b", "c")


def test_a_move_that_did_not_happen_starts_no_cool_down() -> None:
    pod = RunningPod(uid="near", name="near", namespace="default", node="b", requests=SMALL)
    obs = Observation(HEALTH, snapshot(80.0, (pod,)), [], [(NEAR, "b")])
    refused = FakeActuator(refuse_moves=True)
    loop = loop_for(obs, refused)
    for _ in range(3):  # 80 ms against 20 ms: severe, two strikes an interval
        loop.step()
    assert "near" not in loop.replan_state.last_move
    ok = FakeActuator()
    loop.actuator = ok
    for _ in range(3):
        loop.step()
    assert [(m.src, m.dst) for m in ok.moves] == [("b", "c")]
    assert "near" in loop.replan_state.last_move


@dataclass
class SlowFakeSource(FakeSource):
    """A fake source whose observation costs a (CPU-clock) second: a big cluster."""

    t: list[float] = field(default_factory=lambda: [0.0])

    def observe(self) -> Observation:
        self.t[0] += 1.0
        return self.obs


def test_replan_interval_stretches_with_its_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """With replan_max_share 0.1, a re-plan whose observation took 1 s is next due 10 s later
    (not after replan_interval_s = 1 s); without it, after 1 s as before."""
    import cloud_core.loop as loop_mod

    obs = Observation(health=HEALTH, snapshot=snapshot(5.0), pending=[], running=[(NEAR, "c")])
    for share, due_after in ((0.1, 10.0), (None, 1.0)):
        src = SlowFakeSource(obs)
        clock = [100.0]
        monkeypatch.setattr(loop_mod.time, "thread_time",
                            lambda src=src: src.t[0])
        loop = DecisionLoop(src, FakeActuator(), EventLog(lambda ev: None),
                            replan_interval_s=1.0, replan_max_share=share,
                            clock=lambda clock=clock: clock[0])
        assert loop.replan_due()
        loop.step()
        assert loop.replan_every() == due_after
        clock[0] += due_after - 0.5
        assert not loop.replan_due()
        clock[0] += 0.5
        assert loop.replan_due()


def backlog_loop() -> tuple[Observation, FakeSource, list[float], DecisionLoop]:
    """A loop over one running workload while a backlog is taken (1 s re-plans, a clock at
    1000 s that the test moves)."""
    obs = Observation(health=HEALTH, snapshot=snapshot(5.0), pending=[], running=[(NEAR, "c")],
                      backlog=True)
    src = FakeSource(obs)
    clock = [1000.0]
    loop = DecisionLoop(src, FakeActuator(), EventLog(lambda ev: None),
                        replan_interval_s=1.0, clock=lambda: clock[0])
    return obs, src, clock, loop


def test_replan_waits_for_a_backlog_but_not_for_ever() -> None:
    """While a backlog is taken batch by batch, a due re-plan waits (up to
    REPLAN_BACKLOG_DEFER_S past due); without a backlog, or on a health change, it runs."""
    obs, src, clock, loop = backlog_loop()
    loop.step()  # never re-planned, but the backlog goes first (nodes arriving force none)
    assert loop._last_replan < 0
    src.obs = replace(obs, backlog=False)
    loop.step()  # no backlog: the first re-plan runs
    ran_at = loop._last_replan
    assert ran_at == 1000.0
    src.obs = obs
    clock[0] += 2.0  # due again
    assert loop.replan_due()
    loop.step()
    assert loop._last_replan == ran_at  # deferred: the backlog goes first
    src.obs = replace(obs, backlog=False)
    loop.step()
    assert loop._last_replan == clock[0]  # the backlog is gone: it runs
    src.obs = obs
    clock[0] += 1.0 + DecisionLoop.REPLAN_BACKLOG_DEFER_S - 0.5
    loop.step()
    assert loop._last_replan == clock[0] - 1.0 - DecisionLoop.REPLAN_BACKLOG_DEFER_S + 0.5
    clock[0] += 0.5  # overdue by the bound: a backlog that never ends does not starve it
    loop.step()
    assert loop._last_replan == clock[0]
    clock[0] += 1.0
    src.obs = replace(obs, health={**HEALTH, "b": LiveHealth.DOWN})  # a health change...
    loop.step()  # ...is not deferred
    assert loop._last_replan == clock[0]


def test_the_first_replan_waits_for_a_backlog_from_the_loops_start() -> None:
    """A loop that never re-planned defers its first re-plan for a backlog like any other,
    overdue (REPLAN_BACKLOG_DEFER_S) counted from the loop's start, not from the epoch; the
    Nodes first seen online (a cluster listed at start-up) force none, a node first seen
    down does (its pods may need a move)."""
    obs, _src, clock, loop = backlog_loop()
    loop.step()
    assert loop._last_replan < 0 and not loop._health_changed
    assert any(h is LiveHealth.ONLINE for h in HEALTH.values())
    clock[0] += 1.0 + DecisionLoop.REPLAN_BACKLOG_DEFER_S - 0.1
    loop.step()
    assert loop._last_replan < 0  # not yet overdue from the start
    clock[0] += 0.1
    loop.step()
    assert loop._last_replan == clock[0]  # overdue: runs, backlog or not
    down = DecisionLoop(FakeSource(replace(obs, health={**HEALTH, "x": LiveHealth.DOWN})),
                        FakeActuator(), EventLog(lambda ev: None), replan_interval_s=1.0,
                        clock=lambda: clock[0])
    down.step()
    assert down._last_replan == clock[0]  # a node first seen down is not deferred


def test_a_deferred_replan_is_looked_at_again_one_interval_later() -> None:
    """A re-plan a backlog deferred is not wanted again at every wake-up of the caller (each
    look is a step with a snapshot of every node and pod; the Kubernetes actuator woke every
    50 ms for it during a burst): one interval after the deferral. A caller that knows the
    backlog is still there defers it without a step, but not past the bound nor over a health
    change; a step that runs anyway re-plans as soon as the backlog is gone."""
    obs, src, clock, loop = backlog_loop()
    loop.replan(replace(obs, backlog=False), PlaceOutcome({}, {}, {}, []))  # the first one ran
    clock[0] += 2.0
    assert loop.replan_wanted()
    loop.step()  # deferred by the backlog
    assert loop._last_replan == 1000.0
    assert loop.replan_due()  # still due for a step that runs anyway...
    assert not loop.replan_wanted()  # ...but worth no step of its own for an interval
    assert 0.5 < loop.replan_in() <= 1.0
    clock[0] += 1.0
    assert loop.replan_wanted()
    assert loop.defer_replan()  # the caller sees the backlog still there: no step
    assert not loop.replan_wanted()
    src.obs = replace(obs, backlog=False)
    loop.step()  # the next batch's step: the backlog is gone, the re-plan runs
    assert loop._last_replan == clock[0]
    assert not loop.replan_wanted()
    clock[0] += 1.0 + DecisionLoop.REPLAN_BACKLOG_DEFER_S
    assert not loop.defer_replan()  # overdue by the bound: step now
    clock[0] += 0.1
    loop._health_changed = True
    assert loop.replan_wanted() and not loop.defer_replan()  # a health change never waits


def test_a_node_fact_change_is_a_move_the_replanner_makes() -> None:
    """A node's region changes under a resident workload: the loop finds it no longer fits,
    reports it once, and the re-planner moves it (destination checked by the validator, the
    cool-down started); the same change said again moves nothing more."""
    resident = Workload("res", "res", requests=SMALL, residency=frozenset({"eu"}))
    snap = snapshot(5.0, (RunningPod.of(resident, "b"),))
    moved = replace(snap, nodes=tuple(replace(n, region="us") if n.name == "b" else n
                                      for n in snap.nodes))
    obs = Observation(health=HEALTH, snapshot=moved, pending=(), running=[(resident, "b")],
                      revalidate={"b": "topology.kubernetes.io/region: eu -> us"})
    act = FakeActuator()
    events = EventLog(lambda ev: None)
    loop = DecisionLoop(FakeSource(obs), act, events, replan_interval_s=0.0,
                        clock=lambda: 0.0)
    loop.step()
    (m,) = act.moves
    assert (m.workload_uid, m.src) == ("res", "b") and m.dst in ("a", "c")
    assert "node b changed (topology.kubernetes.io/region: eu -> us)" in m.reason
    assert "no longer fits" in m.reason and "residency" in m.reason
    assert list(act.misfits[0]) == ["res"]
    assert any(e.kind == "alert" and "no longer fits b" in e.message for e in events.recent())
    loop.step()  # the informer has not caught up: the cool-down holds the move back
    assert len(act.moves) == 1 and len(act.misfits) == 1


def test_a_placed_pod_says_how_close_its_batch_is_to_the_best_possible() -> None:
    got: list[PlaceOutcome] = []

    class Recording(FakeActuator):
        def commit_placements(self, obs: Observation, outcome: PlaceOutcome) -> int:
            got.append(outcome)
            return super().commit_placements(obs, outcome)

    obs = Observation(HEALTH, snapshot(5.0), [NEAR], [])
    loop_for(obs, Recording()).step()
    (summary,) = got[0].summaries.values()
    assert summary.startswith("placed on ") and summary.endswith(
        "nodes fit; batch within 0.0 % of the best possible"), summary
    assert got[0].stats["gap"] == 0.0
