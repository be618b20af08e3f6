"""Tight-capacity placement benchmark: instances with a hidden packing at 90-98 % of capacity.

Every instance is built by *first* filling each node to a target utilisation drawn from
``util`` (cpu and memory both, GPUs exactly) with pods that fit it, and only then drawing
every pod's constraints so that its hidden node satisfies them. So all pods can be placed at
once: the maximum placeable is the pod count, known by construction (no solver needed to
know it). The pods are then shuffled and handed to the engine as one batch.

Shape of the instances: uneven regions (40/25/15/10/6/4 % of the nodes), 25 % GPU nodes with
1/2/4/8 GPUs (tainted; GPU pods of 1-8 GPUs tolerate), pods of widely mixed cpu:memory
ratios, residency to one or two regions, latency SLAs with 15-50 % of the nodes in range,
hostname spread groups (some near the node count of their region), data gravity.

Reported per size: placed vs known-feasible, the LP upper bound on the count, cost vs the LP
lower bound *among the placed pods* (the least $/hour of placing exactly the pods cfnet
placed, integrality relaxed) and vs the hidden packing's own cost (a real placement of every
pod: the bound's looseness shows there), wall and CPU time, and run-to-run variation (are
the repeated placements identical). Median and spread over ``--reps`` repetitions; the flow
route alone (``EngineConfig(pack=False)``: flow + repair + CP-SAT when small, i.e. the
engine before count-first packing, less its wall-clock limit) is the baseline measured in
the same run.

Paths: the Kubernetes schedulers' default (``cpsat_polish=False``), the local mode's
(``cpsat_polish=True``: the whole-batch CP-SAT polish too) and the flow route alone.

References that integer placements can reach (CP-SAT on the engine's exact class model, one
worker, hinted with the Kubernetes path's answer, stopped by CPU time, not wall time, so a
loaded machine does not shorten it): ``--reference-seconds 60,300`` gives CP-SAT's best at
each CPU checkpoint of one run per size, its proven bound and the LP bound; the proof table
(``--proof``) the proven optimum of small instances; ``--family`` the second family
(``make_sla``: latency SLAs to gateways and regions, anti-affinity, GPUs at moderate load),
per seed, against CP-SAT's best in ``--family-seconds``.

    python -m tools.bench_tight [--sizes 3000x500,300x60 --util 0.95 --reps 5 --seed 1]
        [--reference-seconds 60,300] [--proof 50x10] [--family 200x40 --family-seeds 1-10]
        [--no-lp]  (the size table without its LP bounds: minutes at 3,000 pods)
        [--before-tree DIR]  (DIR's Kubernetes path and this tree's, each in a process of
                              its own, alternated rep by rep: CPU before/after, same answer)
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: set before numpy is imported

import argparse
import dataclasses
import hashlib
import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from cloud_core.placement import (
    ClusterSnapshot,
    EngineConfig,
    LabelSelector,
    LinkInfo,
    NodeInfo,
    PodAffinityTerm,
    Resources,
    Taint,
    Toleration,
    Workload,
    place,
    validate,
)
from cloud_core.placement.model import HOSTNAME

GIB = 1 << 30
MI = 1 << 20
REGION_SHARE = (0.40, 0.25, 0.15, 0.10, 0.06, 0.04)
# millicores, GiB: general-purpose (4 GiB per core) and memory-optimised (8 GiB per core)
CPU_NODES = ((8000, 32), (16000, 64), (16000, 128), (32000, 128), (32000, 256), (64000, 256))
POD_CPU = (250, 500, 1000, 2000, 3000, 4000, 6000, 8000, 12000, 16000)  # millicores
POD_RATIO = (0.5, 1.0, 1.0, 1.0, 2.0)  # memory per core, relative to the node type's
GPU_TOL = (Toleration("nvidia.com/gpu", "Exists"),)


def _split(total: int, parts: int, unit: int, rnd: random.Random) -> list[int]:
    """``parts`` random positive pieces on a grid of ``unit``; the last takes the rest."""
    if parts == 1:
        return [total]
    w = [rnd.uniform(0.3, 1.0) for _ in range(parts)]
    s = sum(w)
    out = [max(unit, int(total * x / s) // unit * unit) for x in w[:-1]]
    out.append(total - sum(out))
    return out


def _gpu_split(g: int, rnd: random.Random) -> list[int]:
    """A node's GPUs as pods of 1/2/4/8 GPUs (powers of two, the largest first)."""
    out: list[int] = []
    while g:
        opts = [s for s in (1, 2, 4, 8) if s <= g]
        s = rnd.choice(opts[-2:] if len(opts) > 1 else opts)
        out.append(s)
        g -= s
    return out


@dataclasses.dataclass
class TightInstance:
    snapshot: ClusterSnapshot
    pods: list[Workload]
    hidden: dict[str, str]  # uid -> node: a placement of every pod, by construction


