"""Placement benchmark: cfnet's engine vs a kube-scheduler-style baseline vs a lower bound.

Same instances, one run:
* **cfnet**: ``place()`` on the whole batch (classes, vectorised filters/scores, min-cost
  flow + exact packing, CP-SAT when coupled and small).
* **kube-style**: one pod at a time, filter then score (least-allocated), bind, next.
* **bound**: LP relaxation (GLOP) of the class-level problem; on the small instance also the
  pod-level CP-SAT proven optimum.

Also one-pod-at-a-time decision latency (p50/p99): on the path the scheduler and the
Kubernetes actuator call today (``place(snapshot, [pod])``, which prepares the cluster
each time) and, beside it, on ``PreparedCluster.place([pod])`` (prepared once; no
production path calls it yet). Everything runs on one core: the thread limits are set
before numpy and OR-Tools load (the solvers also get one worker); wall times are
measured here, in the same run, and printed as a table.

    python -m tools.bench_placement [--nodes 5000 --pods 10000 --seed 1 --quick]
"""

from __future__ import annotations

import os

# One core, as the target says. Set before numpy (and, through cloud_core, OR-Tools)
# load: their thread pools read these once, at import.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from cloud_core.placement import (  # noqa: E402
    ClusterSnapshot,
    EngineConfig,
    Health,
    LabelSelector,
    LinkInfo,
    NodeInfo,
    PodAffinityTerm,
    PreparedCluster,
    Resources,
    Taint,
    Toleration,
    Workload,
    place,
    validate,
)
from cloud_core.placement.model import HOSTNAME, ZONE  # noqa: E402

GIB = 1 << 30


