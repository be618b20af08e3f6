"""bench_k8s's field mix and its independent checker: every zone keeps nodes a pod without
the edge toleration may use, and spread skew is counted over each pod's own domains."""

from __future__ import annotations

from typing import Any

from tools.bench_k8s import EDGE, NODE_STATUS, ZONE, check, node_object, pod_object


def test_field_mix_leaves_untainted_nodes_in_every_zone() -> None:
    zones: dict[str, set[bool]] = {}
    for j in range(240):
        n = node_object(j, field=True)
        zones.setdefault(n["metadata"]["labels"][ZONE], set()).add(bool(n["spec"]))
    assert zones and all(v == {True, False} for v in zones.values())
    assert sum(EDGE in node_object(j, field=True)["metadata"]["labels"]
               for j in range(240)) == 120


def test_field_mix_keeps_spread_groups_to_one_affinity() -> None:
    for i in range(400):
        spec = pod_object(i, "ns", "s", field=True)["spec"]
        if spec.get("topologySpreadConstraints"):
            assert "affinity" not in spec, i


def _nodes() -> list[dict[str, Any]]:
    out = []
    for j in range(8):  # regions r0-r3, zones r?-0 and r?-1
        n = node_object(j)
        n["spec"] = {}
        n["metadata"]["labels"][ZONE] = f"r{j % 4}-{j // 4}"
        n["status"] = NODE_STATUS
        out.append(n)
    return out


def _spread_pod(name: str, node: str, region: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node, "containers": [{"name": "c", "resources": {"requests": {}}}],
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
                                       "whenUnsatisfiable": "DoNotSchedule",
                                       "labelSelector": {"matchLabels": {"g": "a"}}}]}
    if region:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/region", "operator": "In",
                 "values": [region]}]}]}}}
    return {"metadata": {"name": name, "namespace": "ns", "labels": {"g": "a"}}, "spec": spec}


def test_checker_counts_each_pods_skew_over_its_own_domains() -> None:
    nodes = _nodes()
    names = [n["metadata"]["name"] for n in nodes]
    # one pod per zone, and one more pod that may only go to region r0 (its domains:
    # r0-0 and r0-1): balanced for it, though r0-0 now has 2 against the others' 1
    # (listed first: the group's first pod must not lend its domains to the others)
    pods = [_spread_pod("r0-pod", names[0], region="r0")]
    pods += [_spread_pod(f"p{j}", names[j]) for j in range(8)]
    assert check(pods, nodes) == []
    # two more there break its own skew (3 against r0-1's 1)
    pods += [_spread_pod("r0-b", names[0], region="r0"), _spread_pod("r0-c", names[0], "r0")]
    assert any(v.startswith("r0-") for v in check(pods, nodes))