def make_tight(n_nodes: int, n_pods: int, seed: int = 1,
               util: tuple[float, float] = (0.90, 0.98)) -> TightInstance:
    rnd = random.Random(seed)
    regions = [f"r{i}" for i in range(len(REGION_SHARE))]
    reg_of = rnd.choices(range(len(regions)), REGION_SHARE, k=n_nodes)
    for r in range(len(regions)):  # every region has a node
        reg_of[r % n_nodes] = r
    nodes: list[NodeInfo] = []
    for i in range(n_nodes):
        ri = reg_of[i]
        gpus = rnd.choice((1, 2, 4, 8)) if rnd.random() < 0.25 else 0
        if gpus:
            cpu, mem = max(16000, 8000 * gpus), max(64, 32 * gpus)
        else:
            cpu, mem = rnd.choice(CPU_NODES)
        price = (0.5 * cpu / 16000 + 2.5 * gpus) * (1.0 + 0.12 * ((ri * 3) % 5))
        nodes.append(NodeInfo(
            name=f"t{i:05d}", region=regions[ri], zone=f"{regions[ri]}-z{i % 3}",
            taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),) if gpus else (),
            capacity=Resources(cpu, mem * GIB, gpus),
            price_per_hour=round(price * rnd.uniform(0.9, 1.1), 4),
            energy_price_per_kwh=0.1 + 0.02 * ri, carbon_g_per_kwh=100 + 60 * ri,
            idle_watts=300 if gpus else 100, max_watts=1500 if gpus else 350))
    # Latency: regions on a line, one measured link per (node, other region).
    pos = [ri * 10.0 + rnd.uniform(0, 8) for ri in reg_of]
    links: dict[tuple[str, str], LinkInfo] = {}
    first = {r: next(i for i in range(n_nodes) if reg_of[i] == r) for r in range(len(regions))}
    lat = np.zeros((n_nodes, len(regions)))
    for i in range(n_nodes):
        for r in range(len(regions)):
            if r == reg_of[i]:
                continue
            p95 = round(abs(pos[i] - r * 10.0) * 1.5 + rnd.uniform(1, 6), 1)
            lat[i, r] = p95
            links[(nodes[i].name, nodes[first[r]].name)] = LinkInfo(p95 / 1.4, p95, 0.0, 1e8,
                                                                    1.0)
    # Per node, how many pods: n_pods spread over the nodes (at least one each).
    per = [1] * n_nodes
    weights = [nd.capacity.cpu_milli for nd in nodes]
    for i in rnd.choices(range(n_nodes), weights, k=max(n_pods - n_nodes, 0)):
        per[i] += 1
    # Spread groups: in some regions a small hostname-spread service on ~90 % of the nodes.
    spread_of: dict[int, tuple[str, int, int]] = {}
    for r in range(len(regions)):
        if rnd.random() < 0.5:
            members = [i for i in range(n_nodes) if reg_of[i] == r and rnd.random() < 0.9]
            for i in members:
                spread_of[i] = (f"spread-{r}", 250, 512)
    raw: list[tuple[int, Resources, bool]] = []  # (hidden node, requests, spread)
    for i, nd in enumerate(nodes):
        u = rnd.uniform(*util)
        cap = nd.capacity
        budget = [int(cap.cpu_milli * util[1]), int(cap.mem_bytes * util[1])]
        used = [0, 0]
        ratio = cap.mem_bytes / cap.cpu_milli  # bytes per millicore of this node type

        def add(cpu: int, mem: int, gpus: int, spread: bool = False, _i: int = i,
                _used: list[int] = used) -> None:
            raw.append((_i, Resources(cpu, mem, gpus), spread))
            _used[0] += cpu
            _used[1] += mem

        if i in spread_of and per[i] > 1:
            _, c0, m0 = spread_of[i]
            add(c0, m0 * MI, 0, True)
        for g in _gpu_split(cap.gpus, rnd) if cap.gpus else []:
            add(g * rnd.choice((2000, 3000, 4000)), g * rnd.choice((8, 16)) * GIB, g)
        # then catalogue pods, about per[i] in all, until the dominant share reaches u
        k = max(per[i] - len([r for r in raw if r[0] == i]), 1)
        while max(used[0] / cap.cpu_milli, used[1] / cap.mem_bytes) < u:
            want = max((u * cap.cpu_milli - used[0]) / k, 250) * rnd.uniform(0.6, 1.8)
            fits = []
            for c in POD_CPU:
                for rr in POD_RATIO:
                    m = int(c * ratio * rr) // (256 * MI) * (256 * MI)
                    if m and used[0] + c <= budget[0] and used[1] + m <= budget[1]:
                        fits.append((abs(c - want), rnd.random(), c, m))
            if not fits:
                break
            _, _, c, m = min(fits)
            add(c, m, 0)
            k = max(k - 1, 1)
    # Constraints, each true of the hidden node.
    pods: list[Workload] = []
    hidden: dict[str, str] = {}
    apps: dict[tuple[object, ...], int] = {}
    for p, (i, req, spread) in enumerate(raw):
        nd = nodes[i]
        ri = reg_of[i]
        residency: frozenset[str] = frozenset()
        x = rnd.random()
        if spread or x < 0.35:
            residency = frozenset({regions[ri]})
        elif x < 0.6:
            residency = frozenset({regions[ri], regions[rnd.randrange(len(regions))]})
        sla: float | None = None
        target: str | None = None
        if not spread and rnd.random() < 0.4:
            rt = rnd.randrange(len(regions))
            col = lat[:, rt]
            frac = rnd.uniform(0.15, 0.5)
            s = max(float(np.quantile(col, frac)), float(col[i]))
            s = float(np.ceil(s / 5.0) * 5.0)  # 5 ms steps: SLAs repeat, classes form
            if (col <= s).mean() <= 0.5 + 1e-9:
                sla, target = s, regions[rt]
        data_gb = rnd.choice((0.0, 0.0, 20.0, 200.0)) if not spread else 0.0
        # data location unknown for some (no gravity), else the hidden node's region
        loc = regions[ri] if data_gb and rnd.random() < 0.8 else None
        # pods alike in every constraint are one deployment (one label, one class)
        app = (spread_of[i][0] if spread else
               "a{}".format(apps.setdefault((req, residency, sla, target, data_gb, loc,
                                             bool(nd.capacity.gpus)), len(apps))))
        anti = ((PodAffinityTerm(LabelSelector({"app": app}), HOSTNAME),) if spread else ())
        uid = f"p{p:05d}"
        pods.append(Workload(
            uid=uid, name=uid, requests=req,
            tolerations=GPU_TOL if nd.capacity.gpus else (),
            pod_anti_affinity=anti, max_latency_ms=sla, latency_to=target,
            residency=residency, data_name=f"d{ri}" if data_gb else None, data_gb=data_gb,
            data_location=loc, labels={"app": app}))
        hidden[uid] = nd.name
    rnd.shuffle(pods)
    return TightInstance(ClusterSnapshot(tuple(nodes), links, now=1e9), pods, hidden)


