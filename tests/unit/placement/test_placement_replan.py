"""Re-placement: strikes, forecasts, cool-down, hysteresis, node down, never into violation."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pytest
from placement_helpers import node, snap, wl

from cloud_core.placement import (
    ClusterSnapshot,
    Health,
    LinkInfo,
    ReplanConfig,
    ReplanState,
    RunningPod,
    plan_moves,
    validate,
)
from cloud_core.placement.replan import Holt

CFG = ReplanConfig(violation_intervals=3, cooldown_s=600, clear_ratio=0.9, dest_ratio=0.8,
                   horizon=2.0)
W = wl("w", max_latency_ms=50.0, latency_to="user")


def cluster(p95_a: float, p95_b: float = 10.0, now: float = 1000.0, health_a: Health =
            Health.ONLINE, extra: dict[tuple[str, str], LinkInfo] | None = None
            ) -> ClusterSnapshot:
    nodes = [node("a", health=health_a), node("b", price_per_hour=2.0)]
    links = {("a", "user"): LinkInfo(p95_a / 2, p95_a), ("b", "user"): LinkInfo(5, p95_b)}
    links |= extra or {}
    pods = (RunningPod("w", "w", "default", "a"),)
    return snap(nodes, links, pods=pods, now=now)


def run(seq: Sequence[float], cfg: ReplanConfig = CFG, p95_b: float = 10.0,
        dt: float = 60.0) -> list[list[tuple[str, str, str]]]:
    state = ReplanState()
    out = []
    node_of = "a"
    for i, p95 in enumerate(seq):
        s = cluster(p95, p95_b, now=1000 + i * dt)
        moves, state = plan_moves(s, [(W, node_of)], state, cfg)
        out.append([(m.src, m.dst, m.reason) for m in moves])
    return out


@pytest.mark.parametrize("seq,move_at", [
    ([10, 10, 10, 10, 10], None),  # healthy: nothing
    ([60, 60, 60, 60], 2),  # violated 3 intervals: move on the third
    ([60, 60, 10, 60, 60], None),  # cleared in between (below 0.9 x SLA): strikes reset
    ([60, 60, 47, 60], 3),  # 47 ms is inside the hysteresis band: strikes survive
    ([120, 120, 120], 1),  # 2 x SLA or more counts twice: move on the second
    ([120, 60, 60], 1),  # severe, then a plain violation: 2 + 1 strikes
    ([60, 120, 60], 1),  # a plain violation, then a severe one
    ([120, 10, 120, 10], None),  # one severe measurement alone never moves anything
    ([99, 99, 99], 2),  # just under 2 x SLA: plain strikes
])
def test_strikes_and_hysteresis(seq: list[float], move_at: int | None) -> None:
    cfg = dataclasses.replace(CFG, horizon=0.0)  # measured values only
    got = run(seq, cfg)
    moved = [i for i, m in enumerate(got) if m]
    assert moved == ([] if move_at is None else [move_at])
    if move_at is not None:
        assert got[move_at][0][:2] == ("a", "b")
        assert "SLA at risk" in got[move_at][0][2]


@pytest.mark.parametrize("vi,severe_ratio,seq,move_at", [
    (3, 0.0, [120, 120, 120], 2),  # severe_ratio 0: every strike counts one
    (2, 2.0, [120, 120], 1),  # with 2 intervals a severe one still needs a second look
    (2, 2.0, [120], None),
    (1, 2.0, [120], 0),  # 1 interval: at once, as configured
    (4, 2.0, [120, 120], 1),  # 4 intervals: two severe measurements
])
def test_severe_violations_count_twice_but_never_alone(
        vi: int, severe_ratio: float, seq: list[float], move_at: int | None) -> None:
    cfg = dataclasses.replace(CFG, horizon=0.0, violation_intervals=vi,
                              severe_ratio=severe_ratio)
    moved = [i for i, m in enumerate(run(seq, cfg)) if m]
    assert moved == ([] if move_at is None else [move_at])


def test_forecast_acts_before_the_sla_breaks() -> None:
    # rising 10 ms per interval: still under 50 ms when the move is planned
    seq = [10, 20, 30, 40, 44, 46, 48, 49]
    got = run(seq)
    first = next(i for i, m in enumerate(got) if m)
    assert W.max_latency_ms is not None and seq[first] < W.max_latency_ms
    assert "forecast" in got[first][0][2]


def test_cooldown_prevents_flapping() -> None:
    cfg = dataclasses.replace(CFG, violation_intervals=1, horizon=0.0)
    state = ReplanState()
    s = cluster(80.0, now=1000.0)
    m1, state = plan_moves(s, [(W, "a")], state, cfg)
    assert [(m.src, m.dst) for m in m1] == [("a", "b")]
    # the workload now runs on b, which turns bad at once: the cool-down holds it there
    s2 = cluster(10.0, p95_b=80.0, now=1060.0)
    m2, state = plan_moves(s2, [(W, "b")], state, cfg)
    assert m2 == []
    s3 = cluster(10.0, p95_b=80.0, now=1000.0 + 601)
    m3, _ = plan_moves(s3, [(W, "b")], state, cfg)
    assert [(m.src, m.dst) for m in m3] == [("b", "a")]


def test_never_into_a_violation() -> None:
    # b meets 50 ms but not the destination margin (0.8 x 50 = 40): no move
    cfg = dataclasses.replace(CFG, violation_intervals=1, horizon=0.0)
    moves, _ = plan_moves(cluster(80.0, p95_b=45.0), [(W, "a")], ReplanState(), cfg)
    assert moves == []
    moves, _ = plan_moves(cluster(80.0, p95_b=30.0), [(W, "a")], ReplanState(), cfg)
    assert len(moves) == 1
    s = cluster(80.0, p95_b=30.0)
    assert validate(s, [W], {W.uid: moves[0].dst}) == []


def test_node_down_moves_at_once_unreachable_stays() -> None:
    s = cluster(10.0, health_a=Health.DOWN)
    moves, _ = plan_moves(s, [(W, "a")], ReplanState(), CFG)
    assert [(m.src, m.dst, m.reason) for m in moves] == [("a", "b", "node down")]
    plain = wl("p")  # no SLA: edge autonomy keeps it on an unreachable node
    s = cluster(10.0, health_a=Health.UNREACHABLE)
    moves, _ = plan_moves(s, [(plain, "a")], ReplanState(), CFG)
    assert moves == []


def test_missing_data_counts_as_violation_without_crashing() -> None:
    nodes = [node("a"), node("b")]
    s = snap(nodes, {("b", "user"): LinkInfo(5, 10)}, pods=(RunningPod("w", "w", "default",
                                                                       "a"),))
    state = ReplanState()
    cfg = dataclasses.replace(CFG, violation_intervals=2)
    m, state = plan_moves(s, [(W, "a")], state, cfg)
    assert m == [] and state.strikes["w"] == 1
    m, state = plan_moves(dataclasses.replace(s, now=1060), [(W, "a")], state, cfg)
    assert [(x.dst, "no latency data" in x.reason) for x in m] == [("b", True)]


def test_holt_tracks_trend_and_reports_error() -> None:
    h = Holt(10.0)
    for x in (12.0, 14.0, 16.0, 18.0, 20.0):
        h = h.update(x, 0.5, 0.5)
    assert h.forecast(1.0) == pytest.approx(22.0, abs=1.5)
    assert h.n == 6 and h.mae > 0
    assert math.isnan(Holt(1.0).mae)
    state = ReplanState()
    for i, p in enumerate([10, 20, 30]):
        _, state = plan_moves(cluster(p, now=1000 + 60 * i), [(W, "a")], state, CFG)
    err = state.forecast_error()
    assert err["latency_ms_mae"] > 0 and "load_mae" in err