def make_instance(n_nodes: int, n_pods: int, seed: int = 1, n_regions: int = 20,
                  zones_per_region: int = 5) -> tuple[ClusterSnapshot, list[Workload]]:
    """A synthetic edge-cloud: regions on a ring (latency grows with ring distance), four
    security levels, 10 % GPU nodes (tainted), a few unhealthy nodes, stale links, and
    deployments with residency, latency SLAs, anti-affinity, data gravity and GPUs."""
    rnd = random.Random(seed)
    regions = [f"r{i:02d}" for i in range(n_regions)]
    nodes: list[NodeInfo] = []
    for i in range(n_nodes):
        ri = i % n_regions
        zone = f"{regions[ri]}-z{(i // n_regions) % zones_per_region}"
        gpu = rnd.random() < 0.1
        big = gpu or rnd.random() < 0.3
        cap = Resources(32000 if big else 16000, (128 if big else 64) * GIB, 4 if gpu else 0)
        used = rnd.uniform(0.0, 0.5)
        alloc = Resources(int(cap.cpu_milli * used) // 100 * 100,
                          int(cap.mem_bytes * used * rnd.uniform(0.6, 1.2)) // GIB * GIB,
                          rnd.randint(0, 2) if gpu else 0)
        health = Health.ONLINE
        x = rnd.random()
        if x < 0.005:
            health = Health.DOWN
        elif x < 0.01:
            health = Health.SUSPECT
        elif x < 0.015:
            health = Health.CORDONED
        price_scale = 1.0 + 0.5 * ((ri * 7) % 5) / 4
        nodes.append(NodeInfo(
            name=f"n{i:05d}", region=regions[ri], zone=zone,
            security_level=rnd.choices([0, 1, 2, 3], [4, 3, 2, 1])[0],
            labels={"cfnet.io/tier": "edge" if rnd.random() < 0.6 else "cloud"},
            taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),) if gpu else (),
            capacity=cap, allocated=alloc, health=health,
            price_per_hour=round((3.0 if gpu else 0.8 if big else 0.4) * price_scale
                                 * rnd.uniform(0.95, 1.05), 4),
            energy_price_per_kwh=0.1 + 0.02 * (ri % 6),
            carbon_g_per_kwh=50 + 35 * ((ri * 11) % 20),
            idle_watts=300 if gpu else 100, max_watts=1500 if gpu else 350))
    # Each node measures a gateway in its own and the two neighbouring regions each side.
    gateways = {r: [nd.name for nd in nodes if nd.region == r][:3] for r in regions}
    links: dict[tuple[str, str], LinkInfo] = {}
    for i, nd in enumerate(nodes):
        ri = i % n_regions
        for d in (-2, -1, 1, 2):
            r2 = regions[(ri + d) % n_regions]
            gw = gateways[r2][i % len(gateways[r2])]
            p50 = 8.0 * abs(d) + rnd.uniform(1, 10)
            age = rnd.choice([1.0] * 18 + [120.0, 5000.0])  # 5 % stale, 5 % expired
            links[(nd.name, gw)] = LinkInfo(p50, p50 * rnd.uniform(1.1, 1.6), 0.0, 1e8, age)
    pods: list[Workload] = []
    dep = 0
    while len(pods) < n_pods:
        dep += 1
        home = rnd.randrange(n_regions)
        gpu = rnd.random() < 0.08
        reps = min(rnd.choice([1, 2, 3, 5, 10, 20, 40, 60]), n_pods - len(pods))
        spread = rnd.random() < 0.3
        zone_spread = spread and reps <= zones_per_region and rnd.random() < 0.3
        app = f"app{dep}"
        anti: tuple[PodAffinityTerm, ...] = ()
        if spread:
            anti = (PodAffinityTerm(LabelSelector({"app": app}),
                                    ZONE if zone_spread else HOSTNAME),)
        residency: frozenset[str] = frozenset()
        if rnd.random() < 0.6:
            residency = frozenset({regions[home], regions[(home + 1) % n_regions]})
        sla = rnd.choice([None, None, 25.0, 40.0, 60.0])
        data_gb = rnd.choice([0, 0, 10, 100, 500])
        base = Workload(
            uid="", name=app, namespace="default",
            requests=Resources(2000 if gpu else rnd.choice([250, 500, 1000, 2000, 4000]),
                               rnd.choice([256 << 20, GIB, 2 * GIB, 4 * GIB, 8 * GIB]),
                               1 if gpu else 0),
            node_selector={"cfnet.io/tier": "edge"} if rnd.random() < 0.2 else {},
            tolerations=(Toleration("nvidia.com/gpu", "Exists"),) if gpu else (),
            pod_anti_affinity=anti,
            max_latency_ms=sla, latency_to=regions[home] if sla else None,
            residency=residency, min_security_level=rnd.choices([0, 1, 2, 3], [5, 3, 2, 1])[0],
            data_name=f"ds{dep}" if data_gb else None, data_gb=float(data_gb),
            data_location=regions[home] if data_gb else None,
            cost_weight=rnd.choice([0.5, 1.0, 1.0, 2.0]), labels={"app": app})
        for k in range(reps):
            pods.append(dataclasses.replace(base, uid=f"{app}-{k}", name=f"{app}-{k}"))
    return ClusterSnapshot(tuple(nodes), links, now=1e9), pods


