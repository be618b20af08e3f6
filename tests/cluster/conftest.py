"""Fixtures for the tests on a cluster where pods run: one per session.

``real_cluster``: a control plane (etcd, kube-apiserver with the Node authorizer and
NodeRestriction, kube-controller-manager with the node-lifecycle and EndpointSlice
controllers, kube-scheduler), one real node (containerd, kubelet, kube-proxy, CoreDNS in a
network namespace of its own: ``tools/envtest/node.py``) and kwok for simulated nodes
(``tools/envtest/kwok.py``). The binaries are built on first use (tools/envtest/build.sh,
progress on stderr), before any test runs, so the compile does not count against a test's
timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.envbuild import CLUSTER
from tools.envtest import ControlPlane, EnvtestError
from tools.envtest.kwok import Kwok
from tools.envtest.node import RealNode


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run this directory's tests that start a node of their own first (the test cluster's
    binaries are built as tests/envbuild.py says)."""
    # A RealNode is named after this process (cfk-<pid>: netns, temp dir, cgroups), so a test
    # that starts its own (test_node_runtime.py) would clean the session's node away, and
    # counts the session's containers as its leftovers: those tests run before the session's
    # node exists, whatever the file names' order (the other items keep their places).
    here = [n for n, i in enumerate(items) if "tests/cluster/" in str(i.path)]
    ordered = sorted((items[n] for n in here),
                     key=lambda i: "real_cluster" in getattr(i, "fixturenames", ()))
    for n, item in zip(here, ordered, strict=True):
        items[n] = item


@dataclass
class RealCluster:
    cp: ControlPlane
    node: RealNode
    kwok: Kwok

    def wait(self, pred: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll ``pred`` (bounded); on timeout fail with the kubelet's and containerd's
        log tails."""
        import time
        import urllib.error

        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = pred()
            except (OSError, urllib.error.URLError) as e:
                last = e
            else:
                if last:
                    return last
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} "
                             f"(last: {last!r})\n{self.node.logs()}")


    def set_node_label(self, node: str, key: str, value: str | None) -> None:
        """Set (or, with None, remove) one label of a Node: read-modify-write, retried on
        a conflict (the kubelet or kwok writes the node's status meanwhile)."""
        import urllib.error

        for _ in range(5):
            obj = self.cp.request("GET", f"/api/v1/nodes/{node}")
            labels = obj["metadata"].setdefault("labels", {})
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
            try:
                self.cp.request("PUT", f"/api/v1/nodes/{node}", obj)
                return
            except urllib.error.HTTPError as e:
                if e.code != 409:
                    raise
        raise AssertionError(f"could not label {node} {key}={value}: conflicts")


@pytest.fixture(scope="session")
def cluster_binaries(request: pytest.FixtureRequest) -> None:
    """The test cluster's binaries, built before the test (for a test that starts a cluster
    in a process of its own, as the demo does)."""
    CLUSTER.check()


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    CLUSTER.check()
    # The node's address in the API server's certificate too: a device outside the
    # cluster network reaches the API server there (test_helm_install's edge agent).
    cp = ControlPlane(advertise_address=RealNode.host_address(), real_nodes=True,
                      extra_sans=(RealNode.node_address(),))
    try:
        cp.start()
        node = RealNode(cp)
        node.start()
    except EnvtestError as e:
        cp.stop()
        pytest.fail(f"cannot start the test cluster: {e}", pytrace=False)
    kwok = Kwok(cp)
    try:
        kwok.start()
        yield RealCluster(cp, node, kwok)
    finally:
        kwok.stop()
        node.stop()
        cp.stop()
