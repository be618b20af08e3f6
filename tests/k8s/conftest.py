"""Fixtures for the Kubernetes tests: one real control plane per session.

etcd, kube-apiserver (ServiceAccount admission on) and kube-controller-manager (Deployments,
ReplicaSets, StatefulSets, Jobs, garbage collection, disruption budgets; see
``tools.envtest.ControlPlane.CONTROLLERS``), and kwok (``tools/envtest/kwok.py``, started once
per session) for the nodes: a Node a test makes with ``Cluster.node`` or ``make_node`` is a kwok
node, so kwok posts its Ready status and heartbeats, runs the pods bound to it (Pending ->
Running/Ready), completes Job pods and finishes terminating pods, as kubelets do. There is no
real kubelet here (tests/cluster has one). The few tests that still write a node's or a pod's
status themselves do so where kwok cannot serve, and say why.

The node-lifecycle controller stays off here (``ControlPlane.CONTROLLERS``): tests set a Node's
Ready condition at a moment of their choosing, and that controller would taint and evict on a
schedule of its own. ``make_node`` therefore plays its one part new nodes need, clearing the
``node.kubernetes.io/not-ready`` taint that admission puts on every new Node.

The CRDs installed are the frameworks' own, unmodified (``upstream-crds/``, see its
SOURCES.md): OpenYurt v1.7.0 NodePool/YurtAppSet and KubeEdge v1.23.1 EdgeApplication/NodeGroup.
The OpenYurt ones declare a conversion webhook (yurt-manager) that does not run here; the API
server accepts the CRDs as they are, and requests at their storage versions (NodePool v1beta2,
YurtAppSet v1beta1, the versions cfnet uses) need no conversion, so nothing is stripped or
patched.

The binaries (and kwok) are built from the Go module proxy on first use
(tools/envtest/build.sh, progress on stderr; cached under ``$CFNET_CACHE/envtest``). A failed
build fails the tests with the build's own output; nothing here is a fake.
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from cloud_core.console.commands import COMMANDS
from cloud_core.console.context import ConsoleContext
from cloud_core.console.service import ConsoleService
from cloud_core.errors import KubeError, KubeNotFound
from cloud_core.events import EventLog
from cloud_core.ingest import Ingest
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.console import KubernetesCluster
from cloud_core.k8s.registry import RESIDENCY_REGION, SECURITY
from cloud_core.state import ClusterState
from tests.envbuild import CONTROL_PLANE
from tools.envtest import ControlPlane, EnvtestError
from tools.envtest.kwok import ANNOTATION as KWOK_ANNOTATION
from tools.envtest.kwok import Kwok

if TYPE_CHECKING:
    from collections.abc import Mapping

    from cloud_core.k8s.actuator import Actuator
    from tests.k8s.tenants import Tenant

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "k8s"
UPSTREAM_CRDS = Path(__file__).resolve().parent / "upstream-crds"
CRD_NAMES = ("nodepools.apps.openyurt.io", "yurtappsets.apps.openyurt.io",
             "edgeapplications.apps.kubeedge.io", "nodegroups.apps.kubeedge.io")


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, every: float = 0.1,
             what: str = "condition", explain: Callable[[], str] | None = None) -> Any:
    """Poll ``pred`` until it returns something truthy (bounded in time). On a timeout the
    error carries ``explain()`` too (e.g. ``Cluster.describe``): what the cluster looked
    like, so that a failure on a loaded CI machine says which step did not happen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except KubeError as e:
            last = e
        else:
            if last:
                return last
        time.sleep(every)
    detail = ""
    if explain is not None:
        try:
            detail = "\n" + explain()
        except Exception as e:  # the timeout is the error; this only helps to read it
            detail = f"\n(no description: {e!r})"
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})"
                         f"{detail}")


def kubernetes_console(actuator: Actuator, client: KubeClient, events: EventLog | None = None,
                       agent_probes: Callable[[], Mapping[str, str]] | None = None
                       ) -> ConsoleService:
    """The console as ``cfnet-core --kubernetes`` serves it, its cluster commands answered by
    the cluster, for operator ``op`` (the core's telemetry here: none, so no links)."""
    events = events or EventLog(lambda ev: None)
    state = ClusterState()
    cluster = KubernetesCluster(actuator, client, events, agent_probes=agent_probes)
    return ConsoleService({"op": "operator"}.get,
                          ConsoleContext(cluster, state, Ingest(state), events),
                          commands=COMMANDS)