def make_overfull(n_nodes: int, n_pods: int, seed: int = 1, drop: float = 0.12
                  ) -> TightInstance:
    """A tight instance with about ``drop`` of its nodes taken away (links to them too):
    the pods of those nodes are extra demand, so some pods cannot be placed and the count
    is decided by packing. ``hidden`` is empty (no placement of every pod exists)."""
    inst = make_tight(n_nodes, n_pods, seed)
    rnd = random.Random(seed)
    nodes = tuple(nd for nd in inst.snapshot.nodes if rnd.random() >= drop)
    names = {nd.name for nd in nodes}
    links = {k: v for k, v in inst.snapshot.links.items() if k[0] in names and k[1] in names}
    return TightInstance(ClusterSnapshot(nodes, links, now=inst.snapshot.now), inst.pods, {})


GATEWAYS = 8


def make_sla(n_nodes: int, n_pods: int, seed: int = 1, load: float = 0.65) -> TightInstance:
    """The second family: latency SLAs to user gateways (named peers) and to regions, pod
    anti-affinity (hostname and zone, within a deployment), GPUs at moderate load.

    4 regions of 3 zones on a line, 20 % GPU nodes (1/2/4 GPUs, tainted), prices by region
    +-10 %. Pods come as deployments of 1-8 replicas; their requests are drawn until the
    batch asks for ``load`` of the cpu (GPU deployments until about ``load`` of the GPUs).
    Constraints: 45 % an SLA to a gateway, 15 % to a region (20-60 % of the nodes in range),
    30 % hostname anti-affinity, 10 % zone anti-affinity, 25 % residency to one or two
    regions. The maximum count is not known by construction here: the reference (CP-SAT
    from the engine's answer, count first) says whether a placement of more pods exists.
    ``hidden`` is empty."""
    rnd = random.Random(seed * 7919 + 17)
    regions = [f"g{i}" for i in range(4)]
    nodes: list[NodeInfo] = []
    pos: list[float] = []
    for i in range(n_nodes):
        ri = i % len(regions)
        gpus = rnd.choice((1, 2, 4)) if rnd.random() < 0.2 else 0
        cpu, mem = ((max(16000, 8000 * gpus), max(64, 32 * gpus)) if gpus
                    else rnd.choice(CPU_NODES[:4]))
        price = (0.5 * cpu / 16000 + 2.5 * gpus) * (1.0 + 0.15 * ((ri * 3) % 4))
        nodes.append(NodeInfo(
            name=f"s{i:05d}", region=regions[ri], zone=f"{regions[ri]}-z{(i // 4) % 3}",
            taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),) if gpus else (),
            capacity=Resources(cpu, mem * GIB, gpus),
            price_per_hour=round(price * rnd.uniform(0.9, 1.1), 4),
            energy_price_per_kwh=0.1 + 0.02 * ri, carbon_g_per_kwh=100 + 60 * ri,
            idle_watts=300 if gpus else 100, max_watts=1500 if gpus else 350))
        pos.append(ri * 10.0 + rnd.uniform(0, 8))
    links: dict[tuple[str, str], LinkInfo] = {}
    gw_pos = [rnd.uniform(0, 10.0 * len(regions)) for _ in range(GATEWAYS)]
    lat_gw = np.zeros((n_nodes, GATEWAYS))
    for i in range(n_nodes):
        for g in range(GATEWAYS):
            p95 = round(abs(pos[i] - gw_pos[g]) * 1.2 + rnd.uniform(2, 8), 1)
            lat_gw[i, g] = p95
            links[(nodes[i].name, f"gw{g}")] = LinkInfo(p95 / 1.4, p95, 0.0, 1e8, 1.0)
    first = {r: r for r in range(len(regions))}  # node r is in region r
    lat_rg = np.zeros((n_nodes, len(regions)))
    for i in range(n_nodes):
        for r in range(len(regions)):
            if r == i % len(regions):
                continue
            p95 = round(abs(pos[i] - r * 10.0) * 1.5 + rnd.uniform(1, 6), 1)
            lat_rg[i, r] = p95
            links[(nodes[i].name, nodes[first[r]].name)] = LinkInfo(p95 / 1.4, p95, 0.0,
                                                                    1e8, 1.0)
    cpu_total = sum(nd.capacity.cpu_milli for nd in nodes)
    gpu_total = sum(nd.capacity.gpus for nd in nodes)
    pods: list[Workload] = []
    cpu_asked = gpu_asked = 0
    d = 0
    while len(pods) < n_pods:
        d += 1
        reps = min(rnd.randint(1, 8), n_pods - len(pods))
        gpu = 0
        if gpu_total and gpu_asked + reps <= load * gpu_total and rnd.random() < 0.25:
            gpu = rnd.choice((1, 1, 2))
        c = rnd.choice(POD_CPU[:8]) if not gpu else 2000 * gpu
        if not gpu and cpu_asked + reps * c > load * cpu_total:
            c = 250
        m = int(c * rnd.choice((2, 4, 4, 8)) * MI * 1024 / 1000) // (256 * MI) * (256 * MI)
        sla: float | None = None
        target: str | None = None
        x = rnd.random()
        if x < 0.6:
            if x < 0.45:
                g = rnd.randrange(GATEWAYS)
                col, target = lat_gw[:, g], f"gw{g}"
            else:
                r = rnd.randrange(len(regions))
                col, target = lat_rg[:, r], regions[r]
            sla = float(np.ceil(np.quantile(col, rnd.uniform(0.2, 0.6)) / 5.0) * 5.0)
        residency: frozenset[str] = frozenset()
        if rnd.random() < 0.25:
            residency = frozenset(rnd.sample(regions, rnd.choice((1, 2))))
        app = f"d{d}"
        y = rnd.random()
        key = HOSTNAME if y < 0.3 else "topology.kubernetes.io/zone" if y < 0.4 else None
        anti = (PodAffinityTerm(LabelSelector({"app": app}), key),) if key else ()
        data_gb = rnd.choice((0.0, 0.0, 20.0, 200.0))
        for k in range(reps):
            uid = f"{app}-{k}"
            pods.append(Workload(
                uid=uid, name=uid, requests=Resources(c, m, gpu),
                tolerations=GPU_TOL if gpu or rnd.random() < 0.0 else (),
                pod_anti_affinity=anti, max_latency_ms=sla, latency_to=target,
                residency=residency, data_name=f"x{d}" if data_gb else None,
                data_gb=data_gb, data_location=regions[d % len(regions)] if data_gb else None,
                labels={"app": app}))
        cpu_asked += reps * c
        gpu_asked += reps * gpu
    return TightInstance(ClusterSnapshot(tuple(nodes), links, now=1e9), pods, {})


