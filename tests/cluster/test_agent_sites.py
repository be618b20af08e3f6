"""The chart's agent DaemonSets per edge site on the test cluster's real DaemonSet
controller: which nodes get which agent.

The chart (``nats.leaf.sites``, templates/agent-daemonset.yaml) renders ``cfnet-agent`` for
the nodes in no site and ``cfnet-agent-<site>`` for each site's nodes (label
``nats.leaf.siteLabel`` = the site's ``labelValue``). Here its DaemonSets, as helm renders
them, are created on kwok nodes and kube-controller-manager's DaemonSet controller places
their pods: each node gets exactly one agent, the one of its site (or the cloud one), and
moving a node into or out of a site by its label moves its agent. The agents' pods are on
kwok nodes (simulated kubelets): the placement is the controller's decision, which is what
is checked; the leaf pods and an agent reporting through one on the real node are not
(tests/cluster/test_helm_nats.py runs those).
"""

from __future__ import annotations

import contextlib
import time
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cluster.conftest import RealCluster
from tools import helm as chart
from tools.helm import documents, template

pytestmark = pytest.mark.timeout(300)
LABEL = "node-restriction.kubernetes.io/cfnet-site"


@pytest.fixture
def site_nodes(real_cluster: RealCluster) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(namespace, the test's node label, {role: node name}): four kwok nodes, one in no
    site, two in siteA, one in site Plant7 (label value plant-7)."""
    rc = real_cluster
    uid = uuid.uuid4().hex[:6]
    ns, mark = f"sites-{uid}", f"cfnet-test-sites-{uid}"
    names = {role: f"cfk-sites-{uid}-{role}" for role in ("plain", "a1", "a2", "b")}
    sites = {"plain": {}, "a1": {LABEL: "siteA"}, "a2": {LABEL: "siteA"},
             "b": {LABEL: "plant-7"}}
    try:
        rc.cp.ensure_namespace(ns)
        for role, name in names.items():
            rc.kwok.node(name, labels={mark: "yes", **sites[role]})
        yield ns, mark, names
    finally:
        for path in (f"/api/v1/namespaces/{ns}",
                     *(f"/api/v1/nodes/{n}" for n in names.values())):
            with contextlib.suppress(OSError, urllib.error.URLError):
                rc.cp.request("DELETE", path)


def _wait(rc: RealCluster, pred: Callable[[], Any], timeout: float, what: str,
          show: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; "
                         f"agents now: {show()}\n{rc.kwok.tail(1500)}")


def _target(pod: dict[str, Any]) -> str:
    """The node a DaemonSet pod is for: its nodeName once bound, else the controller's
    matchFields metadata.name term."""
    if pod["spec"].get("nodeName"):
        return str(pod["spec"]["nodeName"])
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return str(terms[0]["matchFields"][0]["values"][0])


def _set_label(rc: RealCluster, node: str, value: str | None) -> None:
    rc.set_node_label(node, LABEL, value)


def test_each_node_runs_its_sites_agent_and_moves_with_its_label(
        real_cluster: RealCluster, site_nodes: tuple[str, str, dict[str, str]]) -> None:
    rc = real_cluster
    ns, mark, n = site_nodes
    values = ["nats.mode=external", "nats.external.mqttHost=nats.msg.svc",
              "nats.external.urls=tls://nats.msg.svc:4222", "nats.leaf.enabled=true",
              # only this test's nodes (the session's real node and other kwok nodes: not)
              f"agent.nodeSelector.{mark}=yes",
              "nats.leaf.sites[0].name=siteA", "nats.leaf.sites[0].address=10.1.0.5",
              "nats.leaf.sites[0].nodeSelector.kubernetes\\.io/hostname=" + n["a1"],
              "nats.leaf.sites[1].name=Plant7", "nats.leaf.sites[1].address=10.1.0.6",
              "nats.leaf.sites[1].nodeSelector.kubernetes\\.io/hostname=" + n["b"],
              "nats.leaf.sites[1].labelValue=plant-7"]
    chart.ensure_helm()
    ds = [d for d in documents(template(values=values, namespace=ns))
          if d["kind"] == "DaemonSet"]
    assert {d["metadata"]["name"] for d in ds} == {
        "cfnet-agent", "cfnet-agent-sitea", "cfnet-agent-plant7"}
    for d in ds:
        rc.cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/daemonsets", d)

    def agents() -> dict[str, list[str]]:
        """node -> the DaemonSets that have a live pod for it."""
        out: dict[str, list[str]] = {}
        for p in rc.cp.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]:
            if p["metadata"].get("deletionTimestamp"):
                continue
            owner = p["metadata"]["ownerReferences"][0]["name"]
            out.setdefault(_target(p), []).append(owner)
        return {k: sorted(v) for k, v in out.items()}

    def placed(want: dict[str, list[str]]) -> Callable[[], bool]:
        return lambda: agents() == want

    want = {n["plain"]: ["cfnet-agent"], n["a1"]: ["cfnet-agent-sitea"],
            n["a2"]: ["cfnet-agent-sitea"], n["b"]: ["cfnet-agent-plant7"]}
    _wait(rc, placed(want), 60, f"one agent per node, its site's: {want}", agents)
    # A node taken out of its site runs the cloud agent instead (the controller deletes the
    # site's pod and creates the cloud one); one put into a site, the site's.
    _set_label(rc, n["a2"], None)
    _set_label(rc, n["plain"], "siteA")
    want = {n["plain"]: ["cfnet-agent-sitea"], n["a1"]: ["cfnet-agent-sitea"],
            n["a2"]: ["cfnet-agent"], n["b"]: ["cfnet-agent-plant7"]}
    _wait(rc, placed(want), 60, f"the agents to follow the relabelled nodes: {want}", agents)
    # A label value of no site: neither a site's agent nor (NotIn matches it) kept off the
    # cloud one.
    _set_label(rc, n["b"], "elsewhere")
    want[n["b"]] = ["cfnet-agent"]
    _wait(rc, placed(want), 60, f"{n['b']} (no known site) on the cloud agent", agents)