def load_manifests(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _established(admin: KubeClient, crd: str) -> bool:
    obj = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    CONTROL_PLANE.check()
    try:
        cp = ControlPlane()
        cp.start()
    except EnvtestError as e:
        pytest.fail(f"cannot run the Kubernetes control plane: {e}", pytrace=False)
    try:
        admin = KubeClient.from_kubeconfig(str(cp.kubeconfig))
        for crd in sorted(UPSTREAM_CRDS.glob("*/*.yaml")):
            for obj in load_manifests(crd):
                admin.apply(obj)
        for name in CRD_NAMES:
            wait_for(functools.partial(_established, admin, name),
                     what=f"CRD {name} established")
        admin.close()
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kwok(control_plane: ControlPlane) -> Iterator[Kwok]:
    """kwok on the session's control plane: the kubelets of every node the tests make."""
    k = Kwok(control_plane)
    try:
        k.start()
    except EnvtestError as e:
        k.stop()
        pytest.fail(f"cannot run kwok: {e}", pytrace=False)
    try:
        yield k
    finally:
        k.stop()


def _node_ready(c: KubeClient, name: str) -> bool:
    conds = (c.get(f"/api/v1/nodes/{name}").get("status") or {}).get("conditions") or []
    return any(x.get("type") == "Ready" and x.get("status") == "True" for x in conds)


def make_node(c: KubeClient, name: str, labels: dict[str, str], *,
              capacity: dict[str, str], taints: list[dict[str, str]] | None = None,
              simulated: bool = True) -> dict[str, Any]:
    """Create a Node and return it once it is Ready and carries exactly ``taints``.

    ``simulated`` (the default): a kwok node (needs the ``kwok`` fixture; ``admin`` pulls it
    in); kwok initialises its status from the capacity written here, keeps it Ready and runs
    its pods. ``simulated=False``: nobody manages the node; its Ready condition is written
    here, once, for the tests that then change it by hand (kwok would set it back).
    """
    status: dict[str, Any] = {"capacity": dict(capacity), "allocatable": dict(capacity)}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if simulated:
        meta["annotations"] = {KWOK_ANNOTATION: "fake"}
    else:
        status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                 "message": "written by the test (no kwok)"}]
    obj = c.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": meta,
                                     "spec": {"taints": taints} if taints else {},
                                     "status": status})
    if simulated:
        wait_for(functools.partial(_node_ready, c, name), timeout=30, every=0.02,
                 what=f"kwok making node {name} Ready")
    elif not (obj.get("status") or {}).get("allocatable"):
        obj["status"] = status
        obj = c.replace(f"/api/v1/nodes/{name}/status", obj)
    if (obj.get("spec") or {}).get("taints") != (taints or None):
        # The TaintNodesByCondition admission added node.kubernetes.io/not-ready; the
        # node-lifecycle controller (off here: see the module docstring) would clear it now
        # that the node is Ready.
        obj = c.patch(f"/api/v1/nodes/{name}", [
            {"op": "replace", "path": "/spec/taints", "value": taints or []}],
            content_type="application/json-patch+json")
    return obj


@pytest.fixture
def admin(control_plane: ControlPlane, kwok: Kwok) -> Iterator[KubeClient]:
    c = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    yield c
    c.close()


