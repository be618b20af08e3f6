"""The Kubernetes actuator against a real kube-apiserver: batch placement and binding, events,
409 conflicts, expired watches (410), an API server restart mid-run, node label changes.

Each test runs twice: as cluster admin, and under a token of deploy/k8s's ServiceAccount with
the ClusterRole exactly as written (``core_client``).
"""

from __future__ import annotations

import collections
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cloud_core.k8s import objects
from cloud_core.k8s.actuator import Actuator, ActuatorConfig
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.informer import Reflector
from cloud_core.k8s.prefetch import FirstLists
from cloud_core.k8s.registry import RESIDENCY_REGION, NodeRegistry
from cloud_core.k8s.wiring import build_actuator
from cloud_core.placement import ClusterSnapshot, parse_pod, validate
from tests.k8s.conftest import Cluster, wait_for
from tools.envtest import ControlPlane

pytestmark = pytest.mark.slow



@pytest.fixture
def actuator(core_client: KubeClient, cluster: Cluster) -> Iterator[Actuator]:
    alerts: list[dict[str, Any]] = []
    act = build_actuator(core_client, NodeRegistry(),
                         ActuatorConfig(identity="test", bind_workers=8), on_alert=alerts.append)
    act.alerts = alerts  # type: ignore[attr-defined]
    act.start()
    assert act.wait_synced(30)
    yield act
    act.stop()


def bound(cluster: Cluster) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.pods()
            if p["spec"].get("nodeName")}


def events_at_least(cluster: Cluster, reason: str, n: int) -> list[dict[str, Any]]:
    """The namespace's ``reason`` events once there are at least ``n``: cfnet writes its
    events after the bindings, off the binding path, so they may trail the pods' state."""
    def enough() -> list[dict[str, Any]] | None:
        evs = cluster.events(reason)
        return evs if len(evs) >= n else None
    got: list[dict[str, Any]] = wait_for(enough, what=f"{n} {reason} events",
                                         explain=cluster.describe)
    return got


def topology(cluster: Cluster) -> None:
    """50 nodes: 20 KubeEdge (2 NodeGroups), 25 OpenYurt (5 NodePools), 5 cloud."""
    for i in range(10):
        cluster.node(f"ke-a-{i}", region="eu-west", security=1, kubeedge_group="ke-a")
        cluster.node(f"ke-b-{i}", region="us-east", security=1, kubeedge_group="ke-b")
    for p in range(1, 6):
        region = "eu-west" if p <= 2 else "eu-central"
        for i in range(5):
            cluster.node(f"oy-{p}-{i}", region=region, zone=f"{region}-{i % 2}", security=2,
                         openyurt_pool=f"oy-{p}")
    for i in range(5):
        cluster.node(f"cloud-{i}", region="us-east", security=3)


