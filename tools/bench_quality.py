"""Placement quality against an exact reference that shares nothing with the engine.

Per seeded instance of six families (``tools.quality_families``: tight, SLA-heavy with
gateways and regions, residency, anti-affinity, GPU with gangs, mixed; 10-300 pods):

* **cfnet**: the Kubernetes default path (``place(snapshot, pods,
  EngineConfig(cpsat_polish=False))``, what the Kubernetes schedulers call), in a process
  of its own, its wall and CPU time the median of ``--reps`` runs; its answer checked by
  ``validate`` and priced by the reference in the reference's integer units;
* **reference**: ``tools.ref_model`` (one boolean per pod and node, validate's rules, the
  engine's prices, no classes, no hint from the engine): CP-SAT with ``--workers`` workers,
  the most pods first, then the least cost at that count, each stage limited by
  ``--work`` (CP-SAT's deterministic time: the same work on a loaded machine) and by
  ``--seconds`` of wall clock. The cost is then solved again for exactly the pods cfnet
  placed (the same limits), so the cost gap always compares the same pods; where the
  lexicographic answer places those same pods, the cheaper of the two answers and the
  higher of the two bounds stand.

Columns: both counts (the reference's with its status and proven bound), both costs, the
reference's bound on the cost, the gap to the reference's answer (negative: cfnet found a
cheaper placement than the reference did in its time) and to its bound (the most cfnet can
be above the optimum), cfnet's wall time and the reference's. Then median and worst lines.

With ``--before-tree DIR`` (another checkout, e.g. ``git archive`` of an older commit),
cfnet of DIR runs too, in a process of its own, before or after this tree's alternately per
instance; its rows (``before``) are priced and compared against the same reference (solved
again for its pods where they differ), and a last table compares both trees per instance.

    python -m tools.bench_quality [--sizes 10,40,100,200,300 --seeds 1-5 --work 10]
        [--families tight,sla,...] [--quick] [--before-tree DIR]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the engine on one core, as production

import argparse
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cloud_core.placement import EngineConfig, validate
from tools.quality_families import FAMILIES
from tools.ref_model import RefModel, RefResult

K8S = EngineConfig(cpsat_polish=False)  # the Kubernetes schedulers' default


@dataclass
class Row:
    family: str
    pods: int
    nodes: int
    seed: int
    placed: int
    violations: int
    cost: float  # cfnet's $/hour in the reference's integer units (nan: not priced)
    wall_s: float
    cpu_s: float
    ref_placed: int
    ref_count_status: str
    ref_count_bound: int
    ref_cost: float  # the reference's least cost of placing the pods cfnet placed
    ref_status: str
    ref_bound: float
    ref_s: float
    ref_violations: int  # validate on the reference's answers: 0, or the model is wrong

    @property
    def gap(self) -> float:
        """cfnet's cost over the reference's for the same pods, in %."""
        return _pct(self.cost, self.ref_cost)

    @property
    def gap_bound(self) -> float:
        """cfnet's cost over the reference's proven bound, in %: the most it can lose."""
        return _pct(self.cost, self.ref_bound)


def best_same(a: RefResult | None, b: RefResult) -> RefResult:
    """The reference for one set of pods from two solves of it: the cheaper answer (its
    status and assignments), and the higher of the two proven bounds (each bounds the
    cost of placing those pods). ``a`` may be None (one solve only)."""
    if a is None:
        return b
    cheap = a if not math.isfinite(b.cost) or (
        math.isfinite(a.cost) and a.cost <= b.cost) else b
    bounds = [x.bound for x in (a, b) if math.isfinite(x.bound)]
    proven = "OPTIMAL" in (a.status, b.status)  # then both costs are the optimum
    return replace(cheap, bound=max(bounds) if bounds else math.nan,
                   seconds=a.seconds + b.seconds,
                   status="OPTIMAL" if proven else cheap.status)


def _pct(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        return math.nan
    return (a - b) / b * 100.0


# cfnet of a tree, in a process of its own: one instance per line of stdin (that tree's own
# code only: another tree's tools may predate this one)
_WORKER = """
import json, os, statistics, sys, time
os.environ.setdefault("OMP_NUM_THREADS", "1")
from cloud_core.placement import EngineConfig, place
from cloud_core.placement.cpsat import warm_up
from tools.quality_families import FAMILIES
warm_up()
print("ready", flush=True)
for line in sys.stdin:
    fam, n, seed, reps = line.split()
    snap, pods = FAMILIES[fam](int(n), int(seed))
    walls, cpus = [], []
    for _ in range(int(reps)):
        t0, c0 = time.perf_counter(), time.process_time()
        res = place(snap, pods, EngineConfig(cpsat_polish=False))
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    print(json.dumps({"got": dict(res.assignments), "wall": statistics.median(walls),
                      "cpu": statistics.median(cpus)}), flush=True)
