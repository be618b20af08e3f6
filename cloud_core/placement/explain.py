"""Human-readable explanations: kube-scheduler-style summaries and per-node breakdowns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

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