def placed_bound(snap: ClusterSnapshot, pods: Sequence[Workload], assign: dict[str, str],
                 cfg: EngineConfig, time_limit_s: float = 120.0) -> tuple[float, float]:
    """(LP least $/hour of placing exactly the placed pods, LP most pods placeable)."""
    from tools.bench_placement import lower_bound

    placed = [w for w in pods if w.uid in assign]
    lb, _ = lower_bound(snap, placed, cfg, len(placed), time_limit_s)
    most, _ = lower_bound(snap, pods, cfg, None, time_limit_s)
    return lb, most


# ``--before-tree DIR``: the Kubernetes path of another checkout (say ``git archive`` of
# the commit before a change) and of this one, each in a long-lived process of its own that
# builds the same instance with its tree's generator, warms up, and places it on each "go"
# line read; the two are alternated rep by rep (which goes first alternates too), so both
# are measured the same way under the same load (a run in this process was measured up to
# 0.77x the other process's at load 1, against 1.0x for two like processes)
_WORKER = """
import hashlib, json, os, sys, time
os.environ.setdefault("OMP_NUM_THREADS", "1")
from cloud_core.placement import EngineConfig, place
from tools.bench_tight import make_tight
n, p, seed, lo, hi = sys.argv[1:6]
inst = make_tight(int(n), int(p), int(seed), (float(lo), float(hi)))
cfg = EngineConfig(cpsat_polish=False)
place(inst.snapshot, inst.pods[:50], cfg)
print("ready", flush=True)
for _ in sys.stdin:
    t0, c0 = time.perf_counter(), time.process_time()
    res = place(inst.snapshot, inst.pods, cfg)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    sig = hashlib.sha256(repr(sorted(res.assignments.items())).encode()).hexdigest()
    print(json.dumps({"cpu": cpu, "wall": wall, "placed": len(res.assignments),
                      "cost": res.total_cost, "sig": sig}), flush=True)
"""
WORKERS = {"before": "cfnet, Kubernetes default, --before-tree (own process)",
           "after": "cfnet, Kubernetes default, this tree (own process)"}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _signature(assignments: dict[str, str]) -> str:
    return hashlib.sha256(repr(sorted(assignments.items())).encode()).hexdigest()