class Cluster:
    """Test helpers that create Nodes and Pods (as the admin) and clean up after a test."""

    def __init__(self, client: KubeClient) -> None:
        self.c = client
        self.namespace = f"t-{uuid.uuid4().hex[:8]}"
        self.nodes: list[str] = []
        self.c.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": self.namespace}})
        # The ServiceAccount admission plugin refuses pods until kube-controller-manager has
        # made the namespace's "default" account (ControlPlane.start_apiserver restarts the
        # controller manager with the API server, so this is its normal reaction time).
        wait_for(lambda: self.c.get(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/"
                                    "default"), timeout=120, every=0.2,
                 what="default ServiceAccount")

    def node(self, name: str, *, region: str, zone: str = "", security: int = 1,
             kubeedge_group: str | None = None, openyurt_pool: str | None = None,
             cpu: str = "4", memory: str = "8Gi", labels: dict[str, str] | None = None,
             edge_taint: bool = True, simulated: bool = True) -> dict[str, Any]:
        """A kwok node (``simulated=False``: one nobody manages; see ``make_node``)."""
        # region twice: the topology label (spread, affinity) and the protected one residency
        # reads; the level only protected (cloud_core.k8s.registry: what a node cannot set)
        lab = {"kubernetes.io/hostname": name, "topology.kubernetes.io/region": region,
               "topology.kubernetes.io/zone": zone or f"{region}-a",
               RESIDENCY_REGION: region, SECURITY: str(security), **(labels or {})}
        taints = []
        if kubeedge_group is not None:
            lab["node-role.kubernetes.io/edge"] = ""
            lab["apps.kubeedge.io/belonging-to"] = kubeedge_group
            if edge_taint:
                taints.append({"key": "node-role.kubernetes.io/edge", "effect": "NoSchedule"})
        if openyurt_pool is not None:
            lab["apps.openyurt.io/nodepool"] = openyurt_pool
        self.nodes.append(name)
        return make_node(self.c, name, lab, capacity={"cpu": cpu, "memory": memory,
                                                      "pods": "110"},
                         taints=taints, simulated=simulated)

    def pod(self, name: str, *, cpu: str = "250m", memory: str = "256Mi",
            annotations: dict[str, str] | None = None, node_selector: dict[str, str] | None = None,
            tolerate_edge: bool = False, labels: dict[str, str] | None = None,
            scheduler: str = "cfnet-scheduler") -> dict[str, Any]:
        spec: dict[str, Any] = {
            "schedulerName": scheduler,
            "containers": [{"name": "app", "image": "registry.example/app:1",
                            "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        }
        if node_selector:
            spec["nodeSelector"] = node_selector
        if tolerate_edge:
            spec["tolerations"] = [{"key": "node-role.kubernetes.io/edge", "operator": "Exists",
                                    "effect": "NoSchedule"}]
        return self.c.create(f"/api/v1/namespaces/{self.namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": labels or {"app": name},
                         "annotations": annotations or {}},
            "spec": spec})

    def pods(self) -> list[dict[str, Any]]:
        return self.c.list(f"/api/v1/namespaces/{self.namespace}/pods")[0]

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        evs = self.c.list(f"/api/v1/namespaces/{self.namespace}/events")[0]
        return [e for e in evs if reason is None or e.get("reason") == reason]

    def describe(self) -> str:
        """The namespace's pods (node, phase, deletion) and its events, oldest first: the
        text a timed-out wait adds to its error."""
        lines = ["pods:"]
        for p in self.pods():
            m, st = p["metadata"], p.get("status") or {}
            lines.append(f"  {m['name']}: node={p['spec'].get('nodeName')} "
                         f"phase={st.get('phase')} deleting={bool(m.get('deletionTimestamp'))}")
        lines.append("events:")
        evs = sorted(self.events(), key=lambda e: e.get("lastTimestamp") or e.get("eventTime")
                     or "")
        for e in evs[-40:]:
            lines.append(f"  {e.get('lastTimestamp') or e.get('eventTime')} {e.get('reason')} "
                         f"{e['involvedObject'].get('name')}: {(e.get('message') or '')[:160]}")
        return "\n".join(lines)

    def set_node_label(self, name: str, key: str, value: str) -> None:
        self.c.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {key: value}}})

    def cleanup(self) -> None:
        for n in self.nodes:
            with contextlib.suppress(KubeNotFound):
                self.c.delete(f"/api/v1/nodes/{n}")
        for p in self.pods():
            with contextlib.suppress(KubeNotFound):
                self.c.delete(f"/api/v1/namespaces/{self.namespace}/pods/"
                              f"{p['metadata']['name']}", grace_period_s=0)
        with contextlib.suppress(KubeError):
            self.c.delete(f"/api/v1/namespaces/{self.namespace}")


@pytest.fixture
def cluster(admin: KubeClient) -> Iterator[Cluster]:
    c = Cluster(admin)
    yield c
    c.cleanup()


@pytest.fixture
def tenant(control_plane: ControlPlane, admin: KubeClient) -> Iterator[Tenant]:
    """A tenant: a namespace and a ServiceAccount with ``admin`` there only
    (tests/k8s/tenants.py)."""
    from tests.k8s.tenants import Tenant  # that module uses this one's Cluster and wait_for

    t = Tenant(control_plane, admin)
    yield t
    t.close()


@pytest.fixture(scope="session")
def service_account_client(control_plane: ControlPlane) -> Iterator[KubeClient]:
    """A client holding a token of deploy/k8s's ServiceAccount, with the RBAC as written."""
    admin = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    for f in ("namespace.yaml", "rbac.yaml"):
        for obj in load_manifests(DEPLOY / f):
            admin.apply(obj)
    admin.close()
    token = control_plane.service_account_token("cfnet-system", "cfnet-core", create=False)
    assert control_plane.admin is not None
    c = KubeClient.from_token(control_plane.admin.host, token, control_plane.admin.ca_file)
    yield c
    c.close()


@pytest.fixture(params=["admin", "serviceaccount"])
def core_client(request: pytest.FixtureRequest, control_plane: ControlPlane) -> KubeClient:
    """The identity the core runs as: cluster admin, and deploy/k8s's least-privilege role."""
    if request.param == "admin":
        c = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
        request.addfinalizer(c.close)
        return c
    sa: KubeClient = request.getfixturevalue("service_account_client")
    return sa
