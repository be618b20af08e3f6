"""Names that belong to a tenant stay in its namespace: gangs.

The same against a real API server with tenants as RBAC identities:
tests/k8s/test_tenancy.py::test_gangs_are_per_namespace."""

from __future__ import annotations

from cloud_core.placement import ClusterSnapshot, NodeInfo, Resources, parse_pod, place, validate


def _member(ns: str, i: int, cpu: str) -> dict:
    return {"metadata": {"name": f"w{i}", "namespace": ns, "uid": f"{ns}-{i}",
                         "annotations": {"cfnet.io/gang": "train"}},
            "spec": {"schedulerName": "cfnet-scheduler", "containers": [
                {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]}}


def test_same_gang_name_in_two_namespaces_are_two_gangs() -> None:
    snap = ClusterSnapshot(nodes=(NodeInfo("n1", "r", "z", capacity=Resources(4000, 8 << 30)),),
                           links={}, now=0.0, pods=())
    a = [parse_pod(_member("tenant-a", i, "1")) for i in range(2)]  # fits
    b = [parse_pod(_member("tenant-b", i, "3")) for i in range(2)]  # 6 cpus: cannot fit
    assert {w.gang for w in a} == {"tenant-a/train"}
    r = place(snap, [*b, *a])
    assert {r.assignments.get(w.uid) for w in a} == {"n1"}  # B's gang does not block A's
    assert not any(w.uid in r.assignments for w in b)
    assert validate(snap, [*a, *b], dict(r.assignments)) == []
