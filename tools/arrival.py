"""The arrival mode's bookkeeping and statistics (``tools.bench_k8s --arrival``).

Pods are created at a fixed rate on a running scheduler; each is timed from its create
call's return to the watch first seeing it bound. This module holds what needs no API
server: the pacing schedule, one run's record, its latency percentiles and CPU per pod,
and the table of medians over repetitions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from tools.stats import pct

QUANTILES = (0.5, 0.9, 0.99)


def slots(rate: float, seconds: float, max_pods: int) -> list[float]:
    """Offsets (s from the start) at which pod i is due: ``i / rate``, for ``rate`` x
    ``seconds`` pods, at most ``max_pods``."""
    if rate <= 0 or seconds <= 0:
        return []
    n = min(round(rate * seconds), max_pods)
    return [i / rate for i in range(n)]


@dataclass
class ArrivalRun:
    """One scheduler, one rate, one repetition: per pod (by index) when its create call
    returned and when the watch first saw it bound (monotonic seconds; NaN: never)."""

    scheduler: str
    rep: int
    rate: float
    created: list[float] = field(default_factory=list)
    bound: list[float] = field(default_factory=list)
    sched_cpu_s: float = math.nan  # the scheduler's CPU over the arrival window
    api_cpu_s: float = math.nan
    # the API server's CPU over the same window at its idle rate (the scheduler running, no
    # pod arriving: kwok's node Leases and status, the watches' bookmarks), measured just
    # before the arrivals: at 20 pods/s and 5,000 kwok nodes most of ``api_cpu_s``
    api_idle_cpu_s: float = math.nan
    sched_idle_cpu_s: float = math.nan  # the scheduler's, the same way (its idle loop)
    violations: list[str] = field(default_factory=list)

    @property
    def pods(self) -> int:
        return len(self.created)

    def latencies_ms(self) -> list[float]:
        """Bound pods' create-return -> seen-bound, in ms. The watch can see a binding
        before the creating thread records its return: such a pod counts as 0."""
        return [max(b - c, 0.0) * 1000.0 for c, b in zip(self.created, self.bound, strict=True)
                if math.isfinite(c) and math.isfinite(b)]

    @property
    def n_bound(self) -> int:
        return sum(1 for b in self.bound if math.isfinite(b))

    def achieved_rate(self) -> float:
        """Pods created per second, first create to last (the pacing's own result)."""
        ts = [c for c in self.created if math.isfinite(c)]
        if len(ts) < 2 or max(ts) <= min(ts):
            return math.nan
        return (len(ts) - 1) / (max(ts) - min(ts))

    def percentile_ms(self, q: float) -> float:
        return pct(self.latencies_ms(), q)

    def max_ms(self) -> float:
        lat = self.latencies_ms()
        return max(lat) if lat else math.nan

    def cpu_ms_per_pod(self, cpu_s: float) -> float:
        return 1000.0 * cpu_s / self.n_bound if self.n_bound else math.nan


def _med(xs: Sequence[float], fmt: str) -> str:
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return "–"
    m = statistics.median(xs)
    if format(min(xs), fmt) == format(max(xs), fmt):
        return format(m, fmt)
    return f"{format(m, fmt)} ({format(min(xs), fmt)}–{format(max(xs), fmt)})"


def _achieved(rs: Sequence[ArrivalRun]) -> str:
    xs = [x for r in rs if not math.isnan(x := r.achieved_rate())]
    return f"{statistics.median(xs):.1f}" if xs else "–"


def _cpu(rs: Sequence[ArrivalRun]) -> list[list[float]]:
    """Per run: the scheduler's CPU seconds, above its idle rate, the API server's, above
    its idle rate."""
    return [[r.sched_cpu_s for r in rs], [r.sched_cpu_s - r.sched_idle_cpu_s for r in rs],
            [r.api_cpu_s for r in rs], [r.api_cpu_s - r.api_idle_cpu_s for r in rs]]


def table(runs: Sequence[ArrivalRun], names: Sequence[str], nodes: int, background: int
          ) -> str:
    """Median (min–max) over repetitions, per rate and scheduler (the rate achieved: the
    median only)."""
    head = (f"| arrival, {nodes} nodes" + (f", {background} bound pods" if background else "")
            + " | pods/s offered (achieved) | bound | latency p50 ms | p90 ms | p99 ms | "
            "max ms | scheduler CPU ms/pod | above its idle rate | kube-apiserver CPU ms/pod | "
            "above its idle rate | violations |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rate in sorted({r.rate for r in runs}):
        for n in names:
            rs = [r for r in runs if r.scheduler == n and r.rate == rate]
            if not rs:
                continue
            lines.append(
                f"| {n} | {rate:g} ({_achieved(rs)}) | "
                f"{min(r.n_bound for r in rs)}/{max(r.pods for r in rs)} | "
                + " | ".join(_med([r.percentile_ms(q) for r in rs], ".0f") for q in QUANTILES)
                + f" | {_med([r.max_ms() for r in rs], '.0f')} | "
                + " | ".join(_med([r.cpu_ms_per_pod(x) for r, x in zip(rs, xs, strict=True)],
                                  ".2f") for xs in _cpu(rs))
                + " | "
                f"{max(len(r.violations) for r in rs)} |")
    return "\n".join(lines)
