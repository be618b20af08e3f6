"""A pod that arrives while the core decides a tight batch is bound within 1 s. Against a
real kube-apiserver (kwok nodes), with the Kubernetes core (``build_actuator``) deciding.

The batch is the tight benchmark's 300 x 60 instance (``tools.bench_tight.make_tight``,
seed 1: 339 pods, every one of the 60 nodes filled to 92-98 % by a hidden packing, GPU
nodes tainted, residency, hostname anti-affinity within the spread groups; its latency SLAs
and data sets need telemetry this control plane has not, so they are left out). All of it
is pending before the core starts, so its first step takes the whole batch at once. Its
neighbourhood search ran 14 s there before the small-batch step budget
(``placement/budget.py``: 0.85 s of the loop thread's CPU from the step's start, reading
the batch included, some of it left for validating and handing out the bindings); the
scheduling loop waited on it, and so did every pod that arrived meanwhile. A canary created
the moment the step takes the batch goes in the next step, and is bound (``pods/binding``
answered) soon after: the loop is held within 1 s, scaled by the machine's measured slowness
and an allowance (``ALLOWANCE``); and all but a few pods of the batch are bound, by that
step or, where the budget cut it, by the next ones.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.config import ActuatorConfig
from cloud_core.k8s.registry import RESIDENCY_REGION, SECURITY, NodeRegistry
from cloud_core.k8s.wiring import build_actuator
from cloud_core.placement import EngineConfig, Workload
from cloud_core.placement.cpsat import warm_up
from cloud_core.placement.model import HOSTNAME
from tests.k8s.conftest import Cluster, make_node, wait_for
from tools.bench_tight import make_tight

pytestmark = pytest.mark.slow

CANARY_S = 1.0  # the requirement: no step holds the loop longer
# What the test allows over it: the budget is the loop thread's CPU, and the binder's and
# watchers' threads share the interpreter with it, so its wall time runs a little over its
# CPU time even on an idle machine. The allowance keeps the test a guard against a search
# that holds the loop for seconds (14 s before the budget), not a race with the load.
ALLOWANCE = 1.5
# The canary's binding goes out behind the batch's 339 (the binder's pool is first in, first
# out): measured 0.1-0.2 s on an idle machine, 3.4 s at load 14 (the API server shares it).
BINDINGS_S = 0.5
GPU = "nvidia.com/gpu"


def _nodes(cluster: Cluster, inst_nodes: Any) -> None:
    def one(nd: Any) -> None:
        labels = {"kubernetes.io/hostname": nd.name, "topology.kubernetes.io/region": nd.region,
                  "topology.kubernetes.io/zone": nd.zone, RESIDENCY_REGION: nd.region,
                  SECURITY: "1"}
        cap = {"cpu": f"{nd.capacity.cpu_milli}m", "memory": str(nd.capacity.mem_bytes),
               "pods": "110"}
        if nd.capacity.gpus:
            cap[GPU] = str(nd.capacity.gpus)
        taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in nd.taints]
        cluster.nodes.append(nd.name)
        make_node(cluster.c, nd.name, labels, capacity=cap, taints=taints or None)

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(one, inst_nodes))


def _pod(ns: str, w: Workload) -> dict[str, Any]:
    req = {"cpu": f"{w.requests.cpu_milli}m", "memory": str(w.requests.mem_bytes)}
    res: dict[str, Any] = {"requests": req}
    if w.requests.gpus:
        res = {"requests": {**req, GPU: str(w.requests.gpus)},
               "limits": {GPU: str(w.requests.gpus)}}
    spec: dict[str, Any] = {
        "schedulerName": "cfnet-scheduler",
        "containers": [{"name": "app", "image": "registry.example/app:1", "resources": res}]}
    if w.tolerations:
        spec["tolerations"] = [{"key": t.key, "operator": t.operator, "effect": "NoSchedule"}
                               for t in w.tolerations]
    if w.pod_anti_affinity:
        spec["affinity"] = {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": dict(w.labels)},
                "topologyKey": HOSTNAME}]}}
    ann = {"cfnet.io/residency": ",".join(sorted(w.residency))} if w.residency else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": w.uid, "namespace": ns, "labels": dict(w.labels),
                         "annotations": ann},
            "spec": spec}


def _slowness() -> float:
    """Wall time over CPU time of 0.2 s of this process's work, at least 1: how much slower
    than an idle core the machine runs now (the core's threads share this process). On a
    loaded machine (the suite's two workers, kube-apiserver beside them) every step of the
    loop, the budget's own 1 s included, stretches by about that much."""
    w0, c0 = time.perf_counter(), time.process_time()
    x = 0
    while time.process_time() - c0 < 0.2:
        x += sum(range(1000))
    return max(1.0, (time.perf_counter() - w0) / max(time.process_time() - c0, 1e-3))


def test_a_pod_arriving_during_a_tight_batch_is_bound_within_a_second(
        cluster: Cluster, admin: KubeClient) -> None:
    inst = make_tight(60, 300, 1, (0.92, 0.98))
    ns = cluster.namespace
    _nodes(cluster, inst.snapshot.nodes)
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda w: admin.create(f"/api/v1/namespaces/{ns}/pods", _pod(ns, w)),
                    inst.pods))
    warm_up()  # the core does this once its first decisions are out: not what is measured
    bound_at: dict[str, float] = {}
    lock = threading.Lock()
    canary_bound, batch_taken = threading.Event(), threading.Event()

    def on_bound(key: str, node: str) -> None:
        with lock:
            bound_at[key] = time.monotonic()
        if key.endswith("/canary"):
            canary_bound.set()

    # the first step takes the whole backlog (its default first batch is 100: bindings out
    # early on a large backlog; here the one tight batch is what is measured), with the
    # engine as cfnet-core runs it (k8s/flags.py: cpsat_polish off unless --exact-packing)
    cfg = ActuatorConfig(identity="step-budget", first_batch=1000,
                         engine_config=EngineConfig(cpsat_polish=False))
    # not leading until every pod of the batch is queued: then the first step takes it all
    lead = threading.Event()
    act = build_actuator(admin, NodeRegistry(), cfg, on_bound=on_bound, is_leader=lead.is_set)
    taken: list[tuple[float, int]] = []  # when each step took its batch, and its size
    pending = act.source.pending

    def seen() -> list[dict[str, Any]]:
        out = pending()
        if out:
            taken.append((time.monotonic(), len(out)))
            batch_taken.set()
        return out

    act.source.pending = seen  # type: ignore[method-assign]
    act.start()
    try:
        wait_for(lambda: len(act.queue) >= len(inst.pods), timeout=60,
                 what="the batch queued", explain=cluster.describe)
        slow = _slowness()
        lead.set()
        act.wake()
        # events, not polling: a test thread waking every millisecond would take the
        # interpreter from the core's loop it measures
        assert batch_taken.wait(60), "the core's step never took the batch"
        t0 = time.monotonic()
        cluster.pod("canary", cpu="10m", memory="16Mi")
        assert canary_bound.wait(30), f"the canary not bound in 30 s: {cluster.describe()}"
        took = bound_at[f"{ns}/canary"] - t0
        slow = max(slow, _slowness())  # the load may have risen meanwhile
        batch = [f"{ns}/{w.uid}" for w in inst.pods]
        assert taken[0][1] == len(inst.pods), taken  # one step, the whole batch
        # the canary went in the next step (created once the batch was taken): the loop
        # was held from the batch's taking to the canary's
        held = taken[1][0] - taken[0][0]
        say = (f"loop held {held:.2f} s by the batch's step, canary bound {took:.2f} s after "
               f"its create call (allowed {CANARY_S:g} s x {ALLOWANCE:g} x {slow:.2f}, the "
               f"machine's slowness; load {os.getloadavg()[0]:.1f})")
        print(f"[step-budget] {say}")
        assert taken[1][1] == 1 and held < CANARY_S * ALLOWANCE * slow, say
        assert took < (CANARY_S * ALLOWANCE + BINDINGS_S) * slow, say
        # a step the budget cut leaves some pods to the next steps (after their back-off):
        # all but a few of the batch are bound within a minute
        wait_for(lambda: sum(k in bound_at for k in batch) >= len(batch) - 5, timeout=60,
                 what=f"all but 5 of the batch's {len(batch)} pods bound",
                 explain=lambda: f"{sum(k in bound_at for k in batch)} bound")
    finally:
        act.stop()
