"""Seeded instance families for the placement-quality benchmark (``tools.bench_quality``).

Six families, each ``make(n_pods, seed) -> (snapshot, pods)`` at 10-300 pods:

* ``tight``: ``bench_tight.make_tight``, a hidden packing at 90-98 % of capacity;
* ``sla``: ``bench_tight.make_sla``, latency SLAs to user gateways and regions, anti-affinity,
  GPUs at moderate load;
* ``residency``: six regions priced apart, most pods bound to one or two (often the dear
  ones), 80 % of the cpu asked;
* ``anti``: deployments of 2-8 replicas with hostname or zone anti-affinity or hard zone
  spread (maxSkew 1), 70 % of the cpu asked;
* ``gpu``: tainted GPU nodes of 1-8 GPUs beside cpu nodes, GPU pods of 1-4 GPUs, some in
  gangs (all or nothing), GPUs asked to about their capacity;
* ``mixed``: a bit of everything validate checks: labels and selectors, node affinity,
  taints and tolerations, security levels, running pods (anti-affinity, host ports), pod
  affinity to a database's zone, anti-affinity, spread, host ports, extended resources,
  pods per node, residency, SLAs, gangs, preferences and data gravity.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

from cloud_core.placement import (
    ClusterSnapshot,
    LabelSelector,
    LinkInfo,
    NodeInfo,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    Resources,
    RunningPod,
    Taint,
    Toleration,
    Workload,
)
from cloud_core.placement.model import HOSTNAME, ZONE, HostPort, SpreadConstraint
from tools.bench_tight import make_sla, make_tight

GIB = 1 << 30
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")
GPU_TOL = (Toleration("nvidia.com/gpu", "Exists"),)
FPGA = "example.com/fpga"
Instance = tuple[ClusterSnapshot, list[Workload]]


def _nodes(rnd: random.Random, n: int, regions: int, gpu_share: float = 0.0,
           factors: tuple[float, ...] = ()) -> list[NodeInfo]:
    out = []
    for i in range(n):
        ri = i % regions
        gpus = rnd.choice((1, 2, 4, 8)) if rnd.random() < gpu_share else 0
        cpu = max(16000, 8000 * gpus) if gpus else rnd.choice((4000, 8000, 16000, 32000))
        f = factors[ri] if factors else 1.0 + 0.15 * ri
        out.append(NodeInfo(
            name=f"q{i:04d}", region=f"r{ri}", zone=f"r{ri}-z{(i // regions) % 3}",
            taints=(GPU_TAINT,) if gpus else (), capacity=Resources(cpu, cpu // 250 * GIB, gpus),
            price_per_hour=round((0.5 * cpu / 16000 + 2.5 * gpus) * f * rnd.uniform(0.9, 1.1),
                                 4),
            energy_price_per_kwh=0.1 + 0.02 * ri, carbon_g_per_kwh=100 + 60 * ri,
            idle_watts=300 if gpus else 100, max_watts=1500 if gpus else 350))
    return out


def _pod(uid: str, cpu: int, app: str, mem: int = 0, gpus: int = 0, **kw: Any
         ) -> Workload:
    w = Workload(uid=uid, name=uid, labels={"app": app},
                 requests=Resources(cpu, mem or max(cpu // 1000 * 2 * GIB, GIB // 2), gpus))
    return dataclasses.replace(w, **kw)


def _deployments(rnd: random.Random, n_pods: int, cpu_budget: int, reps: tuple[int, int],
                 each: Callable[[int, str, int], dict[str, Any]]) -> list[Workload]:
    """Deployments of ``reps`` replicas until ``n_pods``; ``each(d, app, cpu)`` gives the
    deployment's constraints. Requests shrink to 250 m once ``cpu_budget`` is spent."""
    pods: list[Workload] = []
    asked = d = 0
    while len(pods) < n_pods:
        d += 1
        k = min(rnd.randint(*reps), n_pods - len(pods))
        cpu = rnd.choice((250, 500, 1000, 2000, 4000))
        if asked + k * cpu > cpu_budget:
            cpu = 250
        app = f"d{d}"
        kw = each(d, app, cpu)
        pods += [_pod(f"{app}-{j}", cpu, app, **kw) for j in range(k)]
        asked += k * cpu
    return pods


