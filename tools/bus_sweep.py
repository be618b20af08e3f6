"""``python -m tools.bus_sweep --sizes 250,500,1000``: the fleet grown on each bus to the knee.

For each bus and each fleet size, smallest first: the bus, two core replicas and the
simulated fleet of :mod:`tools.bench_bus` (1 report/s per node, end-to-end acks), a warm-up,
then ``--steady`` seconds measured: reports/s ingested against offered, p99 staleness of
the leader's view (report to state: each second's p99 over the fleet, the median of those
seconds), CPU and memory of the bus
processes and of the core processes per 1,000 nodes. A bus stops at the first size where
it degrades (the knee): ingest under 90 % of offered, or p99 staleness over twice the
first size's and over 2.5 s. No kills here (``one_run`` has them).

``--kills --runs 3``: instead, every size runs :func:`tools.bench_bus.one_run` ``--runs``
times per bus (steady window, a bus node SIGKILLed, the follower replica's bus connection
SIGKILLed, the drain): per size the kill table of ``bench_bus`` (recovery, unacknowledged,
duplicates, runs overloaded), then the sweep table and the sizing from the medians of those
same runs. Every size runs (no stop at the knee): the kills above it are what it shows.

The 100,000-node sizing is computed per bus from the sizes below its knee: each cost as a
fixed part plus a part per node, the line through the smallest and the largest of those
sizes (at small sizes the fixed part, idle servers and the digest loop, dominates a
per-1,000 figure). Measured: the costs at those sizes; assumed: that the part per node
stays linear in the fleet (more bus nodes and replicas carrying the same work per node),
which this 2-core machine cannot check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.bench_bus import (
    ACK_ACCOUNT,
    PREFIX,
    REPO,
    SIM_ACCOUNTS,
    Run,
    bus_pids,
    core_pids,
    cpu,
    make_bus,
    one_run,
    rss_mib,
    sim_argv,
    start_cores,
    table,
)
from tools.bench_bus import WARM_S as KILL_WARM_S
from tools.bench_ingest import quantile, sample_core

KNEE_RATE = 0.9
# Longer than bench_bus's 5 s: the simulator's start (interpreter, TLS connects, the first
# statuses) on a loaded machine took the first seconds of a 5 s warm-up.
WARM_S = 10.0
KNEE_STALE = 2.0
FRESH_S = 2.5


@dataclass
class Point:
    bus: str
    nodes: int
    rate: float = 0.0
    p99_stale: float = float("nan")
    bus_cpu_per_k: float = 0.0
    core_cpu_per_k: float = 0.0
    bus_mib_per_k: float = 0.0
    core_mib_per_k: float = 0.0


def point(kind: str, nodes: int, steady_s: float) -> Point:
    p = Point(kind, nodes)
    with tempfile.TemporaryDirectory(prefix=f"cfnet-sweep-{kind}-") as tmp:
        work = Path(tmp)
        b = make_bus(kind, work / "bus")
        b.start()
        sim: subprocess.Popen[str] | None = None
        cores = []
        try:
            for a in (*SIM_ACCOUNTS, ACK_ACCOUNT):
                b.add_account(a, "sim")
            cores = start_cores(b, work)
            time.sleep(2.0)  # shared subscriptions / consumers in place
            bus_rss0, core_rss0 = rss_mib(bus_pids(b)), rss_mib(core_pids(cores))
            sim = subprocess.Popen(sim_argv(b, kind, nodes, WARM_S + steady_s + 2),
                                   cwd=str(REPO), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, text=True)
            time.sleep(WARM_S)
            acc0 = sum(c.ingest.counters().accepted for c in cores)
            bus0, core0, w0 = cpu(bus_pids(b)), cpu(core_pids(cores)), time.time()
            per_s: list[float] = []  # each second's p99 over the fleet
            while time.time() - w0 < steady_s:
                time.sleep(1.0)
                if stale := sample_core(cores[0], PREFIX).stale:
                    per_s.append(quantile(stale, 0.99))
            dt, k = time.time() - w0, nodes / 1000
            p.rate = (sum(c.ingest.counters().accepted for c in cores) - acc0) / dt
            # The median second: one stall of the shared machine (every node late at
            # once) does not make a knee, a fleet the bus and cores cannot carry does.
            p.p99_stale = statistics.median(per_s) if per_s else float("nan")
            p.bus_cpu_per_k = (cpu(bus_pids(b)) - bus0) / dt / k
            p.core_cpu_per_k = (cpu(core_pids(cores)) - core0) / dt / k
            p.bus_mib_per_k = (rss_mib(bus_pids(b)) - bus_rss0) / k
            p.core_mib_per_k = (rss_mib(core_pids(cores)) - core_rss0) / k
        finally:
            if sim is not None:
                sim.kill()
                sim.wait(10)
            for c in cores:
                c.stop()
            b.stop()
    return p


def degraded(p: Point, first: Point) -> bool:
    slow = p.p99_stale > max(FRESH_S, KNEE_STALE * first.p99_stale)
    return p.rate < KNEE_RATE * p.nodes or slow or p.p99_stale != p.p99_stale


def sweep(buses: Sequence[str], sizes: Sequence[int], steady_s: float,
          log: Callable[[str], None]) -> dict[str, list[Point]]:
    out: dict[str, list[Point]] = {}
    for kind in buses:
        pts = out[kind] = []
        for n in sizes:
            p = point(kind, n, steady_s)
            pts.append(p)
            log(f"{kind} {n:,} nodes: {p.rate:,.0f} reports/s, p99 staleness "
                f"{p.p99_stale:.2f} s, bus {p.bus_cpu_per_k:.3f} / core "
                f"{p.core_cpu_per_k:.3f} cores per 1,000")
            if degraded(p, pts[0]):
                log(f"{kind}: knee at {n:,} nodes")
                break
    return out


def kill_sweep(buses: Sequence[str], sizes: Sequence[int], runs: int, steady_s: float,
               log: Callable[[str], None]) -> dict[str, dict[int, list[Run]]]:
    """``one_run`` ``runs`` times per bus and size; runs alternate the buses, so drift in
    the machine's load hits both."""
    out: dict[str, dict[int, list[Run]]] = {k: {} for k in buses}
    for n in sizes:
        for i in range(runs):
            for kind in buses:
                log(f"{kind} {n:,} nodes: run {i + 1}/{runs}")
                out[kind].setdefault(n, []).append(one_run(kind, n, steady_s, log))
    return out