def run_size(n_nodes: int, n_pods: int, util: float, seed: int, reps: int,
             configs: dict[str, EngineConfig], lp: bool = True, before_tree: str = ""
             ) -> tuple[list[str], TightInstance, dict[str, Any]]:
    inst = make_tight(n_nodes, n_pods, seed, (util - 0.03, util + 0.03))
    snap, pods = inst.snapshot, inst.pods
    known = len(pods)
    assert not validate(snap, pods, inst.hidden, EngineConfig()), "hidden packing invalid"
    from tools.bench_placement import cost_of

    hidden_cost = cost_of(snap, pods, inst.hidden, EngineConfig())
    lines = []
    results: dict[str, Any] = {}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in WORKERS}
    procs: dict[str, subprocess.Popen[str]] = {}
    for key, tree in (("before", before_tree), ("after", REPO)) if before_tree else ():
        procs[key] = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(n_nodes), str(n_pods), str(seed),
             str(util - 0.03), str(util + 0.03)], cwd=tree, text=True,
            env=dict(os.environ, PYTHONPATH=tree), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE)
        out = procs[key].stdout
        assert out is not None
        if out.readline().strip() != "ready":
            raise SystemExit(f"--before-tree: the process of {tree} did not start")

    def run_workers(i: int) -> None:
        for key in ("before", "after") if i % 2 == 0 else ("after", "before"):
            pr = procs[key]
            assert pr.stdin is not None and pr.stdout is not None
            pr.stdin.write("go\n")
            pr.stdin.flush()
            runs[key].append(json.loads(pr.stdout.readline()))

    for name, cfg in configs.items():
        walls, cpus, placed, costs, sigs = [], [], [], [], set()
        res = None
        for i in range(reps):
            if procs and name == K8S and i % 2 == 0:
                run_workers(i)
            t0, c0 = time.perf_counter(), time.process_time()
            res = place(snap, pods, cfg)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            placed.append(len(res.assignments))
            costs.append(res.total_cost)
            sigs.add(_signature(dict(res.assignments)))
            if procs and name == K8S and i % 2 == 1:
                run_workers(i)
        assert res is not None
        results[name] = res
        viol = len(validate(snap, pods, res.assignments, cfg))
        # the LP bounds take minutes at 3,000 pods: --no-lp leaves them out ("-")
        most_s, gap_s = "-", "-"
        if lp:
            lb, most = placed_bound(snap, pods, dict(res.assignments), cfg)
            most_s = f"{most:.0f}"
            if lb > 0:
                gap_s = f"{(float(np.median(costs)) - lb) / lb * 100:+.2f} %"
        hid = (float(np.median(costs)) - hidden_cost) / hidden_cost * 100
        lines.append(
            f"| {n_pods}x{n_nodes} @{util:.0%}, {name} | {known} | {most_s} | "
            f"{int(np.median(placed))} ({min(placed)}-{max(placed)}) | "
            f"{np.median(placed) / known:.2%} | {gap_s} | {hid:+.2f} % | "
            f"{np.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f}) | "
            f"{np.median(cpus):.2f} | {len(sigs)} | {viol} |")
        print(lines[-1], f"  [{res.solver}; {dict(res.stats)}]", flush=True)
        if procs and name == K8S:
            for key, label in WORKERS.items():
                rc = [r["cpu"] for r in runs[key]]
                rw = [r["wall"] for r in runs[key]]
                rs = {r["sig"] for r in runs[key]}
                hid_r = (float(np.median([r["cost"] for r in runs[key]])) - hidden_cost
                         ) / hidden_cost
                lines.append(
                    f"| {n_pods}x{n_nodes} @{util:.0%}, {label} | {known} | - | "
                    f"{int(np.median([r['placed'] for r in runs[key]]))} | - | - | "
                    f"{hid_r * 100:+.2f} % | {np.median(rw):.2f} ({min(rw):.2f}-{max(rw):.2f}) | "
                    f"{np.median(rc):.2f} ({min(rc):.2f}-{max(rc):.2f}) | {len(rs)} "
                    f"({'the same' if rs == sigs else 'NOT the same'} as this tree's) | - |")
                print(lines[-1], f"  [CPU s {' '.join(f'{c:.2f}' for c in rc)}]", flush=True)
            ratio = [x["cpu"] / y["cpu"] for x, y in zip(runs["after"], runs["before"],
                                                          strict=True)]
            print(f"  [after/before CPU per pair, own processes: median {np.median(ratio):.3f} "
                  f"({min(ratio):.3f}-{max(ratio):.3f}) over {len(ratio)} pairs]", flush=True)
    for pr in procs.values():
        assert pr.stdin is not None
        pr.stdin.close()
        pr.wait(timeout=60)
    return lines, inst, results


