"""Re-placement: move running workloads off down nodes or out of (forecast) SLA violations.

Pure: the caller passes the previous ``ReplanState`` and gets a new one back. Flapping is
prevented three ways: a workload must be in violation (measured or forecast) for
``violation_intervals`` consecutive calls (a measurement past ``severe_ratio`` x SLA counts
twice, so a link that collapses is left after two; strikes reset only once the p95 drops below
``clear_ratio`` x SLA: hysteresis); a moved workload is left alone for ``cooldown_s``; and a
destination must meet ``dest_ratio`` x SLA with a forecast load under ``max_load``. Every
move is checked with the independent validator against the real SLA, so nothing moves into a
violation.

Forecasts are Holt's linear (level + trend) exponential smoothing, per (node, target) link
latency and per node load; each keeps its one-step-ahead absolute error so the model's
quality is reported (``ReplanState.forecast_error``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .config import EngineConfig
from .engine import PreparedCluster
from .index import ClusterIndex
from .model import (
    HOSTNAME,
    ClusterSnapshot,
    Health,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Workload,
)
from .scores import dominant_share
from .sla import breach, judge
from .validate import validate


@dataclass(frozen=True, slots=True)
class Holt:
    """Holt's linear trend model with its running one-step-ahead absolute error."""

    level: float
    trend: float = 0.0
    n: int = 1
    abs_err: float = 0.0  # sum of |forecast(1) - observed| over n - 1 updates

    def forecast(self, h: float = 1.0) -> float:
        return self.level + h * self.trend

    def update(self, x: float, alpha: float, beta: float) -> Holt:
        err = abs(self.forecast(1.0) - x)
        level = alpha * x + (1 - alpha) * (self.level + self.trend)
        trend = beta * (level - self.level) + (1 - beta) * self.trend
        return Holt(level, trend, self.n + 1, self.abs_err + err)

    @property
    def mae(self) -> float:
        return self.abs_err / (self.n - 1) if self.n > 1 else math.nan


def _frozen(d: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(d))


class NodeLoads(Mapping[str, Holt]):
    """Every node's load model (:class:`Holt`, read by node name), kept as arrays over the
    nodes: one interval's update of 5,000 nodes is a few vector operations, where a
    ``Holt`` object per node cost 10 ms of each re-plan. The same arithmetic as
    ``Holt.update``, element by element. Immutable: ``updated`` returns a new one."""

    __slots__ = ("_pos", "abs_err", "level", "n", "names", "trend")

    def __init__(self, names: Sequence[str] = (), level: np.ndarray | None = None,
                 trend: np.ndarray | None = None, n: np.ndarray | None = None,
                 abs_err: np.ndarray | None = None) -> None:
        self.names = names
        self._pos: dict[str, int] | None = None
        k = len(names)
        self.level = np.zeros(k) if level is None else level
        self.trend = np.zeros(k) if trend is None else trend
        self.n = np.ones(k, dtype=np.int64) if n is None else n
        self.abs_err = np.zeros(k) if abs_err is None else abs_err

    def _index(self) -> dict[str, int]:
        if self._pos is None:
            self._pos = {name: i for i, name in enumerate(self.names)}
        return self._pos

    def __getitem__(self, name: str) -> Holt:
        i = self._index()[name]
        return Holt(float(self.level[i]), float(self.trend[i]), int(self.n[i]),
                    float(self.abs_err[i]))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def mae(self) -> float:
        """Mean one-step-ahead absolute error over the nodes with more than one update."""
        seen = self.n > 1
        return float(np.mean(self.abs_err[seen] / (self.n[seen] - 1))) if seen.any() \
            else math.nan

    def hot(self, max_load: float) -> list[str]:
        """The nodes whose next interval's forecast load is past ``max_load``."""
        return [self.names[int(i)] for i in
                np.flatnonzero(self.level + self.trend > max_load)]

    def updated(self, names: Sequence[str], util: np.ndarray, alpha: float,
                beta: float) -> NodeLoads:
        """One interval: node ``names[i]`` measured at ``util[i]``; a node not seen before
        starts its model there (``Holt(u)``), a node gone is dropped."""
        level, trend, n, abs_err = self.level, self.trend, self.n, self.abs_err
        fresh = np.zeros(len(names), dtype=bool)
        if names is not self.names and list(names) != list(self.names):
            pos = self._index()
            at = np.fromiter((pos.get(x, -1) for x in names), dtype=np.int64,
                             count=len(names))
            fresh = at < 0
            take = np.maximum(at, 0)
            if not len(self.names):  # nothing to take: every node starts afresh below
                level = trend = abs_err = np.zeros(len(names))
                n = np.ones(len(names), dtype=np.int64)
            else:
                level, trend, n, abs_err = level[take], trend[take], n[take], abs_err[take]
        err = np.abs(level + 1.0 * trend - util)
        new_level = alpha * util + (1 - alpha) * (level + trend)
        new_trend = beta * (new_level - level) + (1 - beta) * trend
        return NodeLoads(names,
                         np.where(fresh, util, new_level), np.where(fresh, 0.0, new_trend),
                         np.where(fresh, 1, n + 1), np.where(fresh, 0.0, abs_err + err))