def median_point(kind: str, nodes: int, runs: list[Run]) -> Point:
    """The sweep's point for one size from its kill runs: the median of each figure."""
    def m(f: Callable[[Run], float]) -> float:
        xs = [x for x in map(f, runs) if x == x]
        return statistics.median(xs) if xs else float("nan")

    return Point(kind, nodes, rate=m(lambda r: r.rate), p99_stale=m(lambda r: r.p99_second),
                 bus_cpu_per_k=m(lambda r: r.bus_cpu_per_k),
                 core_cpu_per_k=m(lambda r: r.core_cpu_per_k),
                 bus_mib_per_k=m(lambda r: r.bus_mib_per_k),
                 core_mib_per_k=m(lambda r: r.core_mib_per_k))


def kill_report(kills: dict[str, dict[int, list[Run]]], steady_s: float) -> str:
    """Per size the kill table, then the sweep and the sizing from the same runs."""
    sizes = sorted({n for per in kills.values() for n in per})
    parts = [table({k: kills[k][n] for k in kills if n in kills[k]}, n, steady_s)
             for n in sizes]
    runs = max(len(v) for per in kills.values() for v in per.values())
    points = {k: [median_point(k, n, per[n]) for n in sorted(per)] for k, per in kills.items()}
    parts.append(report(points, steady_s, runs=runs, warm_s=KILL_WARM_S))
    return "\n\n".join(parts)


def at_100k(lo: Point, hi: Point, per_k: Callable[[Point], float]) -> float:
    """The total at 100,000 nodes of a cost measured per 1,000 nodes at two sizes: the
    line through (size, total) of both (fixed part + part per node; a fixed part below
    zero, noise, counts as zero); with one size, per-1,000 x 100."""
    t_lo, t_hi = per_k(lo) * lo.nodes / 1000, per_k(hi) * hi.nodes / 1000
    if hi.nodes == lo.nodes:
        return per_k(hi) * 100
    slope = (t_hi - t_lo) / (hi.nodes - lo.nodes)
    fixed = max(0.0, t_lo - slope * lo.nodes)
    return fixed + max(0.0, slope) * 100_000