def engine_classes(snap: ClusterSnapshot, pods: Sequence[Workload], cfg: EngineConfig,
                   assign: dict[str, str]) -> tuple[list[Any], np.ndarray,
                                                    dict[str, np.ndarray], list[list[int]]]:
    """The batch as the engine's solver sees it (one round: these instances have no pod
    affinity): classes with every filter but resources, all anti-affinity between classes,
    the nodes' free resources and domains; and ``assign`` as node indices per class."""
    from cloud_core.placement.classes import ClassSpec
    from cloud_core.placement.engine import PreparedCluster
    from cloud_core.placement.prepared import all_ok, class_key, request_vector
    from cloud_core.placement.rounds import set_conflicts

    pc = PreparedCluster(snap, cfg)
    groups: dict[object, list[Workload]] = {}
    for w in pods:
        groups.setdefault(class_key(w), []).append(w)
    specs: list[ClassSpec] = []
    hint: list[list[int]] = []
    for g in groups.values():
        mask = all_ok(pc.filter_results(g[0], resources=False))
        specs.append(ClassSpec(len(g), request_vector(g[0]), mask, pc.cost(g[0], mask),
                               gang=g[0].gang))
        hint.append([int(pc.ix.pos[assign[w.uid]]) for w in g if w.uid in assign])
    set_conflicts([g[0] for g in groups.values()], specs)
    domains = {k: pc.ix.domain_ids(k)[0] for sp in specs for k in sp.conflicts}
    return specs, pc.free, domains, hint


def proof_rows(n_nodes: int, n_pods: int, util: float, seeds: Sequence[int],
               cpu_s: float) -> list[float]:
    """Small tight instances where CP-SAT can prove the optimum: how far the *proven*
    optimum itself sits above the LP bound (the bound's looseness, which no placement can
    beat) and how far each path sits above the optimum, per instance. Returns the
    Kubernetes path's gap to CP-SAT's answer per instance (each row prints as it is found,
    so a run cut short still reports what it had)."""
    from tools.placement_ref import cpsat_cost_reference, lp_lower_bound

    cfg = EngineConfig()
    gaps: list[float] = []
    for seed in seeds:
        inst = make_tight(n_nodes, n_pods, seed, (util - 0.03, util + 0.03))
        res = place(inst.snapshot, inst.pods, EngineConfig(cpsat_polish=False))
        loc = place(inst.snapshot, inst.pods, cfg)
        specs, free, domains, hint = engine_classes(inst.snapshot, inst.pods, cfg,
                                                    dict(res.assignments))
        _, _, _, hint_l = engine_classes(inst.snapshot, inst.pods, cfg, dict(loc.assignments))
        placed = len(res.assignments)
        lp, _ = lp_lower_bound(specs, free, placed)
        ref = cpsat_cost_reference(specs, free, domains, hint, cfg, 0.0,
                                   cpu_checkpoints=(cpu_s,))
        k8s, local = _int_cost(specs, cfg, hint), _int_cost(specs, cfg, hint_l)
        # CP-SAT stopped early may hold no useful bound (0 when below the penalty)
        bd, bd_lp = ((f"{ref.bound:.2f}", f"{(ref.bound - lp) / lp * 100:+.2f} %")
                     if ref.bound > 0 else ("-", "-"))
        gap = round((k8s - ref.cost) / ref.cost * 100, 2) + 0.0
        gaps.append(gap)
        print(
            f"| {n_pods}x{n_nodes} seed {seed} | {placed}/{len(inst.pods)} | "
            f"{k8s:.2f} | {lp:.2f} | "
            f"{ref.cost:.2f} ({'proven' if ref.optimal else 'best found'}) | {bd} | "
            f"{(k8s - lp) / lp * 100:+.2f} % | {bd_lp} | "
            f"{gap:+.2f} % | "
            f"{round((local - ref.cost) / ref.cost * 100, 2) + 0.0:+.2f} % |", flush=True)
    return gaps