# -- the kube-scheduler-style baseline ------------------------------------------------------
def kube_baseline(snap: ClusterSnapshot, pods: Sequence[Workload], cfg: EngineConfig
                  ) -> dict[str, str]:
    """One pod at a time: filter (all hard constraints), score least-allocated, bind.

    It reuses the engine's vectorised filters for the static part (so the comparison is of
    the decision procedure, not of filter code) and tracks anti-affinity exactly."""
    pc = PreparedCluster(snap, cfg)
    free = pc.free.copy()
    cap = np.maximum(pc.ix.cap, 1).astype(np.float64)
    out: dict[str, str] = {}
    static: dict[object, np.ndarray] = {}
    placed_by_app: dict[tuple[str, str], set[int]] = {}
    for w in pods:
        key = (w.requests, w.node_selector, w.tolerations, w.residency, w.min_security_level,
               w.max_latency_ms, w.latency_to)
        m = static.get(key)
        if m is None:
            frs = pc.filter_results(w)
            m = np.logical_and.reduce([fr.ok for fr in frs[:-1]])
            static[key] = m
        req = np.array([w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus])
        ok = m & (free >= req).all(axis=1)
        for t in w.pod_anti_affinity:
            dom = pc.ix.domain_ids(t.topology_key)[0]
            taken = placed_by_app.get((w.labels["app"], t.topology_key))
            if taken:
                ok &= ~np.isin(dom, list(taken))
        if not ok.any():
            continue
        after = (free[:, :2] - req[:2]) / cap[:, :2]
        score = np.where(ok, after.mean(axis=1), -np.inf)
        n = int(np.argmax(score))
        free[n] -= req
        out[w.uid] = pc.ix.nodes[n].name
        for t in w.pod_anti_affinity:
            dom = pc.ix.domain_ids(t.topology_key)[0]
            placed_by_app.setdefault((w.labels["app"], t.topology_key), set()).add(int(dom[n]))
    return out


def cost_of(snap: ClusterSnapshot, pods: Sequence[Workload], assign: dict[str, str],
            cfg: EngineConfig) -> float:
    """Total $/hour of an assignment under the engine's cost model (pre-batch state)."""
    pc = PreparedCluster(snap, cfg)
    by = {w.uid: w for w in pods}
    tot = 0.0
    for uid, node in assign.items():
        tot += float(pc.cost(by[uid])[pc.ix.pos[node]])
    return tot


def lower_bound(snap: ClusterSnapshot, pods: Sequence[Workload], cfg: EngineConfig,
                min_placed: int | None, time_limit_s: float) -> tuple[float, bool]:
    from cloud_core.placement.classes import ClassSpec
    from cloud_core.placement.prepared import class_key
    from tools.placement_ref import lp_lower_bound

    pc = PreparedCluster(snap, cfg)
    groups: dict[object, list[Workload]] = {}
    for w in pods:
        groups.setdefault(class_key(w), []).append(w)
    specs: list[ClassSpec] = []
    for g in groups.values():
        w = g[0]
        frs = pc.filter_results(w)
        mask = np.logical_and.reduce([fr.ok for fr in frs[:-1]])
        conflicts = {}
        for t in w.pod_anti_affinity:
            if t.topology_key == HOSTNAME:
                conflicts[HOSTNAME] = [len(specs)]
        specs.append(ClassSpec(len(g), np.array([w.requests.cpu_milli, w.requests.mem_bytes,
                                                 w.requests.gpus]), mask, pc.cost(w),
                               conflicts))
    return lp_lower_bound(specs, pc.free, min_placed, time_limit_s)


@dataclass
class Row:
    name: str
    placed: int
    seconds: float
    cpu: float
    cost: float
    violations: int


