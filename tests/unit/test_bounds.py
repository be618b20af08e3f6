"""Bounded arithmetic where a pod's numbers enter a sum, and a pod
requesting none of a resource on a node over-committed in it (NodeResourcesFit).

A pod of another scheduler asking for int64's maximum three times over once overflowed the
engine's int64 arrays: every placement failed with OverflowError. Now such a figure is
counted as ``COUNT_MAX`` (its node is full), a pod of cfnet's asking for it is refused by
name, and nothing else is affected. The same against a real API server:
tests/k8s/test_tenancy.py::test_int64_requests_of_another_schedulers_pod."""

from __future__ import annotations

import pytest

from cloud_core.errors import SpecError
from cloud_core.placement import (
    ClusterSnapshot,
    NodeInfo,
    Resources,
    RunningPod,
    Workload,
    explain,
    parse_pod,
    place,
    validate,
)
from cloud_core.placement.model import COUNT_MAX
from cloud_core.placement.spec import usage_workload
from tests.unit.agreement import fitting_nodes

MAX64 = 2**63 - 1


def _pod(cpu: str, n: int = 3, scheduler: str = "cfnet-scheduler") -> dict:
    return {"metadata": {"name": "hog", "namespace": "tenant-a", "uid": "hog"},
            "spec": {"schedulerName": scheduler, "nodeName": "n1", "containers": [
                {"name": f"c{i}", "image": "x", "resources": {"requests": {"cpu": cpu}}}
                for i in range(n)]}}


def _snapshot(hog: RunningPod) -> ClusterSnapshot:
    nodes = tuple(NodeInfo(n, "r", "z", capacity=Resources(4000, 8 << 30, 0),
                           allocated=hog.requests if n == "n1" else Resources())
                  for n in ("n1", "n2"))
    return ClusterSnapshot(nodes=nodes, links={}, now=0.0, pods=(hog,))


def test_another_schedulers_int64_pod_fills_only_its_node() -> None:
    w = usage_workload(_pod(f"{MAX64}m", scheduler="default-scheduler"))
    assert w is not None and w.requests.cpu_milli == COUNT_MAX  # clamped, not 3 x 2^63
    hog = RunningPod(uid="hog", name="hog", namespace="tenant-a", node="n1", labels={},
                     requests=w.requests)
    snap = _snapshot(hog)
    pods = [Workload(uid=f"u{i}", name=f"p{i}", namespace="b",
                     requests=Resources(100, 1 << 20, 0)) for i in range(5)]
    result = place(snap, pods)
    assert set(result.assignments.values()) == {"n2"}
    assert validate(snap, pods, result.assignments) == []
    assert "insufficient cpu" in explain(snap, pods[0], node="n1").node_reasons
    assert fitting_nodes(snap, pods[0]) == {"n2"}


def test_raw_sums_past_int64_in_a_snapshot_never_raise() -> None:
    # a snapshot built by hand (not through the core's clamping sources)
    hog = RunningPod(uid="hog", name="hog", namespace="t", node="n1", labels={},
                     requests=Resources(3 * MAX64, 0, 0))
    snap = _snapshot(hog)
    pods = [Workload(uid="u", name="p", namespace="b", requests=Resources(100, 0, 0)),
            Workload(uid="big", name="big", namespace="b", requests=Resources(3 * MAX64, 0, 0))]
    result = place(snap, pods)
    assert result.assignments.get("u") == "n2"
    assert "big" not in result.assignments


def test_cfnets_own_pod_past_the_bound_is_refused_by_name() -> None:
    with pytest.raises(SpecError, match="more than cfnet counts"):
        parse_pod(_pod(f"{MAX64}m"))
    parse_pod(_pod("1"))  # an ordinary one is fine


def test_zero_request_fits_an_over_committed_node() -> None:
    # noderesources/fit_test.go TestEnoughRequests, "skip checking resource request with
    # quantity zero": node 10m cpu / 20 bytes / extended 5, a pod there already uses
    # 20m / 30 bytes / 1: a pod asking only for 1 of the extended resource fits.
    ext = "example.com/aaa"
    node = NodeInfo("n1", "r", "z", capacity=Resources(10, 20, 0),
                    allocated=Resources(20, 30, 0), max_pods=32, extended={ext: 5})
    running = RunningPod(uid="r", name="r", namespace="a", node="n1", labels={},
                         requests=Resources(20, 30, 0), extended={ext: 1})
    snap = ClusterSnapshot(nodes=(node,), links={}, now=0.0, pods=(running,))
    w = Workload(uid="w", name="w", namespace="a", extended={ext: 1})
    assert place(snap, [w]).assignments == {"w": "n1"}
    assert fitting_nodes(snap, w) == {"n1"}
    # and one that asks for 1m of cpu does not
    w2 = Workload(uid="w2", name="w2", namespace="a", requests=Resources(1, 0, 0))
    assert fitting_nodes(snap, w2) == set()
    assert place(snap, [w2]).assignments == {}
