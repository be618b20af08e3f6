"""PodSpec fields kube-scheduler acts on: parsed (spread, host ports, extended resources,
overhead, init containers, nodeName) or refused by name; the pod-by-pod placer honours them;
the validator checks them independently; the scoring policies order nodes as documented."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cloud_core.errors import SpecError
from cloud_core.placement import ClusterSnapshot, EngineConfig, place, validate
from cloud_core.placement.index import ClusterIndex
from cloud_core.placement.model import HostPort, NodeInfo, Resources
from cloud_core.placement.scores import kube_default_cost, sequential_cost
from cloud_core.placement.spec import parse_pod, usage_workload
from cloud_core.placement.spec_pod import pod_requests

GI = 1 << 30
ZONE = "topology.kubernetes.io/zone"


def pod(name: str = "p", labels: dict[str, str] | None = None, ann: dict[str, str] | None = None,
        **spec: Any) -> dict[str, Any]:
    spec.setdefault("containers", [{"name": "a", "resources": {"requests": {"cpu": "100m"}}}])
    return {"kind": "Pod", "metadata": {"name": name, "uid": name, "labels": labels or {},
                                        "annotations": ann or {}},
            "spec": {"schedulerName": "cfnet-scheduler", **spec}}


def c(cpu: str, **kw: Any) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": {"cpu": cpu}}, **kw}


@pytest.mark.parametrize("spec,want", [
    ({"containers": [c("100m"), c("200m")]}, {"cpu": 300}),
    # an init container needs its own request at its turn: the max wins
    ({"containers": [c("100m")], "initContainers": [c("500m")]}, {"cpu": 500}),
    # a sidecar (restartPolicy Always) runs beside the containers: added
    ({"containers": [c("100m")], "initContainers": [c("50m", restartPolicy="Always"),
                                                    c("120m")]}, {"cpu": 170}),
    ({"containers": [c("100m")], "overhead": {"cpu": "250m", "memory": "64Mi"}},
     {"cpu": 350, "memory": 64 << 20}),
    ({"containers": [c("100m")], "resources": {"requests": {"cpu": "1"}}}, {"cpu": 1000}),
    ({"containers": [{"name": "c", "resources": {"limits": {"example.com/dongle": 2}}}]},
     {"example.com/dongle": 2}),
])
def test_pod_requests_as_kube_scheduler_counts_them(spec: dict[str, Any],
                                                    want: dict[str, int]) -> None:
    assert pod_requests(spec) == want


@pytest.mark.parametrize("spec,field", [
    ({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]},
     "spec.volumes[0].persistentVolumeClaim"),
    ({"resourceClaims": [{"name": "gpu"}]}, "spec.resourceClaims"),
    ({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {}, "topologyKey": ZONE, "matchLabelKeys": ["x"]}]}}},
     "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
     ".matchLabelKeys"),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
                                     "whenUnsatisfiable": "DoNotSchedule", "future": 1}]},
     "spec.topologySpreadConstraints[0].future"),
    ({"containers": [{"name": "c", "resources": {"claims": [{"name": "x"}]}}]},
     "spec.containers[0].resources.claims"),
    ({"schedulingGates": [{"name": "wait"}]}, "spec.schedulingGates"),
    ({"someFutureField": True}, "spec.someFutureField"),
])
def test_unsupported_field_refused_by_name(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as ei:
        parse_pod(pod(**spec))
    assert ei.value.field == field


def test_spread_ports_node_name_parsed() -> None:
    w = parse_pod(pod(labels={"app": "a", "rev": "7"}, nodeName="n3", hostNetwork=True,
                      containers=[{"name": "c", "ports": [{"containerPort": 9100}]}],
                      topologySpreadConstraints=[{
                          "maxSkew": 2, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
                          "labelSelector": {"matchLabels": {"app": "a"}}, "minDomains": 3,
                          "matchLabelKeys": ["rev"], "nodeTaintsPolicy": "Honor"}]))
    (s,) = w.spread
    assert (s.max_skew, s.hard, s.min_domains, s.honor_affinity, s.honor_taints) == \
        (2, True, 3, True, True)
    assert dict(s.selector.match_labels) == {"app": "a", "rev": "7"}
    assert w.host_ports == (HostPort(9100),)
    assert w.node_affinity[0].match_expressions[-1].values == ("n3",)
    # the lenient reading still counts a refused pod's requests on its node
    u = usage_workload(pod(volumes=[{"name": "d", "persistentVolumeClaim": {}}],
                           containers=[c("700m")]))
    assert u is not None and u.requests.cpu_milli == 700


def nodes(n: int, **kw: Any) -> tuple[NodeInfo, ...]:
    return tuple(NodeInfo(name=f"n{i}", region="r", zone=f"z{i % 3}",
                          capacity=Resources(4000, 16 * GI), price_per_hour=1 + i / 100, **kw)
                 for i in range(n))


SPREAD = {"topologySpreadConstraints": [{
    "maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
    "labelSelector": {"matchLabels": {"app": "s"}}}]}


@pytest.mark.parametrize("case,snap_nodes,pods,placed", [
    ("spread over 3 zones", nodes(6), [pod(f"s{i}", {"app": "s"}, **SPREAD)
                                       for i in range(8)], 8),
    ("host ports: one a node", nodes(3), [pod(f"h{i}", containers=[
        {"name": "c", "ports": [{"containerPort": 1, "hostPort": 80}]}]) for i in range(5)], 3),
    ("extended resources", nodes(2, extended={"example.com/d": 1}),
     [pod(f"e{i}", containers=[{"name": "c", "resources": {"limits": {"example.com/d": 1}}}])
      for i in range(4)], 2),
    ("pods per node", nodes(2, max_pods=3), [pod(f"m{i}") for i in range(9)], 6),
])
def test_pod_by_pod_constraints_hold(case: str, snap_nodes: tuple[NodeInfo, ...],
                                     pods: list[dict[str, Any]], placed: int) -> None:
    snap = ClusterSnapshot(nodes=snap_nodes, links={})
    ws = [parse_pod(p) for p in pods]
    r = place(snap, ws)
    assert len(r.assignments) == placed, case
    assert validate(snap, ws, r.assignments) == []
    # and the validator does catch a breach of each, on its own
    crowd = {w.uid: "n0" for w in ws}
    assert validate(snap, ws, crowd), case


def _ix(allocs: list[tuple[int, int]]) -> ClusterIndex:
    ns = tuple(NodeInfo(name=f"n{i}", region="r", zone="z", capacity=Resources(4000, 8 * GI),
                        allocated=Resources(cpu, mem * GI), price_per_hour=1.0 + i)
               for i, (cpu, mem) in enumerate(allocs))
    return ClusterIndex(ClusterSnapshot(nodes=ns, links={}), EngineConfig())


@pytest.mark.parametrize("allocs,best", [
    ([(3000, 6), (0, 0), (1000, 2)], 1),  # least allocated wins
    ([(2000, 0), (1000, 2)], 1),  # same mean use, the balanced one wins
    ([(0, 0), (0, 0)], 0),  # a tie goes to the first
])
def test_spread_policy_scores_like_kube_defaults(allocs: list[tuple[int, int]],
                                                 best: int) -> None:
    ix = _ix(allocs)
    w = parse_pod(pod())
    cost = kube_default_cost(w, ix, np.arange(ix.n))
    assert int(np.argmin(cost)) == best


def test_policy_chosen_per_core_or_per_workload() -> None:
    ix = _ix([(2000, 4), (0, 0)])  # n0 half full at 1 $/h, n1 empty at 2 $/h
    mask = np.ones(2, dtype=bool)
    packed = parse_pod(pod())
    spread = parse_pod(pod(ann={"cfnet.io/placement-policy": "spread"}))
    assert np.argmin(sequential_cost(packed, ix, mask, "cost", [])) == 0  # cheaper
    assert np.argmin(sequential_cost(packed, ix, mask, "spread", [])) == 1  # core's policy
    assert np.argmin(sequential_cost(spread, ix, mask, "cost", [])) == 1  # its own: emptier
    # the spread policy spreads a batch over all nodes; the cost policy packs it
    snap = ClusterSnapshot(nodes=nodes(6), links={})
    ws = [parse_pod(pod(f"p{i}")) for i in range(12)]
    spread_nodes = set(place(snap, ws, EngineConfig(policy="spread")).assignments.values())
    cost_nodes = set(place(snap, ws, EngineConfig()).assignments.values())
    assert len(spread_nodes) == 6 and len(cost_nodes) < 6
    with pytest.raises(SpecError):
        parse_pod(pod(ann={"cfnet.io/placement-policy": "random"}))


def test_both_kubernetes_schedulers_take_the_same_placement_flags() -> None:
    """``cfnet-core --kubernetes`` and ``python -m cloud_core.k8s`` share k8s/flags.py: the
    same defaults (no CP-SAT polish) and the same flags."""
    import argparse

    from cloud_core.k8s.flags import add_scheduler_args, scheduler_engine_config
    from cloud_core.main import parse_args

    alone = argparse.ArgumentParser()
    add_scheduler_args(alone)
    for argv in ([], ["--placement-policy", "spread", "--exact-packing"]):
        core = scheduler_engine_config(parse_args(["--kubernetes", *argv]))
        assert core == scheduler_engine_config(alone.parse_args(argv))
        assert core.cpsat_polish == bool(argv) and core.use_cpsat
        assert core.policy == ("spread" if argv else "cost")
    with pytest.raises(SystemExit):
        parse_args(["--kubernetes", "--placement-policy", "random"])


def test_the_flags_offer_the_policies_the_engine_takes() -> None:
    """k8s/flags.py names the policies without importing the engine (cfnet-core parses its
    arguments before importing it): the same as the spec parser's."""
    from cloud_core.k8s import flags
    from cloud_core.placement.spec_annotations import POLICIES

    assert flags.POLICIES == POLICIES
