"""The node registry reads real Node objects: topology and security labels, KubeEdge edge nodes
and their taint, OpenYurt NodePools, agent-id mapping, and label changes."""

from __future__ import annotations

import pytest

from cloud_core.errors import SpecError
from cloud_core.k8s.registry import (
    AGENT_ID,
    RESIDENCY_REGION,
    NodeRegistry,
    RegistryConfig,
    resources_of,
)
from cloud_core.placement import Health, Resources
from tests.k8s.conftest import Cluster

pytestmark = pytest.mark.slow


def test_registry_from_node_objects(cluster: Cluster) -> None:
    # edge-1 is not a kwok node: the test turns its Ready condition Unknown below (the
    # node-lifecycle controller's verdict on a silent kubelet), and kwok, which only ever
    # reports its nodes Ready, would set it back.
    cluster.node("edge-1", region="eu-west", zone="eu-west-b", security=1,
                 kubeedge_group="ke-a", labels={AGENT_ID: "agent-edge-1"},
                 simulated=False)
    cluster.node("yurt-1", region="eu-central", security=2, openyurt_pool="pool-x",
                 cpu="2500m", memory="3Gi")
    cluster.node("cloud-1", region="us-east", security=3)
    nodes = cluster.c.list("/api/v1/nodes")[0]
    respect, ignore = NodeRegistry(), NodeRegistry(RegistryConfig(edge_taint="ignore"))
    for n in nodes:
        respect.upsert(n)
        ignore.upsert(n)

    e = respect.get("edge-1")
    assert e is not None and e.flavour == "kubeedge" and e.pool == "ke-a"
    assert (e.region, e.zone, e.security_level) == ("eu-west", "eu-west-b", 1)
    assert [t.key for t in e.taints] == ["node-role.kubernetes.io/edge"]
    ie = ignore.get("edge-1")
    assert ie is not None and ie.taints == ()
    y = respect.get("yurt-1")
    assert y is not None and y.flavour == "openyurt" and y.pool == "pool-x"
    assert y.capacity == Resources(cpu_milli=2500, mem_bytes=3 * 2**30)
    c = respect.get("cloud-1")
    assert c is not None and c.flavour == "cloud" and c.pool is None and c.health == Health.ONLINE

    assert respect.node_for_agent("agent-edge-1") == "edge-1"
    assert respect.agent_for_node("edge-1") == "agent-edge-1"
    assert respect.node_for_agent("yurt-1") == "yurt-1"  # default: the Node name
    pools = respect.pools()
    assert pools[("kubeedge", "ke-a")] == ["edge-1"] and pools[("openyurt", "pool-x")] == ["yurt-1"]
    infos = {n.name: n for n in respect.node_infos()}
    assert infos["cloud-1"].region == "us-east" and infos["cloud-1"].security_level == 3

    cluster.set_node_label("edge-1", RESIDENCY_REGION, "us-east")
    cluster.set_node_label("edge-1", "example.org/irrelevant", "x")
    changes = respect.upsert(cluster.c.get("/api/v1/nodes/edge-1"))
    assert [(ch.key, ch.old, ch.new) for ch in changes] == [(RESIDENCY_REGION, "eu-west", "us-east")]

    # An edge node that lost the cloud is unreachable (it keeps its pods), not down.
    n = cluster.c.get("/api/v1/nodes/edge-1")
    n["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "NodeLost"}]
    respect.upsert(cluster.c.replace("/api/v1/nodes/edge-1/status", n))
    e = respect.get("edge-1")
    assert e is not None and e.health == Health.UNREACHABLE


def test_quantities() -> None:
    assert resources_of({"cpu": "500m", "memory": "4Gi", "nvidia.com/gpu": 2}) == \
        Resources(500, 4 * 2**30, 2)
    assert resources_of({"cpu": 2, "memory": "1e3"}) == Resources(2000, 1000, 0)
    assert resources_of({"memory": "1k"}).mem_bytes == 1000
    with pytest.raises(SpecError):
        resources_of({"cpu": "lots"})
