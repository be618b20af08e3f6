"""Human-readable explanations: kube-scheduler-style summaries and per-node breakdowns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class FilterResult:
    """One filter over all nodes: ``ok[i]``; where not ok, ``names[labels[i]]`` says why."""

    name: str
    ok: np.ndarray
    labels: np.ndarray
    names: tuple[str, ...]

    def reason(self, i: int) -> str | None:
        return None if self.ok[i] else self.names[int(self.labels[i])]


def first_failure_counts(results: Sequence[FilterResult], n: int) -> tuple[int, Counter[str]]:
    """Attribute each failing node to its first failing filter (as kube-scheduler does)."""
    alive = np.ones(n, dtype=bool)
    counts: Counter[str] = Counter()
    for fr in results:
        newly = alive & ~fr.ok
        if newly.any():
            bc = np.bincount(fr.labels[newly], minlength=len(fr.names))
            for li in np.flatnonzero(bc):
                counts[fr.names[li]] += int(bc[li])
            alive &= fr.ok
    return int(alive.sum()), counts


def first_failure_examples(results: Sequence[FilterResult], n: int, names: Sequence[str],
                           limit: int = 5) -> tuple[tuple[str, str], ...]:
    """Up to ``limit`` non-fitting nodes with their first failing filter's reason:
    one node per reason first (the most common reasons first), then more of them."""
    alive = np.ones(n, dtype=bool)
    per_reason: dict[str, list[int]] = {}
    for fr in results:
        newly = np.flatnonzero(alive & ~fr.ok)
        for i in newly[: limit * 4]:  # enough to pick from; never the whole fleet
            per_reason.setdefault(fr.names[int(fr.labels[i])], []).append(int(i))
        alive &= fr.ok
    order = sorted(per_reason, key=lambda r: -len(per_reason[r]))
    out: list[tuple[str, str]] = []
    for depth in range(limit):
        for r in order:
            if len(out) < limit and depth < len(per_reason[r]):
                out.append((names[per_reason[r][depth]], r))
    return tuple(out)


def summary(fit: int, total: int, counts: Counter[str]) -> str:
    """``"0/5000 nodes fit: 3100 residency, 1200 latency > 50 ms, 700 insufficient GPU"``."""
    parts = ", ".join(f"{c} {r}" for r, c in sorted(counts.items(), key=lambda kv: (-kv[1],
                                                                                 kv[0])))
    return f"{fit}/{total} nodes fit" + (f": {parts}" if parts else "")


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a workload can (not) go where: filter tallies, one node's verdict, best nodes."""

    workload_uid: str
    total: int
    fit: int
    counts: dict[str, int]
    summary: str
    node: str | None
    node_reasons: tuple[str, ...]
    breakdown: dict[str, float]  # cost terms on ``node`` ($/hour)
    best: tuple[tuple[str, float], ...]  # cheapest fitting nodes with their cost
    # The cheapest fitting node other than ``node`` (other than the cheapest when
    # ``node`` is None), and its cost terms: ``runner_up_breakdown[k] -
    # breakdown[k]`` is what choosing it would add, term by term.
    runner_up: str | None = None
    runner_up_breakdown: dict[str, float] = field(default_factory=dict)
    # A few nodes that do not fit, each with its first failing filter's reason
    # (one per reason first, most common reason first).
    examples: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        lines = [f"{self.workload_uid}: {self.summary}"]
        if self.node is not None:
            verdict = "fits" if not self.node_reasons else "; ".join(self.node_reasons)
            lines.append(f"  {self.node}: {verdict}")
            if self.breakdown:
                terms = ", ".join(f"{k} {v:.5f}" for k, v in self.breakdown.items() if v)
                lines.append(f"  cost {sum(self.breakdown.values()):.5f} $/h ({terms})")
        if self.runner_up is not None:
            lines.append(f"  runner-up {self.runner_up}")
        for name, cost in self.best:
            lines.append(f"  candidate {name}: {cost:.5f} $/h")
        for name, why in self.examples:
            lines.append(f"  e.g. {name}: {why}")
        return "\n".join(lines)


def pod_by_pod_results(pc: Any, w: Any, usage_of: Any = None) -> list[FilterResult]:
    """The constraints the engine checks pod by pod (``sequential.py``), as filters over
    every node, so that ``explain`` never says "fits" of a node the validator rejects: pod
    slots, extended resources, host ports, and hard (``DoNotSchedule``) topology spread.
    Empty when ``w`` has none of them (the common case costs nothing). ``usage_of``: a
    function giving the ``NodeUsage`` to count against (default: the snapshot's pods); after a
    batch, the engine's, with the batch's placements, built once for all its unplaced pods."""
    from .sequential import NodeUsage, SpreadState

    n = pc.ix.n
    out: list[FilterResult] = []
    if w.spread or w.host_ports or w.extended or any(
            nd.max_pods is not None for nd in pc.ix.nodes):
        usage = NodeUsage(pc, pc.snapshot.pods) if usage_of is None else usage_of()
        slots = usage.pods < usage.max_pods
        out.append(FilterResult("pods", slots, np.zeros(n, np.int64), ("too many pods",)))
        if w.extended:
            names = tuple(f"insufficient {k}" for k in w.extended)
            ok = np.ones(n, dtype=bool)
            labels = np.zeros(n, dtype=np.int64)
            for j, (k, v) in enumerate(w.extended.items()):
                cap, used = usage._ext(k)
                short = ok & (cap - used < int(v))
                labels[short] = j
                ok &= ~short
            out.append(FilterResult("extended_resources", ok, labels, names))
        if w.host_ports:
            from .sequential import ports_conflict

            ok = np.ones(n, dtype=bool)
            for i, taken in usage.ports.items():
                if any(ports_conflict(a, b) for a in w.host_ports for b in taken):
                    ok[i] = False
            out.append(FilterResult("host_ports", ok, np.zeros(n, np.int64),
                                    ("host port in use",)))
    hard = [c for c in w.spread if c.hard]
    if hard:
        by_name = {f.name: f.ok for f in pc.filter_results(w, resources=False)}
        static_ok = by_name["node_selector"] & by_name["node_affinity"]
        ok = np.ones(n, dtype=bool)
        labels = np.zeros(n, dtype=np.int64)
        names = tuple(f"spread skew > {c.max_skew} ({c.topology_key})" for c in hard)
        for j, c in enumerate(hard):
            bad = ok & ~SpreadState(pc, w, c, static_ok, by_name["taints"]).ok()
            labels[bad] = j
            ok &= ~bad
        out.append(FilterResult("spread", ok, labels, names))
    return out
