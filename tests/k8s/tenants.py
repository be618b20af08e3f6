"""Tenants, the running core and the canary, shared by the shared-cluster tests
(tests/k8s/test_tenancy.py, test_rbac.py, test_evictions.py, test_node_facts.py).

* ``Tenant``: a namespace and a ServiceAccount holding ``admin`` there and nowhere else, a
  real RBAC identity (its own token, the API server's authorizer);
* ``running_core``: the core as ``cfnet-core --kubernetes`` runs it (``start_kubernetes``:
  leader election, actuator, pool controller) under the identity given (the chart's
  ServiceAccount in these tests). The core runs in this process; while it runs, the process'
  resident memory is sampled, and on a clean exit its growth must stay within what the chart
  leaves the core above its request (``core.resources``: limit minus request): past that the
  shipped core, which starts within its request, would be killed by its limit;
* ``bound_within``: a canary pod in another namespace (the ``cluster`` fixture's), bound
  within 10 s while the tenant does its worst.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import yaml

from cloud_core.errors import KubeError
from cloud_core.events import EventLog
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.wiring import KubeRunner, KubeSettings, start_kubernetes
from cloud_core.placement.spec_values import parse_quantity
from cloud_core.state import ClusterState
from tests.k8s.conftest import Cluster, wait_for
from tools.envtest import ControlPlane
from tools.helm import CHART

CANARY_S = 10.0
MIB = 1 << 20


class Tenant:
    """A namespace and a ServiceAccount with ``admin`` there (and nowhere else)."""

    def __init__(self, cp: ControlPlane, admin: KubeClient) -> None:
        self.admin = admin
        self.ns = f"tenant-{uuid.uuid4().hex[:6]}"
        admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": self.ns}})
        token = cp.service_account_token(self.ns, "tenant")
        # ``admin`` is an aggregated ClusterRole: its rules are the union of these three
        # bootstrap roles, which kube-controller-manager's clusterrole-aggregation controller
        # copies into it (not run here); binding them is binding what ``admin`` grants
        for part in ("admin", "edit", "view"):
            admin.create(
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{self.ns}/rolebindings", {
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": f"tenant-{part}", "namespace": self.ns},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                "kind": "ClusterRole", "name": f"system:aggregate-to-{part}"},
                    "subjects": [{"kind": "ServiceAccount", "name": "tenant",
                                  "namespace": self.ns}]})
        assert cp.admin is not None
        self.c = KubeClient.from_token(cp.admin.host, token, cp.admin.ca_file)
        wait_for(lambda: self._can_list(), timeout=30, what="the tenant's RoleBinding in force")
        wait_for(lambda: admin.get(f"/api/v1/namespaces/{self.ns}/serviceaccounts/default"),
                 timeout=120, every=0.2, what="the tenant namespace's default ServiceAccount")

    def _can_list(self) -> bool:
        try:
            self.c.list(f"/api/v1/namespaces/{self.ns}/pods")
            return True
        except KubeError:
            return False

    def pod(self, name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
        """A pod of the tenant's (``annotations``, ``labels``, ``ownerReferences``: its
        metadata; the rest: its spec)."""
        meta = {k: spec.pop(k) for k in ("annotations", "labels", "ownerReferences")
                if k in spec}
        return self.c.create(f"/api/v1/namespaces/{self.ns}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns, **meta},
            "spec": {"schedulerName": "cfnet-scheduler", "containers": containers, **spec}})

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        evs = self.admin.list(f"/api/v1/namespaces/{self.ns}/events")[0]
        return [e for e in evs if reason is None or e.get("reason") == reason]

    def close(self) -> None:
        self.c.close()
        with contextlib.suppress(KubeError):
            self.admin.delete(f"/api/v1/namespaces/{self.ns}")


def rss_bytes() -> int:
    """This process' resident memory (VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def core_headroom_bytes() -> int:
    """What the chart lets the core grow by above its memory request before its limit."""
    res = yaml.safe_load((CHART / "values.yaml").read_text())["core"]["resources"]
    limit = parse_quantity(res["limits"]["memory"], "core.resources.limits.memory", "mem")
    request = parse_quantity(res["requests"]["memory"], "core.resources.requests.memory",
                             "mem")
    return limit - request


class PeakRss:
    """Samples this process' RSS every 50 ms in a thread: the peak since ``start``."""

    def __init__(self) -> None:
        self.start = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="peak-rss", daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, rss_bytes())

    def stop(self) -> int:
        """Stop sampling; the growth (peak minus start) in bytes."""
        self._stop.set()
        self._t.join(5)
        self.peak = max(self.peak, rss_bytes())
        return self.peak - self.start


@contextlib.contextmanager
def running_core(client: KubeClient, ident: str, **settings: Any) -> Iterator[KubeRunner]:
    """The core as ``cfnet-core --kubernetes`` runs it, under ``client``'s identity
    (``settings``: more ``KubeSettings``); its memory growth checked on a clean exit."""
    mem = PeakRss()
    runner = start_kubernetes(client, ClusterState(), EventLog(), KubeSettings(
        identity=ident, lease_duration_s=4, renew_deadline_s=3, retry_period_s=1, **settings))
    ok = False
    try:
        wait_for(runner.elector.is_leader, timeout=30, what=f"{ident} leading")
        wait_for(lambda: runner.actuator.wait_ready(0.1), timeout=30, what="caches ready")
        yield runner
        ok = True
    finally:
        runner.stop()
        grown = mem.stop()
        if ok:  # a failure inside is the error to see
            bound = core_headroom_bytes()
            assert grown <= bound, (
                f"the core grew by {grown / MIB:.0f} MiB while it ran (from "
                f"{mem.start / MIB:.0f} MiB), more than the chart's limit leaves above its "
                f"request ({bound / MIB:.0f} MiB)")


def bound_within(cluster: Cluster, name: str, timeout: float = CANARY_S) -> str:
    """Create canary pod ``name`` in the cluster fixture's namespace; its node, once bound."""
    t0 = time.monotonic()
    cluster.pod(name, cpu="100m", memory="64Mi")
    path = f"/api/v1/namespaces/{cluster.namespace}/pods/{name}"
    node: str = wait_for(lambda: cluster.c.get(path)["spec"].get("nodeName"),
                         timeout=timeout - (time.monotonic() - t0), every=0.05,
                         what=f"canary {name} bound within {timeout:g} s",
                         explain=cluster.describe)
    return node
