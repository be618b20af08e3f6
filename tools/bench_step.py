"""A lone pod's decision step on the Kubernetes path, measured in one process.

``python -m tools.bench_step`` builds the Kubernetes core's parts (``k8s.wiring.
build_actuator``) with a stand-in API client at the I/O edge (bindings and events answered
at once), feeds its handlers ``--nodes`` Nodes and ``--background`` bound pods as
``tools.bench_k8s`` makes them, and then, ``--steps`` times, one pending pod of the bench's
mix followed by one step of the loop (``Actuator.schedule_once``: the batch read, the
snapshot, the engine, the validator, the binding) and the pod's bound event, as the watch
would send it. Each step's CPU (the loop thread's) and wall time are recorded; the first
``WARM_STEPS`` are left out (the first step prepares the cluster). ``--spread`` places only
the mix's topology-spread pods (the costliest lone step).

With ``--baseline-tree DIR`` the same steps run on that tree's ``cloud_core`` too, in turns
(each repetition in a fresh process, the order alternated), and the table gives both. The
figures are CPU on whatever else the machine runs: compare trees within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WARM_STEPS = 30
SPREAD_KIND = 17  # pod_object's first topology-spread kind (i % 20 >= 17)


class _Edge:
    """The API client's verbs the step reaches, answered at once."""

    def bind_pod(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record_event(self, *args: Any, **kwargs: Any) -> None:
        return None

    def emit_event(self, *args: Any, **kwargs: Any) -> None:
        return None

    def get(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    def flush_events(self, *args: Any, **kwargs: Any) -> bool:
        return True


def measure(nodes: int, background: int, steps: int, spread: bool) -> dict[str, float]:
    """One process's steps: CPU and wall ms per step (p50, p90, mean), the first step's
    CPU ms, and how many of the pods were bound. Imported here: a ``--baseline-tree``
    child imports that tree's modules."""
    from cloud_core.k8s.config import ActuatorConfig
    from cloud_core.k8s.registry import NodeRegistry
    from cloud_core.k8s.wiring import build_actuator
    from cloud_core.placement import EngineConfig
    from tools.bench_k8s import NODE_STATUS, node_object, pod_object

    # the engine as cfnet-core runs it (k8s/flags.py: no CP-SAT polish unless asked)
    act = build_actuator(_Edge(), NodeRegistry(),  # type: ignore[arg-type]
                         ActuatorConfig(identity="bench-step", conflict_share=0,
                                        engine_config=EngineConfig(cpsat_polish=False)))
    h = act.handlers
    version = iter(range(1, 1 << 40))
    for j in range(nodes):
        o = node_object(j)
        o["status"] = NODE_STATUS
        o["metadata"].update(uid=f"node-{j}", resourceVersion=str(next(version)))
        h.on_node("ADDED", o, None)
    for i in range(background):
        p = pod_object(100_000 + i, "background", "default-scheduler")
        p["metadata"].update(uid=f"bg-{i}", resourceVersion=str(next(version)))
        p["spec"]["nodeName"] = f"bn-{(i * 7) % nodes:05d}"
        p["status"] = {"phase": "Running"}
        h.on_pod("ADDED", p, None)
    act.nodes.synced.set()
    act.pods.synced.set()
    act.pods.ready.set()
    cpu: list[float] = []
    wall: list[float] = []
    bound = 0
    for k in range(WARM_STEPS + steps):
        i = (k // 3) * 20 + SPREAD_KIND + k % 3 if spread else k
        p = pod_object(i, "arrivals", "cfnet-scheduler")
        p["metadata"].update(uid=f"pod-{i}", resourceVersion=str(next(version)))
        h.on_pod("ADDED", p, None)
        w0, c0 = time.perf_counter(), time.thread_time()
        act.schedule_once()
        c1, w1 = time.thread_time(), time.perf_counter()
        cpu.append(1000 * (c1 - c0))
        wall.append(1000 * (w1 - w0))
        node = act.cache.assumed().get(f"arrivals/{p['metadata']['name']}")
        if node:  # the watch's word that it is bound (the assumed pod confirmed)
            bound += 1
            q = {**p, "spec": {**p["spec"], "nodeName": node}, "status": {"phase": "Pending"},
                 "metadata": {**p["metadata"], "resourceVersion": str(next(version))}}
            h.on_pod("MODIFIED", q, p)
    first, cpu, wall = cpu[0], cpu[WARM_STEPS:], wall[WARM_STEPS:]
    qs = statistics.quantiles(cpu, n=10)
    return {"cpu_p50": statistics.median(cpu), "cpu_p90": qs[8], "cpu_mean": statistics.fmean(cpu),
            "wall_p50": statistics.median(wall), "first_cpu": first, "bound": bound}


def _child(tree: str, a: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        # -P: not this file's folder first on the path (the tree's modules are what is measured)
        [sys.executable, "-P", str(Path(__file__).resolve()), "--child", "--nodes", str(a.nodes),
         "--background", str(a.background), "--steps", str(a.steps),
         *(["--spread"] if a.spread else [])],
        env=env, cwd=tree, check=True, capture_output=True, text=True, timeout=1800)
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def _med(xs: Sequence[float]) -> str:
    m = statistics.median(xs)
    return f"{m:.2f}" if min(xs) == max(xs) else f"{m:.2f} ({min(xs):.2f}–{max(xs):.2f})"


COLUMNS = (("cpu_p50", "CPU ms p50"), ("cpu_p90", "p90"), ("cpu_mean", "mean"),
           ("wall_p50", "wall ms p50"), ("first_cpu", "first step CPU ms"))


def table(runs: dict[str, list[dict[str, float]]], a: argparse.Namespace) -> str:
    head = (f"| {'spread pod' if a.spread else 'lone pod'}'s step, {a.nodes} nodes, "
            f"{a.background} bound pods | " + " | ".join(c for _, c in COLUMNS) + " |")
    lines = [head, "|---|" + "---:|" * len(COLUMNS)]
    for name, rs in runs.items():
        lines.append(f"| {name} | " + " | ".join(_med([r[k] for r in rs]) for k, _ in COLUMNS)
                     + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_step",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--background", type=int, default=2000, help="pods already bound")
    ap.add_argument("--steps", type=int, default=400, help="steps measured per repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--spread", action="store_true", help="topology-spread pods only")
    ap.add_argument("--baseline-tree", metavar="DIR", help="another tree's cloud_core, in turns")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(measure(a.nodes, a.background, a.steps, a.spread)))
        return 0
    trees = [("cfnet", str(REPO))]
    if a.baseline_tree:
        trees.append(("cfnet, baseline tree", a.baseline_tree))
    runs: dict[str, list[dict[str, float]]] = {n: [] for n, _ in trees}
    for rep in range(a.reps):
        for name, tree in trees if rep % 2 == 0 else trees[::-1]:
            runs[name].append(_child(tree, a))
            print(f"# {name} rep {rep}: {runs[name][-1]}", file=sys.stderr, flush=True)
    print(table(runs, a))
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end; median (min–max) of {a.reps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