def test_200_pods_on_50_edge_nodes(cluster: Cluster, actuator: Actuator,
                                   control_plane: ControlPlane) -> None:
    topology(cluster)
    for i in range(60):
        cluster.pod(f"eu-{i}", annotations={"cfnet.io/residency": "eu-west,eu-central"})
    for i in range(40):
        cluster.pod(f"us-edge-{i}", tolerate_edge=True,
                    annotations={"cfnet.io/residency": "us-east"})
    for i in range(40):
        cluster.pod(f"secure-{i}", annotations={"cfnet.io/min-security-level": "3"})
    for i in range(30):
        cluster.pod(f"pool3-{i}", node_selector={"apps.openyurt.io/nodepool": "oy-3"})
    for i in range(30):
        cluster.pod(f"any-{i}", tolerate_edge=True)
    unplaceable: dict[str, dict[str, Any]] = {
        "nowhere-0": {"annotations": {"cfnet.io/residency": "ap-south"}},
        "nowhere-1": {"annotations": {"cfnet.io/residency": "ap-south"}},
        "nowhere-2": {"annotations": {"cfnet.io/residency": "ap-south"}},
        "huge-0": {"cpu": "16"},
        "huge-1": {"cpu": "16"},
        "topsecret-0": {"annotations": {"cfnet.io/min-security-level": "5"}},
        "badspec-0": {"annotations": {"cfnet.io/min-security-level": "high"}},
    }
    for name, kw in unplaceable.items():
        cluster.pod(name, **kw)

    wait_for(lambda: len(bound(cluster)) >= 200, timeout=240,
             what=f"200 bindings (actuator: {actuator.stats})")
    wait_for(lambda: len({e["involvedObject"]["name"]
                          for e in cluster.events("FailedScheduling")}) >= len(unplaceable),
             timeout=30, what="FailedScheduling events")

    pods = cluster.pods()
    b = bound(cluster)
    assert len(b) == 200 and not set(b) & set(unplaceable)
    # Every binding holds under the engine's own validator (over the live Node objects).
    reg = NodeRegistry()
    for n in cluster.c.list("/api/v1/nodes")[0]:
        reg.upsert(n)
    snap = ClusterSnapshot(nodes=reg.node_infos(), links={}, now=0.0)
    workloads = [parse_pod(p) for p in pods if p["metadata"]["name"] in b]
    assignments = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods
                   if p["metadata"]["name"] in b}
    assert validate(snap, workloads, assignments) == []
    # Spot checks of the constraints the test set up.
    assert all(b[f"secure-{i}"].startswith("cloud-") for i in range(40))
    assert all(b[f"pool3-{i}"].startswith("oy-3-") for i in range(30))
    assert all(not b[f"eu-{i}"].startswith(("ke-b", "cloud")) for i in range(60))
    assert all(not b[f"eu-{i}"].startswith("ke-") for i in range(60))  # no edge toleration
    # One Scheduled event per pod (no pod bound twice), FailedScheduling with the reason.
    sched = collections.Counter(e["involvedObject"]["name"]
                                for e in events_at_least(cluster, "Scheduled", len(b)))
    assert set(sched) == set(b) and max(sched.values()) == 1
    failed = {e["involvedObject"]["name"]: e["message"] for e in cluster.events("FailedScheduling")}
    assert set(failed) == set(unplaceable)
    for name in ("nowhere-0", "nowhere-1", "nowhere-2"):
        assert "residency" in failed[name] and failed[name].startswith("0/50 nodes fit")
    assert "cpu" in failed["huge-0"]
    assert "security" in failed["topsecret-0"]
    assert failed["badspec-0"].startswith("invalid workload spec") and "high" in failed["badspec-0"]
    # cfnet's answer after the tally: the conflict, and the nearest change with the node it
    # opens (cloud_core/conflicts.py, computed off the binding path)
    assert ". cfnet: security level 5 fails on every node; would fit: security level 5 -> 3: " \
        "cloud-" in failed["topsecret-0"], failed["topsecret-0"]
    assert ". cfnet: residency ap-south fails on every node; would fit: residency ap-south -> " \
        "ap-south," in failed["nowhere-0"], failed["nowhere-0"]
    assert ". cfnet: cpu 16 fails on every node; would fit: cpu 16 -> " in failed["huge-0"]
    assert "cfnet:" not in failed["badspec-0"]  # no workload to explain
    assert actuator.binder.unschedulable_by_constraint() == {"cpu": 2, "residency": 3,
                                                             "security": 1}
    print("\nFailedScheduling topsecret-0: " + failed["topsecret-0"])
    # ... and `kubectl describe pod` shows it
    out = subprocess.run(["kubectl", "--kubeconfig", str(control_plane.kubeconfig), "describe",
                          "pod", "-n", cluster.namespace, "topsecret-0"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "cfnet: security level 5 fails on every node; would fit: security level 5 -> 3" \
        in " ".join(out.split()), out
    assert actuator.stats.bound == 200
    actuator.snapshot()
    assert actuator.cache.assumed() == {}  # every assumed binding was confirmed by the watch


def test_bind_conflict_409_is_survived(cluster: Cluster, admin: KubeClient,
                                       core_client: KubeClient) -> None:
    """A pod that someone else bound first: 409, re-read, counted as already bound."""
    cluster.node("n-1", region="eu-west")
    cluster.node("n-2", region="eu-west")
    pod = cluster.pod("raced")  # no actuator runs in this test: the admin binds it first
    admin.bind_pod(cluster.namespace, "raced", pod["metadata"]["uid"], "n-1")
    act = build_actuator(core_client, NodeRegistry(), ActuatorConfig(identity="conflict-test"))
    act.binder.bind(pod, "n-2", parse_pod(pod))  # stale view: it still looks unbound
    assert act.stats.conflicts == 1 and act.stats.already_bound == 1 and act.stats.bound == 0
    assert bound(cluster) == {"raced": "n-1"}
    act.stop()


def test_expired_watch_410_relists(control_plane: ControlPlane, cluster: Cluster,
                                   admin: KubeClient, core_client: KubeClient) -> None:
    """Resuming from a resourceVersion the server no longer has: 410, then a full relist.

    After a restart the API server's watch cache starts at the current revision, so a
    resourceVersion from before the restart is too old (as after an etcd compaction).
    """
    path = f"/api/v1/namespaces/{cluster.namespace}/pods"
    _, old_rv = admin.list(path)
    for i in range(3):
        cluster.pod(f"p-{i}", scheduler="other-scheduler")
    control_plane.restart()
    seen: list[str] = []
    r = Reflector(core_client, path, lambda kind, obj, old: seen.append(kind), resume_from=old_rv,
                  watch_timeout_s=5)
    r.start()
    try:
        assert r.synced.wait(30)
        assert r.stats["gone"] >= 1 and r.stats["lists"] >= 1
        assert len(r.items()) == 3
        cluster.pod("p-late", scheduler="other-scheduler")
        wait_for(lambda: len(r.items()) == 4, what="watch after relist")
    finally:
        r.stop()


def test_apiserver_restart_mid_run(control_plane: ControlPlane, cluster: Cluster,
                                   core_client: KubeClient) -> None:
    for i in range(10):
        cluster.node(f"r-{i}", region="eu-west", cpu="8")
    down = threading.Event()
    at_stop: list[int] = []

    def stop_on_tenth(key: str, node: str) -> None:
        if len(actuator.stats.bound_pods) == 10 and not down.is_set():
            control_plane.stop_apiserver()  # in the binding path: the burst is mid-flight
            at_stop.append(actuator.stats.bound)
            down.set()

    go = threading.Event()
    # 8 bindings in flight (the default is 24): the API server stops on the 10th binding,
    # with the 120-pod burst still going
    actuator = build_actuator(core_client, NodeRegistry(),
                              ActuatorConfig(identity="test", bind_workers=8),
                              on_bound=stop_on_tenth,
                              is_leader=go.is_set)  # hold the burst back until all 120 exist
    actuator.start()
    assert actuator.wait_synced(30)
    try:
        restarted_mid_run(control_plane, cluster, actuator, go, down, at_stop)
    finally:
        actuator.stop()


def restarted_mid_run(control_plane: ControlPlane, cluster: Cluster, actuator: Actuator,
                      go: threading.Event, down: threading.Event, at_stop: list[int]) -> None:
    for i in range(120):
        cluster.pod(f"before-{i}")
    go.set()
    actuator.wake()
    assert down.wait(60)
    time.sleep(2.0)
    control_plane.start_apiserver()
    assert at_stop[0] < 120
    for i in range(40):
        cluster.pod(f"after-{i}")
    wait_for(lambda: len(bound(cluster)) == 160, timeout=120, what="all 160 bound")
    assert actuator.pods.stats["unavailable"] + actuator.stats.unavailable >= 1
    assert len(actuator.stats.bound_pods) == len(set(actuator.stats.bound_pods))
    sched = collections.Counter(e["involvedObject"]["name"] for e in cluster.events("Scheduled"))
    assert max(sched.values()) == 1


def test_region_label_change_alerts_and_replaces(cluster: Cluster, actuator: Actuator) -> None:
    """A node's protected region changes under two resident pods: both are alerted; the
    ReplicaSet's pod is evicted and its controller's replacement bound to the other eu-west
    node; the bare pod, which nothing would recreate, is left in place with a ``NotMoved``
    event (cfnet creates no pods: no ``pods create`` in its role)."""
    cluster.node("eu-1", region="eu-west")
    cluster.node("us-1", region="us-east")
    ns = cluster.namespace
    cluster.pod("resident", annotations={"cfnet.io/residency": "eu-west"})
    cluster.c.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rs"}}, "template": {
            "metadata": {"labels": {"app": "rs"},
                         "annotations": {"cfnet.io/residency": "eu-west"}},
            "spec": {"schedulerName": "cfnet-scheduler", "containers": [
                {"name": "app", "image": "registry.example/app:1",
                 "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}}]}}}})

    def rs_pods() -> dict[str, str | None]:
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.pods()
                if p["metadata"]["name"].startswith("rs-")
                and not p["metadata"].get("deletionTimestamp")}

    # 90 s: the first ReplicaSet of a fresh control plane waits for the controller manager
    wait_for(lambda: bound(cluster).get("resident") and any(rs_pods().values()), timeout=90,
             what="the bare pod and the ReplicaSet's pod bound")
    assert bound(cluster)["resident"] == "eu-1" and list(rs_pods().values()) == ["eu-1"]
    (moved,) = rs_pods()
    cluster.node("eu-2", region="eu-west")
    wait_for(lambda: actuator.registry.get("eu-2"), what="eu-2 in the registry")
    cluster.set_node_label("eu-1", RESIDENCY_REGION, "us-east")  # what residency reads

    alerts: list[dict[str, Any]] = actuator.alerts  # type: ignore[attr-defined]
    wait_for(lambda: len(alerts) >= 2, what="an alert per resident pod")
    assert {a["pod"] for a in alerts} == {f"{ns}/resident", f"{ns}/{moved}"}
    assert all(a["node"] == "eu-1" for a in alerts)
    assert any(c["key"] == RESIDENCY_REGION and c["old"] == "eu-west" and c["new"] == "us-east"
               for c in alerts[0]["changes"])
    ev = wait_for(lambda: cluster.events("ConstraintViolated"), what="alert event")
    assert "residency" in ev[0]["message"] and ev[0]["type"] == "Warning"
    assert {a["message"] for a in alerts} >= {ev[0]["message"]}  # what cfnet-core's events say

    new = wait_for(lambda: [n for p, n in rs_pods().items() if p != moved and n],
                   timeout=60, what="the ReplicaSet's replacement bound",
                   explain=cluster.describe)
    assert new == ["eu-2"]
    # moved by the loop's re-planner, in its words (same events and validator as any move)
    (ev,) = cluster.events("Rescheduling")
    assert ev["involvedObject"]["name"] == moved
    assert "from eu-1 to eu-2" in ev["message"] and "no longer fits" in ev["message"]
    kept = wait_for(lambda: [e for e in cluster.events("NotMoved")
                             if e["involvedObject"]["name"] == "resident"],
                    what="a NotMoved event on the bare pod")
    assert "no controller recreates it" in kept[0]["message"], kept[0]
    bare = cluster.c.get(f"/api/v1/namespaces/{ns}/pods/resident")
    assert bare["spec"]["nodeName"] == "eu-1" and not bare["metadata"].get("deletionTimestamp")
    assert not [p for p in cluster.pods()
                if (p["metadata"].get("annotations") or {}).get("cfnet.io/replaces")]


def test_a_move_a_dead_leader_left_unfinished_is_finished(cluster: Cluster,
                                                         actuator: Actuator) -> None:
    """A leader evicted a bare pod and created its copy, then died before binding it: the copy
    carries the move's plan (``cfnet.io/planned-node``, as ``Moves`` writes it),
    so the next leader (this actuator, which never saw the move) binds it there."""
    for n in ("pl-1", "pl-2", "pl-3"):
        cluster.node(n, region="eu-west")
    for target in ("pl-1", "pl-3"):
        cluster.pod(f"copy-{target}", annotations={
            "cfnet.io/replaces": f"{cluster.namespace}/orig-{target}",
            "cfnet.io/planned-node": target, "cfnet.io/planned-from": f"uid-{target}"})
    wait_for(lambda: len(bound(cluster)) == 2, what="both copies bound")
    assert bound(cluster) == {"copy-pl-1": "pl-1", "copy-pl-3": "pl-3"}
    # the Scheduled events are written after the bindings, off the binding path
    msgs = [e["message"] for e in events_at_least(cluster, "Scheduled", 2)]
    assert len(msgs) == 2 and all("where the move planned" in m for m in msgs), msgs


def test_primed_reflector_real_apiserver(cluster: Cluster, admin: KubeClient,
                                         core_client: KubeClient) -> None:
    """The primed start-up against the real API server: the bound pods (field selector
    ``spec.nodeName!=``) come in before any pending one, and the store ends equal to a plain
    list, over several pages."""
    path = f"/api/v1/namespaces/{cluster.namespace}/pods"
    for i in range(3):  # bound at creation (no node object needed for the API server)
        admin.create(path, {"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": f"bound-{i}"},
                            "spec": {"nodeName": f"somewhere-{i}", "containers": [
                                {"name": "app", "image": "registry.example/app:1"}]}})
    for i in range(12):
        cluster.pod(f"pending-{i}", scheduler="other-scheduler")
    order: list[str] = []
    ready_at: list[int] = []
    r = Reflector(core_client, path, lambda kind, obj, old: order.append(obj["metadata"]["name"]),
                  prime={"fieldSelector": "spec.nodeName!="}, page_size=5)

    def note_ready() -> None:
        if r.ready.wait(30):
            ready_at.append(len(order))

    t = threading.Thread(target=note_ready)
    t.start()
    r.start()
    try:
        assert r.synced.wait(30)
        t.join(5)
        assert sorted(order[:3]) == ["bound-0", "bound-1", "bound-2"]
        assert ready_at and ready_at[0] >= 3  # ready once the bound pods were in
        assert len(order) == 15  # the bound ones came once: the full list changed nothing
        assert {o["metadata"]["name"] for o in r.items()} == \
            {p["metadata"]["name"] for p in admin.list(path)[0]}
        cluster.pod("late", scheduler="other-scheduler")
        wait_for(lambda: len(r.items()) == 16, what="the watch after the paged list")
    finally:
        r.stop()


def test_first_lists_real_apiserver(cluster: Cluster, admin: KubeClient,
                                    core_client: KubeClient) -> None:
    """cfnet-core's early lists (``prefetch.FirstLists``, asked for before the engine is
    imported) against the real API server: the actuator's reflectors take all three (asked
    as they ask: path, page size, schema, query) and hold what a plain list holds."""
    path = f"/api/v1/namespaces/{cluster.namespace}/pods"
    admin.create(path, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bound-early"},
                        "spec": {"nodeName": "somewhere", "containers": [
                            {"name": "app", "image": "registry.example/app:1"}]}})
    cluster.pod("pending-early", scheduler="other-scheduler")
    first = FirstLists(core_client)
    act = build_actuator(core_client, NodeRegistry(), ActuatorConfig(identity="first-lists"),
                   is_leader=lambda: False, first=first)
    act.start()
    try:
        assert act.wait_synced(30), "the caches never synced from the early lists"
        taken = {n: lst._taken for n, lst in (("nodes", first.nodes), ("pods", first.pods),
                                              ("bound pods", first.bound_pods))}
        assert all(taken.values()), f"early lists not taken: {taken}"
        assert {"bound-early", "pending-early"} <= {o["metadata"]["name"]
                                                    for o in act.pods.items()}
        assert {o["metadata"]["name"] for o in act.nodes.items()} == \
            {n["metadata"]["name"] for n in admin.list("/api/v1/nodes")[0]}
        cluster.pod("after-early", scheduler="other-scheduler")
        wait_for(lambda: any(o["metadata"]["name"] == "after-early" for o in act.pods.items()),
                 what="the watch after the early list")
    finally:
        act.stop()


def _lean(obj: dict[str, Any], status: tuple[str, ...], whole: bool) -> dict[str, Any]:
    """``obj`` (as the generic decoder gives it) as objects.py should: no managedFields,
    status cut to ``status``, and unless ``whole`` the spec cut to OtherSpec's fields."""
    out = dict(obj, metadata={k: v for k, v in obj["metadata"].items() if k != "managedFields"},
               status={k: v for k, v in (obj.get("status") or {}).items() if k in status})
    if not whole:
        spec = {k: v for k, v in obj["spec"].items() if k in objects.OtherSpec.__annotations__}
        for part in ("containers", "initContainers"):
            if part in spec:
                spec[part] = [{k: v for k, v in c.items() if k in objects.Container.__annotations__}
                              for c in spec[part]]
        out["spec"] = spec
    return out


def test_lean_schemas_real_apiserver(cluster: Cluster, admin: KubeClient) -> None:
    """The lean Pod/Node decoding (objects.py) on the real API server's answers, lists and
    watch events: what cfnet reads comes through as the generic decoder gives it; a cfnet
    pod keeps its whole spec (an unsupported volume is still refused by name), another
    scheduler's pod only what its node counts (the same usage)."""
    from cloud_core.errors import SpecError
    from cloud_core.placement.spec import usage_workload

    cluster.node("lean-n1", region="eu", kubeedge_group="g1")  # kwok's, with a taint
    path = f"/api/v1/namespaces/{cluster.namespace}/pods"
    schema = objects.PodSchema(frozenset({"cfnet-scheduler"}))
    spec_extra = {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}],
                  "tolerations": [{"key": "k", "operator": "Exists"}]}
    for name, sched, node in (("mine", "cfnet-scheduler", None),
                              ("theirs", "other-scheduler", "somewhere")):
        spec: dict[str, Any] = {
            "schedulerName": sched, **spec_extra,
            "containers": [{"name": "app", "image": "registry.example/app:1",
                            "ports": [{"containerPort": 80, "hostPort": 8080}],
                            "env": [{"name": "A", "value": "b"}],
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
        if node:
            spec["nodeName"] = node
        admin.create(path, {"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": name, "labels": {"app": name}}, "spec": spec})
    full = {o["metadata"]["name"]: o for o in admin.list(path)[0]}
    lean = {o["metadata"]["name"]: o for o in admin.list(path, schema=schema)[0]}
    assert full["mine"]["metadata"].get("managedFields"), "the API server sent no managedFields"
    assert lean["mine"] == _lean(full["mine"], ("phase",), whole=True)
    assert lean["theirs"] == _lean(full["theirs"], ("phase",), whole=False)
    assert "volumes" not in lean["theirs"]["spec"]
    assert usage_workload(lean["theirs"]) == usage_workload(full["theirs"])
    with pytest.raises(SpecError, match=r"spec\.volumes\[0\]\.persistentVolumeClaim"):
        parse_pod(lean["mine"])
    # watch events: the same decoding, and the watch's own resourceVersion kept
    rv = admin.list(path)[1]
    got: list[tuple[str, dict[str, Any]]] = []
    stop = threading.Event()

    def watch() -> None:
        for kind, obj in admin.watch(path, rv, timeout_s=10, stop=stop, schema=schema):
            if kind != "BOOKMARK":
                got.append((kind, obj))
                stop.set()

    t = threading.Thread(target=watch)
    t.start()
    try:
        admin.patch(f"{path}/theirs", {"metadata": {"labels": {"v": "2"}}})
        wait_for(lambda: got, what="the MODIFIED event of pod theirs")
    finally:
        stop.set()
        t.join(20)
    kind, obj = got[0]
    assert kind == "MODIFIED" and obj["metadata"]["labels"] == {"app": "theirs", "v": "2"}
    assert obj == _lean(admin.get(f"{path}/theirs"), ("phase",), whole=False) | {
        "apiVersion": "v1", "kind": "Pod"}
    # nodes (kwok's): labels, taints, capacity, conditions as listed; images and the rest not
    nodes_full = {o["metadata"]["name"]: o for o in admin.list("/api/v1/nodes")[0]}
    nodes_lean = admin.list("/api/v1/nodes", schema=objects.NODE)[0]
    assert "lean-n1" in {n["metadata"]["name"] for n in nodes_lean}
    compared = 0
    for n in nodes_lean:
        f = nodes_full.get(n["metadata"]["name"])
        if f and f["metadata"]["resourceVersion"] == n["metadata"]["resourceVersion"]:
            assert n == _lean(f, ("capacity", "allocatable", "conditions"), whole=True)
            compared += 1  # (a node kwok updated between the two lists is skipped)
    assert compared, "every node changed between the two lists"


def test_snapshot_follows_pod_versions(cluster: Cluster, admin: KubeClient,
                                       actuator: Actuator) -> None:
    """The snapshot keeps a bound pod's parsed form per resourceVersion: a label change is
    seen (pod affinity counts labels), a finished pod stops counting, a deleted one is gone."""
    cluster.node("v-0", region="eu-west", cpu="4")
    cluster.pod("web", labels={"app": "web", "tier": "a"})
    wait_for(lambda: bound(cluster).get("web") == "v-0", what="web bound")

    def seen() -> dict[str, Any] | None:
        snap = actuator.snapshot()
        mine = [p for p in snap.pods if p.name == "web"]
        return {"labels": dict(mine[0].labels), "alloc": snap.nodes[0].allocated.cpu_milli} \
            if mine else None

    wait_for(lambda: (seen() or {}).get("labels") == {"app": "web", "tier": "a"},
             what="web in the snapshot")
    assert (seen() or {})["alloc"] == 250
    path = f"/api/v1/namespaces/{cluster.namespace}/pods/web"
    admin.patch(path, {"metadata": {"labels": {"tier": "b"}}})
    wait_for(lambda: (seen() or {}).get("labels") == {"app": "web", "tier": "b"},
             what="the new labels")
    # The pod finishes, written here: kwok completes Job pods only, and at once, before a test
    # could look at them; this one must finish at a moment the test picks. Only once kwok has
    # made it Running: kwok's pod-ready stage patches the status of a Pending pod without a
    # resourceVersion, so a write before that lands would be overwritten with Running.
    pod = wait_for(lambda: (p := admin.get(path))["status"].get("phase") == "Running" and p,
                   what="kwok running web")
    pod["status"] = {"phase": "Succeeded"}
    admin.replace(f"{path}/status", pod)
    wait_for(lambda: seen() is None, what="a finished pod no longer counts")
    assert actuator.snapshot().nodes[0].allocated.cpu_milli == 0
    admin.delete(path, grace_period_s=0)
    wait_for(lambda: not [p for p in actuator.pods.items()
                          if p["metadata"]["name"] == "web"], what="web deleted")
    assert not actuator.cache.is_bound(f"{cluster.namespace}/web")
