"""The latency SLA, judged in one place.

A workload's SLA is ``max_latency_ms`` to ``latency_to`` (a node, zone, region or measured
peer). On a node it is met when the effective p95 from that node to the target (the best
link, inflated when stale; ``index.effective_p95``) is at most the bound; with no usable
measurement (an infinite p95) it is never met; a workload without a bound meets it
everywhere. ``judge`` is that rule, and the share of the bound the p95 uses (the score's
term: a smaller margin costs more). The engine's filter, the scores, the independent
validator and the re-planner all ask ``judge``; ``breach`` says why one measured p95 misses
it, from the real figures. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NO_DATA = "no latency data"


@dataclass(frozen=True, slots=True)
class Judgement:
    """Per p95 given: is the SLA met, and how much of the bound the p95 uses."""

    met: np.ndarray  # bool
    # p95 / bound, at most 1; 1 with no data; 0 without a bound (or a bound <= 0): the score
    used: np.ndarray


def judge(max_ms: float | np.ndarray | None, p95: np.ndarray) -> Judgement:
    """The SLA ``max_ms`` (one bound, or one per p95; None: no SLA) against ``p95`` (ms,
    inf where nothing usable is measured)."""
    p95 = np.asarray(p95, dtype=np.float64)
    if max_ms is None:
        return Judgement(np.ones(p95.shape, dtype=bool), np.zeros(p95.shape, dtype=np.float64))
    bound = np.asarray(max_ms, dtype=np.float64)
    met = p95 <= bound  # inf (no data) is never <= a bound
    with np.errstate(divide="ignore", invalid="ignore"):
        used = np.where(np.isfinite(p95), np.minimum(p95 / bound, 1.0), 1.0)
    return Judgement(met, np.where(bound > 0, used, 0.0))


def over_bound(max_ms: float) -> str:
    """The filter's reason for nodes measured above the bound (tallied per bound, as in
    ``"0/50 nodes fit: 30 latency > 20 ms"``)."""
    return f"latency > {max_ms:g} ms"


def breach(max_ms: float | None, p95: float, target: str | None) -> str | None:
    """Why the measured ``p95`` to ``target`` misses the SLA ``max_ms``; None when met."""
    if bool(judge(max_ms, np.array([p95])).met[0]):
        return None
    to = f" to {target}" if target is not None else " (no target)"
    if not math.isfinite(p95):
        return f"{NO_DATA}{to}"
    return f"p95 {p95:.1f} ms > {max_ms:g} ms{to}"
