"""Human-readable explanations: kube-scheduler-style summaries and per-node breakdowns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

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

    def __str__(self) -> str:
        lines = [f"{self.workload_uid}: {self.summary}"]
        if self.node is not None:
            verdict = "fits" if not self.node_reasons else "; ".join(self.node_reasons)
            lines.append(f"  {self.node}: {verdict}")
            if self.breakdown:
                terms = ", ".join(f"{k} {v:.5f}" for k, v in self.breakdown.items() if v)
                lines.append(f"  cost {sum(self.breakdown.values()):.5f} $/h ({terms})")
        for name, cost in self.best:
            lines.append(f"  candidate {name}: {cost:.5f} $/h")
        return "\n".join(lines)