K8S = "cfnet, Kubernetes default (cpsat_polish=False)"
LOCAL = "cfnet, local (cpsat_polish=True)"


def engine_configs(baseline: bool) -> dict[str, EngineConfig]:
    """The paths measured: the Kubernetes schedulers' default, the local mode's, and the
    flow route alone (the engine before count-first packing) as the baseline."""
    out = {K8S: EngineConfig(cpsat_polish=False), LOCAL: EngineConfig()}
    if baseline:
        out["flow route only (pack=False)"] = EngineConfig(pack=False)
    return out


def _int_cost(specs: Sequence[Any], cfg: EngineConfig, got: list[list[int]]) -> float:
    """$/hour of ``got`` in the solver's integer units (as CP-SAT counts it)."""
    from cloud_core.placement.classes import integer_costs, objective

    icost, _ = integer_costs(specs, cfg.cost_scale)
    return objective(specs, icost, 0, got) / cfg.cost_scale


def reference_row(name: str, snap: ClusterSnapshot, pods: Sequence[Workload],
                  results: dict[str, Any], seconds: Sequence[float]) -> str:
    """CP-SAT (the engine's exact class model, one worker) from the Kubernetes path's answer
    as the hint, for ``seconds`` of CPU: its best cost at each checkpoint, with the count
    it reached, its proven bound, and each path's gap to the best at each checkpoint."""
    from tools.placement_ref import cpsat_cost_reference, lp_lower_bound

    cfg = EngineConfig()
    k8s = results[K8S]
    specs, free, domains, hint = engine_classes(snap, pods, cfg, dict(k8s.assignments))
    placed = len(k8s.assignments)
    lp, _ = lp_lower_bound(specs, free, placed)
    t0 = time.process_time()
    ref = cpsat_cost_reference(specs, free, domains, hint, cfg, 0.0, cpu_checkpoints=seconds)
    cpu = time.process_time() - t0
    cells = [name, f"{ref.placed}/{len(pods)} ({placed})"]
    for t in seconds:
        cells.append(f"{ref.at_cpu[t]:.2f}")
    cells.append(f"{ref.bound:.2f}" if ref.bound > 0 else "-")
    cells.append(f"{lp:.2f}")
    for path in (K8S, LOCAL):
        res = results[path]
        _, _, _, got = engine_classes(snap, pods, cfg, dict(res.assignments))
        c = _int_cost(specs, cfg, got)
        same = len(res.assignments) == ref.placed
        for t in seconds:
            g = (c - ref.at_cpu[t]) / ref.at_cpu[t] * 100
            cells.append(f"{g:+.2f} %" + ("" if same else " (count differs)"))
    cells.append(f"{cpu:.0f}")
    return "| " + " | ".join(cells) + " |"