@dataclass(frozen=True, slots=True)
class ReplanState:
    """What one call hands the next: forecasts, strike counters, last move times."""

    latency: Mapping[str, Holt] = field(default_factory=dict)  # "node->target"
    load: NodeLoads = field(default_factory=NodeLoads)  # node
    strikes: Mapping[str, int] = field(default_factory=dict)  # workload uid
    last_move: Mapping[str, float] = field(default_factory=dict)  # workload uid -> now

    def forecast_error(self) -> dict[str, float]:
        """Mean one-step-ahead absolute error of the latency (ms) and load (0..1) models."""
        def mean(hs: Sequence[Holt]) -> float:
            errs = [h.mae for h in hs if h.n > 1]
            return float(np.mean(errs)) if errs else math.nan
        return {"latency_ms_mae": mean(list(self.latency.values())),
                "load_mae": self.load.mae()}


@dataclass(frozen=True, slots=True)
class ReplanConfig:
    """Knobs of the re-placement loop (one call per telemetry interval)."""

    violation_intervals: int = 3
    # A measured p95 at or past this many times the SLA counts as two strikes (never
    # so many that one measurement moves a workload when ``violation_intervals`` > 1).
    # Hysteresis is for values near the threshold; far past it, a third interval only
    # makes users wait (bench_reaction, link rate cut under a 20 ms SLA: decision p50
    # 3.72 -> 1.99 s, p99 4.99 -> 3.79 s). 0: off.
    severe_ratio: float = 2.0
    cooldown_s: float = 600.0
    clear_ratio: float = 0.9
    dest_ratio: float = 0.8
    max_load: float = 0.9
    horizon: float = 2.0  # intervals ahead the latency forecast looks
    alpha: float = 0.5
    beta: float = 0.3
    max_moves: int = 100
    engine: EngineConfig = field(default_factory=EngineConfig)


@dataclass(frozen=True, slots=True)
class Move:
    """Move ``workload_uid`` from ``src`` to ``dst`` because of ``reason``."""

    workload_uid: str
    src: str
    dst: str
    reason: str


def _avoiding(w: Workload, nodes: Sequence[str], sla: float | None) -> Workload:
    """``w`` with the hysteresis SLA and the given nodes excluded (ANDed into every term)."""
    req = NodeSelectorRequirement(HOSTNAME, "NotIn", tuple(sorted(nodes)))
    terms = tuple(NodeSelectorTerm((*t.match_expressions, req)) for t in w.node_affinity) \
        or (NodeSelectorTerm((req,)),)
    return dataclasses.replace(w, node_affinity=terms if nodes else w.node_affinity,
                               max_latency_ms=sla)