"""


class Cfnet:
    """cfnet of ``tree`` in a process of its own: this tree's, and with ``--before-tree``
    the other's. Not in the benchmark's process: beside the reference's models and their
    garbage, the same code took 10-15 % more wall time there than in a process of its
    own, as the core runs it."""

    def __init__(self, tree: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER], cwd=tree, text=True,
            env=dict(os.environ, PYTHONPATH=tree), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"cfnet's process in {tree} did not start")

    def run(self, family: str, n_pods: int, seed: int, reps: int
            ) -> tuple[dict[str, str], float, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{family} {n_pods} {seed} {reps}\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        return dict(out["got"]), float(out["wall"]), float(out["cpu"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure(family: str, n_pods: int, seed: int, seconds: float, workers: int,
            reps: int, work: float | None, this: Cfnet, before: Cfnet | None = None,
            first: bool = False) -> tuple[Row, Row | None]:
    """This tree's row and, with ``before``, the other tree's (run ``first`` or after)."""
    snap, pods = FAMILIES[family](n_pods, seed)
    old = before.run(family, n_pods, seed, reps) if before is not None and first else None
    got, wall, cpu = this.run(family, n_pods, seed, reps)
    if before is not None and old is None:
        old = before.run(family, n_pods, seed, reps)
    viol = len(validate(snap, pods, got, K8S))
    ref = RefModel(snap, pods, K8S)
    scale = K8S.cost_scale
    cost = ref.price(got) / scale if not viol and ref.accepts(got) else math.nan
    lex = ref.solve(seconds, workers, work=work)
    # the cost for exactly cfnet's pods, solved for them; where the lexicographic answer
    # places those same pods, the cheaper of the two (its cost stage starts from the count
    # stage's answer and, on the tight family, often ends far above a solve of the pods
    # alone: 66.4 against 55.6 $/h on tight 94 x 16, seed 2)
    alone = ref.solve(seconds, workers, only=got, work=work)
    same = best_same(lex if set(got) == set(lex.assignments) else None, alone)
    ref_viol = (len(validate(snap, pods, lex.assignments, K8S))
                + len(validate(snap, pods, alone.assignments, K8S)))
    row = Row(family, len(pods), len(snap.nodes), seed, len(got), viol, cost, wall, cpu,
              lex.placed, lex.count_status, lex.count_bound,
              same.cost, same.status, same.bound, lex.seconds + alone.seconds, ref_viol)
    if old is None:
        return row, None
    got_b, wall_b, cpu_b = old
    viol_b = len(validate(snap, pods, got_b, K8S))
    cost_b = ref.price(got_b) / scale if not viol_b and ref.accepts(got_b) else math.nan
    same_b = same if set(got_b) == set(got) else best_same(
        lex if set(got_b) == set(lex.assignments) else None,
        ref.solve(seconds, workers, only=got_b, work=work))
    return row, replace(row, family=f"{family} (before)", placed=len(got_b),
                        violations=viol_b, cost=cost_b, wall_s=wall_b, cpu_s=cpu_b,
                        ref_cost=same_b.cost, ref_status=same_b.status,
                        ref_bound=same_b.bound)


HEADER = ("| family, pods x nodes, seed | cfnet placed | reference placed (status, bound) | "
          "cfnet $/h | reference $/h, same pods (status) | reference bound $/h | "
          "cfnet vs reference | cfnet vs bound | cfnet wall s (k8s path) | cfnet CPU s | "
          "reference wall s |")


def line(r: Row) -> str:
    more = "" if r.placed == r.ref_placed else f" ({r.ref_placed - r.placed:+d})"
    return (f"| {r.family} {r.pods}x{r.nodes} s{r.seed} | {r.placed}"
            f"{f' ({r.violations} violations)' if r.violations else ''} | "
            f"{r.ref_placed}{more} ({r.ref_count_status}, <= {r.ref_count_bound})"
            f"{f' ({r.ref_violations} VIOLATIONS)' if r.ref_violations else ''} | "
            f"{r.cost:.4f} | {r.ref_cost:.4f} ({r.ref_status}) | {r.ref_bound:.4f} | "
            f"{r.gap:+.2f} % | {r.gap_bound:+.2f} % | {r.wall_s:.2f} | {r.cpu_s:.2f} | "
            f"{r.ref_s:.1f} |")


def summary(rows: Sequence[Row]) -> list[str]:
    """Median and worst lines: the gaps, the counts, cfnet's wall time."""
    gaps = [r.gap for r in rows if math.isfinite(r.gap)]
    proven = [r.gap for r in rows if math.isfinite(r.gap) and r.ref_status == "OPTIMAL"]
    bounds = [r.gap_bound for r in rows if math.isfinite(r.gap_bound)]
    walls = [r.wall_s for r in rows]
    fewer = [r for r in rows if r.placed < r.ref_placed]
    short = ", ".join(f"{r.family} {r.pods} s{r.seed}: {r.placed}/{r.ref_placed}"
                      for r in fewer) or "-"
    worst = max(rows, key=lambda r: r.gap if math.isfinite(r.gap) else -math.inf)
    slow = max(rows, key=lambda r: r.wall_s)

    def stat(xs: Sequence[float]) -> str:
        return (f"median {statistics.median(xs):+.2f} %, worst {max(xs):+.2f} %"
                if xs else "none")

    return [
        f"| median | {statistics.median([r.placed for r in rows]):g} | "
        f"{statistics.median([r.ref_placed for r in rows]):g} | | | | | "
        f"{statistics.median(gaps) if gaps else math.nan:+.2f} % | "
        f"{statistics.median(bounds) if bounds else math.nan:+.2f} % | "
        f"{statistics.median(walls):.2f} | {statistics.median(r.cpu_s for r in rows):.2f} | |",
        f"| worst | {len(fewer)} instances with fewer pods than the reference "
        f"({sum(r.ref_placed - r.placed for r in fewer)} pods) | | | | | | "
        f"{worst.gap:+.2f} % ({worst.family} {worst.pods} s{worst.seed}) | "
        f"{max(bounds, default=math.nan):+.2f} % | {slow.wall_s:.2f} ({slow.family} "
        f"{slow.pods} s{slow.seed}) | {max(r.cpu_s for r in rows):.2f} | |",
        "",
        f"* cost vs the reference: {stat(gaps)} over {len(gaps)} instances; where the "
        f"reference is proven optimal: {stat(proven)} over {len(proven)}",
        f"* cost vs the reference's bound: {stat(bounds)}",
        f"* pods: cfnet placed fewer than the reference on {len(fewer)} of {len(rows)} "
        f"instances ({short})",
        f"* reference count stage: {sum(r.ref_count_status == 'OPTIMAL' for r in rows)} "
        f"OPTIMAL of {len(rows)}; cost stage: "
        f"{sum(r.ref_status == 'OPTIMAL' for r in rows)} OPTIMAL",
        f"* violations (validate): cfnet {sum(r.violations for r in rows)}, the reference "
        f"{sum(r.ref_violations for r in rows)}",
    ]


