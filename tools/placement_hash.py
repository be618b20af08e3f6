"""The placement hash: one digest of the engine's answers on seven fixed instances.

A change that should not change what the engine decides (a refactoring, a speed-up) is
checked by computing this before and after: equal digests mean the same pod -> node map on
every instance. Instances: the tight family (``tools.bench_tight.make_tight``) at 50 x 10
(seed 1), 300 x 60 (seeds 1, 2 and 4), 1,000 x 200 (seed 3) and 3,000 x 500 (seed 1), and
the second family (``make_sla``) at 200 x 40 (seed 1); each placed once on the Kubernetes
default path (``EngineConfig(cpsat_polish=False)``). Per instance the digest is SHA-256 of
``repr(sorted(assignments.items()))`` (as ``bench_tight``'s run-to-run check); the combined
digest is SHA-256 of the seven, in order.

    python -m tools.placement_hash [--only 50x10,300x60]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: set before numpy is imported

import argparse
import hashlib
import time

from cloud_core.placement import EngineConfig, place, validate
from tools.bench_tight import TightInstance, make_sla, make_tight

# (family, pods, nodes, seed)
INSTANCES: tuple[tuple[str, int, int, int], ...] = (
    ("tight", 50, 10, 1), ("tight", 300, 60, 1), ("tight", 300, 60, 2),
    ("tight", 300, 60, 4), ("tight", 1000, 200, 3), ("tight", 3000, 500, 1),
    ("sla", 200, 40, 1))


def instance(family: str, pods: int, nodes: int, seed: int) -> TightInstance:
    """One of the hash instances, built by its family's generator."""
    if family == "sla":
        return make_sla(nodes, pods, seed)
    return make_tight(nodes, pods, seed)


def digest(assignments: dict[str, str]) -> str:
    """SHA-256 of one placement (uid -> node), order-free."""
    return hashlib.sha256(repr(sorted(assignments.items())).encode()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="PODSxNODES,... (default: all seven)")
    args = ap.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    cfg = EngineConfig(cpsat_polish=False)
    total = hashlib.sha256()
    print("| instance | placed | cost $/h | violations | wall s | digest |")
    print("|---|---|---|---|---|---|")
    for fam, p, n, seed in INSTANCES:
        if only and f"{p}x{n}" not in only:
            continue
        inst = instance(fam, p, n, seed)
        t0 = time.perf_counter()
        res = place(inst.snapshot, inst.pods, cfg)
        wall = time.perf_counter() - t0
        d = digest(dict(res.assignments))
        total.update(d.encode())
        viol = len(validate(inst.snapshot, inst.pods, res.assignments, cfg))
        print(f"| {fam} {p}x{n} s{seed} | {len(res.assignments)}/{len(inst.pods)} | "
              f"{res.total_cost:.4f} | {viol} | {wall:.2f} | {d[:16]} |", flush=True)
    print(f"combined: {total.hexdigest()}")


if __name__ == "__main__":
    main()