def plan_moves(snapshot: ClusterSnapshot, running: Sequence[tuple[Workload, str]],
               state: ReplanState, config: ReplanConfig | None = None, *,
               misfits: Mapping[str, str] | None = None, base: ClusterIndex | None = None
               ) -> tuple[list[Move], ReplanState]:
    """One interval of the re-placement loop: update forecasts, count strikes, plan moves.

    ``misfits``: uid -> why, running workloads that no longer fit their node (its residency
    or security facts changed): moved like an SLA breach that struck out, cool-down
    included. ``base``: an index of the same nodes with the same facts (only ``allocated``
    may differ: ``carry.Carry.index``), whose node indexes are taken instead of built."""
    misfits = misfits or {}
    cfg = config or ReplanConfig()
    # only the index is read here (allocation, positions, links): nothing built ahead
    ix = ClusterIndex(snapshot, cfg.engine, base)
    now = snapshot.now
    lat = dict(state.latency)
    strikes = dict(state.strikes)
    last_move = dict(state.last_move)
    util = np.minimum(dominant_share(ix.alloc.astype(float), ix.cap.astype(float)), 1.0)
    load = state.load.updated(ix.names(), util, cfg.alpha, cfg.beta)
    live = {f"{nd}->{w.latency_to}" for w, nd in running}
    lat = {k: v for k, v in lat.items() if k in live}
    need: list[tuple[Workload, str, str]] = []
    for w, node in running:
        at = ix.pos.get(node)
        if at is None or ix.nodes[at].health == Health.DOWN:
            need.append((w, node, "node down"))
            continue
        if w.uid in misfits:
            if now - last_move.get(w.uid, -math.inf) >= cfg.cooldown_s:
                need.append((w, node, misfits[w.uid]))
            continue
        if w.max_latency_ms is None or w.latency_to is None:
            strikes.pop(w.uid, None)
            continue
        sla = w.max_latency_ms
        p95 = float(ix.latency_to(w.latency_to)[at])
        key = f"{node}->{w.latency_to}"
        h = lat.get(key)
        if math.isfinite(p95):
            h = Holt(p95) if h is None else h.update(p95, cfg.alpha, cfg.beta)
            lat[key] = h
        # horizon 0: forecasts off, act on measurements only
        ahead = p95 if cfg.horizon <= 0 else h.forecast(cfg.horizon) if h else math.inf
        # measured and forecast p95 against the SLA, and against the hysteresis bound
        both = np.array([p95, ahead])
        if not judge(sla, both).met.all():
            severe = cfg.severe_ratio > 0 and math.isfinite(p95) and p95 >= cfg.severe_ratio * sla
            weight = max(1, min(2, cfg.violation_intervals - 1)) if severe else 1
            strikes[w.uid] = strikes.get(w.uid, 0) + weight
        elif judge(cfg.clear_ratio * sla, both).met.all():
            strikes.pop(w.uid, None)
        if strikes.get(w.uid, 0) >= cfg.violation_intervals and \
                now - last_move.get(w.uid, -math.inf) >= cfg.cooldown_s:
            what = breach(sla, p95, w.latency_to)
            if what is None:  # the strikes came before; the measurement is within it now
                later = breach(sla, ahead, w.latency_to)
                what = (f"forecast {later}" if later is not None
                        else f"p95 {p95:.1f} ms within {sla:g} ms now")
            need.append((w, node, f"SLA at risk for {strikes[w.uid]} intervals: {what}"))
    moves: list[Move] = []
    if need:
        need = need[: cfg.max_moves]
        movers = {w.uid for w, _, _ in need}
        snap2 = dataclasses.replace(snapshot, pods=tuple(p for p in snapshot.pods
                                                          if p.uid not in movers))
        hot = load.hot(cfg.max_load)
        probes = []
        for w, node, _ in need:
            dest_sla = None if w.max_latency_ms is None else w.max_latency_ms * cfg.dest_ratio
            probes.append(_avoiding(w, [node, *hot], dest_sla))
        res = PreparedCluster(snap2, cfg.engine, eager=False).place(probes)
        originals = [w for w, _, _ in need]
        chosen = {u: n for u, n in res.assignments.items()}
        # the real SLA, the real spec: the validator must agree before anything moves
        bad = {v.workload_uid for v in validate(snap2, originals, chosen, cfg.engine)}
        for w, node, why in need:
            dst = chosen.get(w.uid)
            if dst is None or w.uid in bad:
                continue
            moves.append(Move(w.uid, node, dst, why))
            last_move[w.uid] = now
            strikes.pop(w.uid, None)
    new = ReplanState(_frozen(lat), load, _frozen(strikes),  # type: ignore[arg-type]
                      _frozen(last_move))  # type: ignore[arg-type]
    return moves, new
