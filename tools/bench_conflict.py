"""Conflict benchmark: what explaining an unplaceable pod costs at 5,000 nodes.

Same instance, one run, alternated pod by pod (one core, as ``bench_placement``):
* **diagnose**: ``relax.diagnose`` -- the minimal conflicting set of the pod's hard
  constraints and one validator-checked relaxation per part;
* **explain**: ``placement.explain`` -- the per-filter tally the console showed before
  (the peer: what an operator already waits for on the same pod);
* **diagnose_many**: the same pods in one call, the snapshot prepared once (what the
  FailedScheduling events' reporter does for pods waiting together), per pod.

Unplaceable pods are the synthetic instance's own workloads with their constraints
tightened (security level 3, a residency and a tight latency SLA to a far region, more cpu
than a node has), so the conflicts are pairs and triples over real filters.

    python -m tools.bench_conflict [--nodes 5000 --running 10000 --pods 20 --seed 1]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402

from cloud_core.placement import Resources, RunningPod, Workload, explain  # noqa: E402
from cloud_core.placement.model import ClusterSnapshot  # noqa: E402
from cloud_core.placement.relax import diagnose, diagnose_many  # noqa: E402
from tools.bench_placement import make_instance  # noqa: E402
from tools.stats import pct  # noqa: E402


def unplaceable(snap: ClusterSnapshot, ws: list[Workload], k: int, seed: int
                ) -> list[Workload]:
    """``k`` of the instance's workloads made to fit nowhere, in a few different ways."""
    rnd = random.Random(seed)
    regions = sorted({n.region for n in snap.nodes})
    out = []
    for j, w in enumerate(rnd.sample(ws, k)):
        home = rnd.choice(regions)
        far = regions[(regions.index(home) + len(regions) // 2) % len(regions)]
        kind = j % 3
        if kind == 0:  # a triple: residency, security and latency each pairwise fine
            w2 = dataclasses.replace(w, residency=frozenset({home}), min_security_level=3,
                                     max_latency_ms=9.0, latency_to=far)
        elif kind == 1:  # too much cpu for any node with the right tier and level
            w2 = dataclasses.replace(w, requests=Resources(30000, w.requests.mem_bytes, 0),
                                     node_selector={"cfnet.io/tier": "edge"},
                                     min_security_level=3, tolerations=())
        else:  # a region nobody serves with the SLA
            w2 = dataclasses.replace(w, residency=frozenset({home}), max_latency_ms=12.0,
                                     latency_to=far)
        out.append(dataclasses.replace(w2, uid=f"stuck-{j}", gang=None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--running", type=int, default=10000)
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    snap, ws = make_instance(a.nodes, a.running + a.pods, a.seed)
    rnd = random.Random(a.seed)
    names = [n.name for n in snap.nodes]
    running = tuple(RunningPod.of(w, rnd.choice(names), uid=f"run-{i}")
                    for i, w in enumerate(ws[:a.running]))
    snap = dataclasses.replace(snap, pods=running)
    stuck = unplaceable(snap, ws[a.running:] or ws, a.pods, a.seed)
    t_diag: list[float] = []
    t_expl: list[float] = []
    sizes: list[int] = []
    shown = 0
    for w in stuck:
        t0 = time.process_time()
        d = diagnose(snap, w)
        t1 = time.process_time()
        explain(snap, w)
        t2 = time.process_time()
        t_diag.append((t1 - t0) * 1000)
        t_expl.append((t2 - t1) * 1000)
        sizes.append(len(d.conflict.alone or d.conflict.constraints))
        shown += len(d.relaxations)
    t_many: list[float] = []
    for lo in range(0, len(stuck), 7):  # rounds of 7 pods, as they wait together
        group = stuck[lo:lo + 7]
        t0 = time.process_time()
        diagnose_many(snap, [(w, 1) for w in group])
        t_many.append((time.process_time() - t0) * 1000 / len(group))
    print(f"{a.nodes} nodes, {len(snap.pods)} running pods, {len(stuck)} unplaceable pods "
          f"(parts per conflict {min(sizes)}-{max(sizes)}, {shown} suggestions shown)")
    print(f"{'per pod (CPU ms)':18} {'median':>8} {'p10':>8} {'p90':>8}")
    for name, xs in (("diagnose", t_diag), ("explain (peer)", t_expl),
                     ("diagnose_many", t_many)):
        print(f"{name:18} {pct(xs, 0.5):8.1f} {pct(xs, 0.1):8.1f} {pct(xs, 0.9):8.1f}")


if __name__ == "__main__":
    main()