def residency(n_pods: int, seed: int) -> Instance:
    rnd = random.Random(seed * 31 + 1)
    nodes = _nodes(rnd, max(3, n_pods // 4), 6, factors=(0.8, 0.9, 1.0, 1.2, 1.5, 1.9))
    budget = int(0.8 * sum(nd.capacity.cpu_milli for nd in nodes))

    def each(d: int, app: str, cpu: int) -> dict[str, Any]:
        x = rnd.random()
        if x < 0.45:  # one region, more often a dear one
            res = frozenset({f"r{rnd.choice((2, 3, 4, 5, 5))}"})
        elif x < 0.75:
            res = frozenset({f"r{rnd.randrange(6)}", f"r{rnd.randrange(6)}"})
        else:
            res = frozenset()
        return {"residency": res, "data_gb": rnd.choice((0.0, 50.0)),
                "data_location": f"r{rnd.randrange(6)}"}

    return ClusterSnapshot(tuple(nodes), {}, now=1e9), _deployments(
        rnd, n_pods, budget, (1, 4), each)


def anti(n_pods: int, seed: int) -> Instance:
    rnd = random.Random(seed * 31 + 2)
    nodes = _nodes(rnd, max(4, n_pods // 4), 3)
    budget = int(0.7 * sum(nd.capacity.cpu_milli for nd in nodes))

    def each(d: int, app: str, cpu: int) -> dict[str, Any]:
        sel = LabelSelector({"app": app})
        x = rnd.random()
        if x < 0.5:
            return {"pod_anti_affinity": (PodAffinityTerm(sel, HOSTNAME),)}
        if x < 0.7:
            return {"pod_anti_affinity": (PodAffinityTerm(sel, ZONE),)}
        if x < 0.9:
            return {"spread": (SpreadConstraint(1, ZONE, True, sel),)}
        return {}

    return ClusterSnapshot(tuple(nodes), {}, now=1e9), _deployments(
        rnd, n_pods, budget, (2, 8), each)


def gpu(n_pods: int, seed: int) -> Instance:
    rnd = random.Random(seed * 31 + 3)
    nodes = _nodes(rnd, max(3, n_pods // 4), 3, gpu_share=0.5)
    gpus_left = sum(nd.capacity.gpus for nd in nodes)
    budget = int(0.6 * sum(nd.capacity.cpu_milli for nd in nodes))
    pods: list[Workload] = []
    d = 0
    while len(pods) < n_pods:
        d += 1
        k = min(rnd.randint(1, 4), n_pods - len(pods))
        g = rnd.choice((1, 1, 2, 4))
        app = f"g{d}"
        if gpus_left >= 0 and rnd.random() < 0.5:
            gang = app if k > 1 and rnd.random() < 0.4 else None
            pods += [_pod(f"{app}-{j}", 4000 * g, app, gpus=g, mem=16 * g * GIB,
                          tolerations=GPU_TOL, gang=gang) for j in range(k)]
            gpus_left -= k * g
        else:
            cpu = rnd.choice((500, 1000, 2000)) if budget > 0 else 250
            pods += [_pod(f"{app}-{j}", cpu, app) for j in range(k)]
            budget -= k * cpu
    return ClusterSnapshot(tuple(nodes), {}, now=1e9), pods


def mixed(n_pods: int, seed: int) -> Instance:
    rnd = random.Random(seed * 31 + 4)
    base = _nodes(rnd, max(4, n_pods // 4), 3, gpu_share=0.1)
    nodes = []
    for i, nd in enumerate(base):
        taints = nd.taints + ((Taint("dedicated", "batch"),) if i % 7 == 3 else ()) + (
            (Taint("spot", "", "PreferNoSchedule"),) if i % 5 == 1 else ())
        nodes.append(dataclasses.replace(
            nd, labels={"disk": rnd.choice(("ssd", "hdd"))}, taints=taints,
            security_level=rnd.choice((0, 1, 2)), max_pods=rnd.choice((None, 6, 10)),
            extended={FPGA: 2} if i % 4 == 0 else {}))
    links = {(nd.name, f"gw{g}"): LinkInfo(2.0, round(rnd.uniform(3, 40), 1), age_s=1.0)
             for nd in nodes for g in range(3)}
    running = tuple(RunningPod(
        uid=f"bg{i}", name=f"bg{i}", namespace="default", node=nd.name,
        labels={"app": "bg"}, anti_affinity=(PodAffinityTerm(LabelSelector({"app": "bg"})),),
        host_ports=(HostPort(8080),)) for i, nd in enumerate(nodes) if i % 5 == 0)
    budget = int(0.75 * sum(nd.capacity.cpu_milli for nd in nodes))
    ssd = NodeSelectorTerm((NodeSelectorRequirement("disk", "In", ("ssd",)),))

    def each(d: int, app: str, cpu: int) -> dict[str, Any]:
        sel = LabelSelector({"app": app})
        kw: dict[str, Any] = {}
        r = rnd.random
        if d == 1:
            return {"labels": {"app": "db"}, "node_selector": {"disk": "ssd"}}
        if r() < 0.2:
            kw["pod_affinity"] = (PodAffinityTerm(LabelSelector({"app": "db"}), ZONE),)
        if r() < 0.25:
            kw["pod_anti_affinity"] = (PodAffinityTerm(sel, HOSTNAME),)
        elif r() < 0.15:
            kw["spread"] = (SpreadConstraint(1, ZONE, True, sel),)
        if r() < 0.1:
            kw["host_ports"] = (HostPort(8080 if r() < 0.5 else 9090),)
        if r() < 0.1:
            kw["extended"] = {FPGA: 1}
        if r() < 0.2:
            kw["node_affinity"] = (ssd,)
        elif r() < 0.3:
            kw["preferred_node_affinity"] = ((50, ssd),)
        if r() < 0.2:
            kw["tolerations"] = (Toleration("dedicated", "Equal", "batch"),)
        if r() < 0.3:
            kw["min_security_level"] = rnd.choice((1, 2))
        if r() < 0.3:
            kw["residency"] = frozenset({f"r{rnd.randrange(3)}"})
        if r() < 0.3:
            kw["max_latency_ms"], kw["latency_to"] = rnd.choice((15.0, 25.0)), f"gw{d % 3}"
        if r() < 0.1:
            kw["gang"] = app
        if r() < 0.3:
            kw["data_gb"], kw["data_location"] = 100.0, f"r{d % 3}"
        return kw

    pods = _deployments(rnd, n_pods, budget, (1, 5), each)
    return ClusterSnapshot(tuple(nodes), links, now=1e9, pods=running), pods


def tight(n_pods: int, seed: int) -> Instance:
    inst = make_tight(max(6, n_pods // 5), n_pods, seed, (0.90, 0.98))
    return inst.snapshot, inst.pods


def sla(n_pods: int, seed: int) -> Instance:
    inst = make_sla(max(4, n_pods // 5), n_pods, seed)
    return inst.snapshot, inst.pods


FAMILIES: dict[str, Callable[[int, int], Instance]] = {
    "tight": tight, "sla": sla, "residency": residency, "anti": anti, "gpu": gpu,
    "mixed": mixed}