def run(n_nodes: int, n_pods: int, seed: int, lp_limit: float, single: int) -> None:
    cfg = EngineConfig()
    t0 = time.perf_counter()
    snap, pods = make_instance(n_nodes, n_pods, seed)
    print(f"instance: {n_pods} pods, {n_nodes} nodes, {len(snap.links)} links "
          f"(generated in {time.perf_counter() - t0:.1f} s)", flush=True)
    rows: list[Row] = []
    t0, c0 = time.perf_counter(), time.process_time()
    res = place(snap, pods, cfg)
    t_engine, c_engine = time.perf_counter() - t0, time.process_time() - c0
    v = validate(snap, pods, res.assignments, cfg)
    rows.append(Row("cfnet engine (batch)", len(res.assignments), t_engine, c_engine,
                    cost_of(snap, pods, dict(res.assignments), cfg), len(v)))
    print(f"cfnet: {t_engine:.3f} s, solver {res.solver}, stats {dict(res.stats)}", flush=True)
    t0, c0 = time.perf_counter(), time.process_time()
    kb = kube_baseline(snap, pods, cfg)
    t_kube, c_kube = time.perf_counter() - t0, time.process_time() - c0
    rows.append(Row("kube-style (1 pod at a time)", len(kb), t_kube, c_kube,
                    cost_of(snap, pods, kb, cfg), len(validate(snap, pods, kb, cfg))))
    t0, c0 = time.perf_counter(), time.process_time()
    lb, finished = lower_bound(snap, pods, cfg, len(res.assignments), lp_limit)
    t_lb, c_lb = time.perf_counter() - t0, time.process_time() - c0
    # The bound is the cheapest LP solution that places at least as many pods as
    # cfnet did: its "placed" is that constraint, not a count of its own.
    rows.append(Row("LP lower bound on cost" + ("" if finished else " (did not finish)"),
                    -len(res.assignments), t_lb, c_lb, lb, 0))
    most, _ = lower_bound(snap, pods, cfg, None, lp_limit)
    # one pod at a time: decision latency, on the production path and prepared
    lat_prod: list[float] = []
    for w in pods[:max(1, single // 10)]:
        t0 = time.perf_counter()
        place(snap, [w], cfg)
        lat_prod.append(time.perf_counter() - t0)
    pc = PreparedCluster(snap, cfg)
    lat = []
    cpu = []
    for w in pods[:single]:
        t0, c0 = time.perf_counter(), time.process_time()
        pc.place([w])
        lat.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    p50, p99 = np.percentile(lat, [50, 99]) * 1000 if lat else (0.0, 0.0)
    q50, q99 = np.percentile(lat_prod, [50, 99]) * 1000 if lat_prod else (0.0, 0.0)
    cpu99 = float(np.percentile(cpu, 99)) * 1000 if cpu else 0.0
    print()
    print(f"| {n_pods} pods on {n_nodes} nodes | placed | wall s | CPU s | pods/s (wall) | "
          "cost $/h | gap vs bound | violations |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        gap = (r.cost - lb) / lb * 100 if lb == lb and lb > 0 else float("nan")
        pps = f"{r.placed / r.seconds:,.0f}" if r.name.startswith(("cfnet", "kube")) else "-"
        viol = str(r.violations) if r.name.startswith(("cfnet", "kube")) else "-"
        placed = str(r.placed) if r.placed >= 0 else f">= {-r.placed} (required)"
        print(f"| {r.name} | {placed} | {r.seconds:.3f} | {r.cpu:.3f} | {pps} | {r.cost:.2f} | "
              f"{gap:+.2f} % | {viol} |")
    print(f"| LP relaxation: most pods placeable | {most:.1f} | - | - | - | - | - | - |")
    print()
    print(f"LP upper bound on pods placeable: {most:.1f} (cfnet placed "
          f"{len(res.assignments)}, kube-style {len(kb)})")
    print()
    print(f"| one pod at a time, {n_nodes} nodes | decisions | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    print(f"| production path: place(snapshot, [pod]) (scheduler, Kubernetes actuator) | "
          f"{len(lat_prod)} | {q50:.2f} | {q99:.2f} |")
    print(f"| prepared: PreparedCluster.place([pod]) (no production caller yet) | {len(lat)} | "
          f"{p50:.2f} | {p99:.2f} (CPU {cpu99:.2f}) |")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def run_small(seed: int) -> None:
    """Small instances: the engine against the pod-level CP-SAT proven optimum."""
    from cloud_core.placement.engine import PreparedCluster as PC
    from tools.placement_ref import solve_exact_pods

    cfg = EngineConfig()
    print("\n| small instance | cfnet cost | kube-style cost | CP-SAT optimum | cfnet = optimum |")
    print("|---|---:|---:|---:|---|")
    for s in range(seed, seed + 3):
        snap, pods = make_instance(60, 80, s, n_regions=3, zones_per_region=2)
        res = place(snap, pods, cfg)
        pc = PC(snap, cfg)
        feas = []
        scale = cfg.cost_scale
        for w in pods:
            frs = pc.filter_results(w)
            ok = np.logical_and.reduce([fr.ok for fr in frs])
            c = pc.cost(w)
            feas.append({int(n): round(c[n] * scale) for n in np.flatnonzero(ok)})
        conflicts = []
        for a, wa in enumerate(pods):
            for t in wa.pod_anti_affinity:
                for b, wb in enumerate(pods):
                    if a != b and wb.labels.get("app") == wa.labels.get("app"):
                        conflicts.append((a, b, t.topology_key))
        domains = {k: pc.ix.domain_ids(k)[0].tolist() for k in (HOSTNAME, ZONE)}
        mx = max((max(f.values(), default=0) for f in feas), default=0)
        penalty = (mx + 1) * (len(pods) + 1)
        ex = solve_exact_pods(feas, [(w.requests.cpu_milli, w.requests.mem_bytes,
                                      w.requests.gpus) for w in pods],
                              pc.free.tolist(), conflicts, domains, [], penalty, 60.0)
        exact_cost = sum(feas[p][n] for p, n in enumerate(ex.nodes) if n >= 0) / scale
        kb = kube_baseline(snap, pods, cfg)
        ours = cost_of(snap, pods, dict(res.assignments), cfg)
        same = (len(res.assignments) == sum(n >= 0 for n in ex.nodes)
                and abs(ours - exact_cost) < 1e-4 * len(pods))
        print(f"| 80 pods / 60 nodes, seed {s} | {ours:.4f} ({len(res.assignments)} placed) | "
              f"{cost_of(snap, pods, kb, cfg):.4f} ({len(kb)}) | {exact_cost:.4f} "
              f"({sum(n >= 0 for n in ex.nodes)}, {'proven' if ex.optimal else 'not proven'}) "
              f"| {'yes' if same else 'no'} |")


def run_forecast(seed: int, links: int = 200, steps: int = 200) -> None:
    """Holt's forecast (as re-placement uses it) against the last value, on synthetic link
    latency: a base, slow drifts, congestion ramps and noise. Mean absolute error, ms."""
    from cloud_core.placement.replan import Holt, ReplanConfig

    cfg = ReplanConfig()
    rnd = random.Random(seed)
    err: dict[tuple[str, int], list[float]] = {}
    for _ in range(links):
        x, drift, series = rnd.uniform(5, 40), 0.0, []
        for _t in range(steps):
            if rnd.random() < 0.03:
                drift = rnd.uniform(-1.0, 3.0)  # a congestion ramp starts (or eases)
            if rnd.random() < 0.05:
                drift = 0.0
            x = max(1.0, x + drift)
            series.append(x * rnd.uniform(0.95, 1.05))
        h = Holt(series[0])
        for t in range(1, steps - 2):
            for k in (1, 2):
                err.setdefault(("holt", k), []).append(abs(h.forecast(k) - series[t - 1 + k]))
                err.setdefault(("last", k), []).append(abs(series[t - 1] - series[t - 1 + k]))
            h = h.update(series[t], cfg.alpha, cfg.beta)
    print("\n| link latency forecast (MAE, ms) | 1 interval ahead | 2 intervals ahead |")
    print("|---|---:|---:|")
    for name, label in (("holt", f"Holt (alpha {cfg.alpha}, beta {cfg.beta})"),
                        ("last", "last value")):
        print(f"| {label} | {np.mean(err[name, 1]):.2f} | {np.mean(err[name, 2]):.2f} |")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lp-limit", type=float, default=300.0)
    ap.add_argument("--single", type=int, default=1000, help="one-pod-at-a-time decisions")
    ap.add_argument("--quick", action="store_true", help="1000 pods on 500 nodes")
    a = ap.parse_args(argv)
    if a.quick:
        a.nodes, a.pods, a.single = 500, 1000, 200
    run(a.nodes, a.pods, a.seed, a.lp_limit, a.single)
    run_small(a.seed)
    run_forecast(a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