def report(points: dict[str, list[Point]], steady_s: float, runs: int = 1,
           warm_s: float = WARM_S) -> str:
    each = "one run per size" if runs == 1 else f"median of {runs} runs per size"
    lines = [f"Fleet sweep, 1 report/s per node, {steady_s:g} s measured per size after "
             f"{warm_s:g} s of warm-up; {each}; the knee (*) is the first size "
             "with ingest under 90 % of offered or p99 staleness over twice the first "
             "size's (and over 2.5 s)", "",
             "| bus | nodes | reports/s (offered) | p99 staleness (median second), s | "
             "bus cores / 1,000 | "
             "core cores / 1,000 (2 replicas) | bus MiB / 1,000 | core MiB / 1,000 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, pts in points.items():
        for i, p in enumerate(pts):
            knee = " *" if i and degraded(p, pts[0]) else ""
            lines.append(f"| {kind} | {p.nodes:,}{knee} | {p.rate:,.0f} ({p.nodes:,}) | "
                         f"{p.p99_stale:.2f} | {p.bus_cpu_per_k:.3f} | {p.core_cpu_per_k:.3f} | "
                         f"{p.bus_mib_per_k:.0f} | {p.core_mib_per_k:.0f} |")
    lines += ["", "100,000 nodes at 1 report/s, per bus from its sizes below the knee: a fixed "
              "part and a part per node, fitted through the smallest and the largest of them "
              "(measured: the cost at those sizes; assumed: linear in the fleet beyond them)",
              "", "| bus | fitted on | bus cores | bus GiB | core cores (replicas together) | "
              "core GiB |", "|---|---:|---:|---:|---:|---:|"]
    for kind, pts in points.items():
        good = [p for p in pts if not degraded(p, pts[0])]
        if not good:
            lines.append(f"| {kind} | none below the knee | | | | |")
            continue
        lo, hi = good[0], good[-1]
        cells = [at_100k(lo, hi, f) for f in (
            lambda p: p.bus_cpu_per_k, lambda p: p.bus_mib_per_k / 1024,
            lambda p: p.core_cpu_per_k, lambda p: p.core_mib_per_k / 1024)]
        sizes = f"{lo.nodes:,}-{hi.nodes:,}" if hi is not lo else f"{lo.nodes:,}"
        lines.append(f"| {kind} | {sizes} | {cells[0]:,.0f} | {cells[1]:,.1f} | "
                     f"{cells[2]:,.0f} | {cells[3]:,.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bus_sweep",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="100,250,500,1000,2000", help="fleet sizes, nodes")
    ap.add_argument("--steady", type=float, default=15.0, help="seconds measured per size")
    ap.add_argument("--buses", default="mosquitto,nats")
    ap.add_argument("--report", type=Path, default=None,
                    help="only the tables, from the points line a run printed (JSON)")
    ap.add_argument("--kills", action="store_true",
                    help="each size as bench_bus runs it (kills, drain), --runs times")
    ap.add_argument("--runs", type=int, default=3, help="with --kills: runs per size and bus")
    a = ap.parse_args(argv)
    if a.report is not None:
        raw = json.loads(a.report.read_text()[:1_000_000])
        if "kills" in raw:
            print(kill_report({k: {int(n): [Run(**r) for r in rs[:5]]
                                   for n, rs in list(per.items())[:8]}
                               for k, per in list(raw["kills"].items())[:2]},
                              float(raw["steady"])))
            return 0
        pts = {k: [Point(**p) for p in v[:8]] for k, v in list(raw["points"].items())[:2]}
        print(report(pts, float(raw["steady"])))
        return 0
    sizes = sorted(int(x) for x in a.sizes.split(","))
    if not 1 <= len(sizes) <= 8 or not all(1 <= n <= 20000 for n in sizes) \
            or not 3 <= a.steady <= 40 or not 1 <= a.runs <= 5:
        ap.error("bounds: 1-8 sizes of 1..20000 nodes, --steady 3..40, --runs 1..5")
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[bus_sweep {time.time() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    if a.kills:
        kills = kill_sweep(a.buses.split(","), sizes, a.runs, a.steady, log)
        print(kill_report(kills, a.steady))
        print("\n" + json.dumps({"steady": a.steady, "kills": {
            k: {str(n): [vars(r) for r in rs] for n, rs in per.items()}
            for k, per in kills.items()}}))
        print(f"\n(python -m tools.bus_sweep {' '.join(sys.argv[1:] if argv is None else argv)}"
              f"; {time.time() - t0:.0f} s)")
        return 0
    points = sweep(a.buses.split(","), sizes, a.steady, log)
    print(report(points, a.steady))
    print("\n" + json.dumps({"steady": a.steady, "points": {
        k: [vars(p) for p in v] for k, v in points.items()}}))
    print(f"\n(python -m tools.bus_sweep {' '.join(sys.argv[1:] if argv is None else argv)}; "
          f"{time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