def _range(s: str) -> list[int]:
    out: list[int] = []
    for part in s.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_quality",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--sizes", default="10,40,100,200,300",
                    help="pods per instance; the i-th size goes with the i-th seed")
    ap.add_argument("--seeds", default="1-5")
    ap.add_argument("--work", type=float, default=10.0,
                    help="CP-SAT deterministic time per stage (0: none), load-independent")
    ap.add_argument("--seconds", type=float, default=120.0,
                    help="CP-SAT wall-clock cap per stage")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="cfnet runs per instance (median)")
    ap.add_argument("--quick", action="store_true",
                    help="sizes 10,40, seeds 1-2, work 2 per stage, 1 rep")
    ap.add_argument("--before-tree", default="",
                    help="another checkout: its cfnet too, in a process of its own, "
                         "alternated per instance, against the same reference")
    a = ap.parse_args(argv)
    if a.quick:
        a.sizes, a.seeds, a.work, a.reps = "10,40", "1-2", 2.0, 1
    sizes = [int(x) for x in a.sizes.split(",")]
    seeds = _range(a.seeds)
    if len(seeds) != len(sizes):
        ap.error("--sizes and --seeds pair up: give as many of each")
    print(HEADER)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows: list[Row] = []
    olds: list[Row] = []
    this = Cfnet(str(Path(__file__).resolve().parents[1]))
    before = Cfnet(a.before_tree) if a.before_tree else None
    try:
        for fam in a.families.split(","):
            for n, seed in zip(sizes, seeds, strict=True):
                row, old = measure(fam, n, seed, a.seconds, a.workers, a.reps,
                                   a.work or None, this, before, first=len(rows) % 2 == 1)
                rows.append(row)
                print(line(row), flush=True)
                if old is not None:
                    olds.append(old)
                    print(line(old), flush=True)
    finally:
        this.close()
        if before is not None:
            before.close()
    print("\n".join(summary(rows)))
    if olds:
        print(f"\n--before-tree {a.before_tree}:")
        print("\n".join(summary(olds)))
    print(f"\n(reference: CP-SAT, {a.workers} workers, per stage deterministic time "
          f"{a.work:g} (wall cap {a.seconds:g} s); cfnet wall and CPU time median of {a.reps}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