def family_rows(n_nodes: int, n_pods: int, seeds: Sequence[int], seconds: float
                ) -> list[float]:
    """The second family (``make_sla``): per seed, both paths' count and cost against
    CP-SAT's best for ``seconds`` of CPU from the Kubernetes path's answer. Returns the
    Kubernetes path's gaps."""
    from tools.placement_ref import cpsat_cost_reference

    cfg = EngineConfig()
    gaps = []
    for seed in seeds:
        inst = make_sla(n_nodes, n_pods, seed)
        res = {}
        cpu = {}
        for path, c in engine_configs(False).items():
            t0 = time.process_time()
            res[path] = place(inst.snapshot, inst.pods, c)
            cpu[path] = time.process_time() - t0
            assert not validate(inst.snapshot, inst.pods, res[path].assignments, c)
        specs, free, domains, hint = engine_classes(inst.snapshot, inst.pods, cfg,
                                                    dict(res[K8S].assignments))
        ref = cpsat_cost_reference(specs, free, domains, hint, cfg, 0.0,
                                   cpu_checkpoints=(seconds,))
        best = ref.at_cpu[seconds]
        cells = [f"{n_pods}x{n_nodes} seed {seed}", f"{ref.placed}"]
        for path in (K8S, LOCAL):
            r = res[path]
            _, _, _, got = engine_classes(inst.snapshot, inst.pods, cfg, dict(r.assignments))
            cost = _int_cost(specs, cfg, got)
            g = (cost - best) / best * 100
            if path == K8S:
                gaps.append(g)
            cells += [f"{len(r.assignments)}", f"{cost:.3f}",
                      f"{g:+.2f} %" + ("" if len(r.assignments) == ref.placed
                                       else " (count differs)"), f"{cpu[path]:.2f}"]
        cells += [f"{best:.3f}", f"{ref.bound:.3f}" if ref.bound > 0 else "-"]
        print("| " + " | ".join(cells) + " |", flush=True)
    return gaps


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="3000x500,300x60")
    ap.add_argument("--util", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--before-tree", default="",
                    help="another checkout (e.g. `git archive` of an older commit): its "
                         "Kubernetes path and this tree's, each in a process of its own, "
                         "placed alternately rep by rep; CPU per pair and whether the "
                         "answers are this tree's")
    ap.add_argument("--no-lp", action="store_true",
                    help="skip the LP bounds of the size table (minutes at 3,000 pods); "
                         "the reference and proof tables keep theirs")
    ap.add_argument("--reference-seconds", default="",
                    help="CPU seconds of CP-SAT (one worker, hinted with the Kubernetes "
                         "path's answer) as checkpoints of one run per size, e.g. '60,300' "
                         "(the issue's reference; minutes per size: off by default)")
    ap.add_argument("--proof", default="50x10",
                    help="small size where CP-SAT proves the optimum ('' to skip)")
    ap.add_argument("--proof-seeds", default="1,2,3,4,5,6")
    ap.add_argument("--proof-limit", type=float, default=30.0,
                    help="CP-SAT CPU seconds per proof instance (a reference, not a path)")
    ap.add_argument("--family", default="200x40",
                    help="second family (SLA to gateways/regions, anti-affinity, GPUs at "
                         "moderate load), pods x nodes ('' to skip)")
    ap.add_argument("--family-seeds", default="1-10")
    ap.add_argument("--family-seconds", type=float, default=20.0,
                    help="CPU seconds of the CP-SAT reference per family instance")
    a = ap.parse_args(argv)
    configs = engine_configs(not a.no_baseline)
    seconds = [float(x) for x in a.reference_seconds.split(",") if x]
    header = ("| instance, engine | pods (all fit) | LP max | placed median (range) | "
              "placed / feasible | cost vs LP among placed | cost vs hidden packing | "
              "wall s median (range) | CPU s | distinct placements | violations |")
    if a.sizes:
        print(header)
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    refs: list[str] = []
    for size in [x for x in a.sizes.split(",") if x]:
        p, n = (int(x) for x in size.split("x"))
        _, inst, results = run_size(n, p, a.util, a.seed, a.reps, configs, not a.no_lp,
                                    a.before_tree)
        if seconds:  # printed as found (a run cut short keeps it), tabled again below
            refs.append(reference_row(f"{p}x{n} seed {a.seed}", inst.snapshot, inst.pods,
                                      results, seconds))
            print(f"  [reference] {refs[-1]}", flush=True)
    if refs:
        print()
        cols = " | ".join(f"CP-SAT best in {t:.0f} s" for t in seconds)
        gcols = " | ".join(f"{w} vs {t:.0f} s" for w in ("k8s", "local") for t in seconds)
        print(f"| reference instance | CP-SAT placed (engine) | {cols} | CP-SAT bound | "
              f"LP bound | {gcols} | reference CPU s |")
        print("|---|---:|" + "---:|" * (2 * len(seconds) + 3 + len(seconds)))
        print("\n".join(refs), flush=True)
    if a.proof:
        p, n = (int(x) for x in a.proof.split("x"))
        print()
        print("| proof instance | placed | cfnet k8s $/h | LP bound | CP-SAT optimum | CP-SAT "
              "bound | k8s vs LP | proven bound vs LP (the LP's looseness) | "
              "k8s vs optimum | local vs optimum |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        pg = proof_rows(n, p, a.util, [int(x) for x in a.proof_seeds.split(",")],
                        a.proof_limit)
        worse = ", ".join(f"seed {s}: {g:+.2f} %" for s, g in
                          zip(a.proof_seeds.split(","), pg, strict=True) if g > 0)
        print(f"* proof instances, Kubernetes path vs CP-SAT: equal on "
              f"{sum(g <= 0 for g in pg)} of {len(pg)}"
              + (f"; above on {worse}" if worse else ""), flush=True)
    if a.family:
        p, n = (int(x) for x in a.family.split("x"))
        lo, _, hi = a.family_seeds.partition("-")
        seeds = list(range(int(lo), int(hi or lo) + 1))
        print()
        print("| family instance | CP-SAT placed | k8s placed | k8s $/h | k8s vs CP-SAT | "
              "k8s CPU s | local placed | local $/h | local vs CP-SAT | local CPU s | "
              f"CP-SAT best in {a.family_seconds:.0f} s | CP-SAT bound |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        gaps = family_rows(n, p, seeds, a.family_seconds)
        print(f"* second family, Kubernetes path vs CP-SAT: median {np.median(gaps):+.2f} %, "
              f"max {max(gaps):+.2f} % over {len(gaps)} seeds")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
