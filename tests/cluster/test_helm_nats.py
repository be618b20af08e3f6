"""`helm install` of the chart's clustered bus with an edge site, on the test cluster's real
node: ``nats.mode=deploy`` and one ``nats.leaf.sites`` entry whose leaf runs on the node.

The image is the local ``cfnet-nats`` (``tools/images.sh build nats``: the nats-server that
tools/nats/build.sh builds from the Go module proxy, on the images' Debian base), imported
into the node's containerd; the Secrets are what docs/install.md says to make (the broker
certificate of ``tools.certs`` with the hub's and the site's names, ``tools.nats.cluster
accounts``, ``tools.nats.leaf remote``). Checked on the running pods: the hub's pod and the
site's leaf pod are Running and Ready, and the leaf's uplink is connected to the hub (the
leaf's own monitoring endpoint, ``/leafz``, on the node's loopback).

This cluster has one real node, so the hub is one replica (its required anti-affinity
wants a node per replica) with stream replicas 1, on a local PersistentVolume; the core and
the agents are not installed here (tests/cluster/test_helm_install.py installs them on
Mosquitto; the per-site agent DaemonSets' placement: tests/cluster/test_agent_sites.py).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import time
import tomllib
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import RealCluster
from tests.cluster.test_helm_install import (
    IMAGES,
    Release,
    _cfnetctl_ebpf_pod,
    _get,
    _helm,
    _local_pv,
    _pod_finished,
    _pods,
    _ready,
    _secret,
    ensure_images,
    import_images,
)
from tools import helm as chart

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
NS = "cfnet-bus"
RELEASE = "cfbus"
NODE = "cfk-node"
TAG = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/cfnet-nats:{TAG}"
PV_NAME = "cfnet-test-nats"
SITE = "siteA"
SITE_LABEL = "node-restriction.kubernetes.io/cfnet-site"


def _build_and_import(rc: RealCluster) -> dict[str, float]:
    """The core and agent images (tools/images.sh, no-ops when built from these sources, as
    test_helm_install.py's), the NATS one, all imported into the node's containerd."""
    took = {f"build {k}": v for k, v in ensure_images().items()}
    t0 = time.monotonic()
    r = subprocess.run(["nice", "-n", "10", "bash", str(ROOT / "tools" / "images.sh"), "build",
                        "nats"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=1200)
    print(r.stderr, file=sys.__stderr__, flush=True)
    assert r.returncode == 0, f"tools/images.sh build nats failed:\n{r.stderr[-3000:]}"
    took["build nats"] = time.monotonic() - t0
    # test_helm_install.py's module (before this one) imported the core and agent already.
    took["image import"] = import_images(rc, [IMAGE, IMAGES["core"], IMAGES["agent"]])
    return took


def _set_site(rc: RealCluster, value: str | None) -> None:
    """The real node in site ``value`` (None: in none), by the chart's site label."""
    rc.set_node_label(NODE, SITE_LABEL, value)


@pytest.fixture(scope="module")
def bus(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Release]:
    from tools.certs import CertStore
    from tools.nats.cluster import render_accounts
    from tools.nats.leaf import render_remote

    rc = real_cluster
    t0 = time.monotonic()
    timings = _build_and_import(rc)
    pki = tmp_path_factory.mktemp("pki")
    # The hub's names (Service, pod) and the site leaf's address (the node's IP, where the
    # site's agents connect) in the one broker certificate both serve.
    subprocess.run([sys.executable, "-m", "tools.certs", "init", str(pki),
                    "--san", f"DNS:nats.{NS}.svc", "--san", f"DNS:nats-0.nats-cluster.{NS}.svc",
                    "--san", f"IP:{rc.node.node_ip}"],
                   cwd=ROOT, check=True, capture_output=True, timeout=60)
    store = CertStore(pki)
    for name, role in ((NODE, "agent"), ("core-k8s", "core"), ("ops", "operator")):
        store.add_account(name, role)  # type: ignore[arg-type]
    password = secrets.token_hex(16)
    files = pki / "secrets"
    files.mkdir()
    (files / "accounts.conf").write_text(render_accounts(store))
    (files / "password").write_text(password)
    (files / "remote.conf").write_text(render_remote(
        [f"nats-leaf://nats.{NS}.svc:7422"], "cfnet-leaf", password, "/etc/nats/tls/ca.crt"))
    values = [
        "image.registry=localhost", "image.pullPolicy=Never",
        "mosquitto.enabled=false", "nats.mode=deploy", f"nats.deploy.image={IMAGE}",
        # the hub's accounts as config users (the callout, on by default, is exercised on a
        # real nats-server by tests/integration/test_bus_callout.py and test_bus_agent_certs.py)
        "nats.deploy.callout.enabled=false",
        # as test_helm_install.py: the real node, no CAP_SYS_RESOURCE here, the state dir
        # under the node's temp dir; one core replica (the Lease hand-over is tested there)
        f"core.nodeSelector.kubernetes\\.io/hostname={NODE}", "core.replicas=1",
        "core.podDisruptionBudget.enabled=false", "core.consoleRoles.ops=viewer",
        f"agent.nodeSelector.kubernetes\\.io/hostname={NODE}",
        "agent.capabilities={BPF,PERFMON,SYS_ADMIN,NET_ADMIN}",
        f"agent.hostPaths.stateDir={rc.node.dir / 'cfnet-agent-state-nats'}",
        "credentials.create=true",
        # one real node: one hub replica (required anti-affinity), stream replicas 1
        "nats.deploy.replicas=1", "nats.streamReplicas=1", "nats.deploy.storage=1Gi",
        # (JetStream's own limits, maxFileStore, stay the defaults: the streams reserve them)
        "nats.deploy.resources.requests.cpu=50m", "nats.deploy.resources.requests.memory=64Mi",
        "nats.leaf.enabled=true", f"nats.leaf.sites[0].name={SITE}",
        f"nats.leaf.sites[0].address={rc.node.node_ip}",
        f"nats.leaf.sites[0].nodeSelector.kubernetes\\.io/hostname={NODE}",
        f"nats.leaf.sites[0].hostPath={rc.node.dir / 'nats-leaf'}",
    ]
    set_files = {"credentials.caCrt": store.ca_file,
                 "credentials.corePassword": pki / "clients" / "core-k8s" / "password",
                 "credentials.agentPassword": pki / "clients" / NODE / "password"}
    rel = Release(rc, pki, values, NS, timings, installed=False)
    try:
        # The node is in the site before the agents exist: its agent is the site's.
        _set_site(rc, SITE)
        rc.cp.request("POST", "/api/v1/persistentvolumes", _local_pv(rc, PV_NAME, "pv-nats"))
        rc.cp.ensure_namespace(NS)
        for name, fs in (("nats-tls", {"tls.crt": store.broker_cert, "tls.key": store.broker_key,
                                       "ca.crt": store.ca_file}),
                         ("nats-accounts", {"accounts.conf": files / "accounts.conf"}),
                         ("nats-leaf", {"password": files / "password",
                                        "remote.conf": files / "remote.conf"})):
            rc.cp.request("POST", f"/api/v1/namespaces/{NS}/secrets", _secret(name, fs))
        t1 = time.monotonic()
        args = ["--namespace", NS, *[a for v in values for a in ("--set", v)],
                *[a for k, f in set_files.items() for a in ("--set-file", f"{k}={f}")]]
        _helm(rc, "install", RELEASE, str(chart.CHART), *args)
        rel.installed = True

        def ready() -> bool:
            pods = [p for n in ("nats", f"nats-leaf-{SITE.lower()}", "cfnet-core",
                                f"cfnet-agent-{SITE.lower()}")
                    for p in _pods(rc, NS, f"app.kubernetes.io/name={n}")
                    if p["metadata"].get("deletionTimestamp") is None]
            return len(pods) == 4 and all(map(_ready, pods))

        rel.wait(ready, 240, "the hub, the site's leaf, the core and the site's agent "
                             "Running and Ready", ns=NS)
        timings["install -> Ready"] = time.monotonic() - t1
        timings["fixture total"] = time.monotonic() - t0
        print(f"[helm-nats] {', '.join(f'{k} {v:.1f}s' for k, v in timings.items())}",
              file=sys.__stderr__, flush=True)
        yield rel
    finally:
        if rel.installed:
            subprocess.run([str(chart.ensure_helm()), "uninstall", RELEASE, "-n", NS, "--wait",
                            "--timeout", "120s", "--kubeconfig", str(rc.cp.kubeconfig)],
                           capture_output=True, timeout=150)
        with contextlib.suppress(OSError, urllib.error.URLError, AssertionError):
            _set_site(rc, None)
        for path in (f"/api/v1/namespaces/{NS}/persistentvolumeclaims/data-nats-0",
                     f"/api/v1/namespaces/{NS}", f"/api/v1/persistentvolumes/{PV_NAME}"):
            with contextlib.suppress(OSError, urllib.error.URLError):
                rc.cp.request("DELETE", path)


def test_hub_and_site_leaf_run_and_the_leaf_is_linked(bus: Release) -> None:
    rc = bus.rc
    leaf = _pods(rc, NS, f"app.kubernetes.io/name=nats-leaf-{SITE.lower()}")[0]
    assert leaf["spec"]["nodeName"] == NODE and leaf["spec"]["hostNetwork"] is True

    def linked() -> list[dict[str, Any]]:
        # The leaf's monitoring endpoint is on the node's loopback (host network).
        r = rc.node.exec_in_ns(["curl", "-sf", "--max-time", "3",
                                "http://127.0.0.1:8222/leafz"], check=False, timeout=10)
        got = json.loads(r.stdout) if r.returncode == 0 and r.stdout else {}
        return list(got.get("leafs") or [])

    leafs = bus.wait(linked, 90, "the site's leaf reporting its uplink to the hub in /leafz",
                     ns=NS)
    print(f"[helm-nats] /leafz: {json.dumps(leafs)[:600]}", file=sys.__stderr__, flush=True)
    assert len(leafs) == 1, leafs
    # The leaf serves its agents' MQTT at the site's address: the node's IP, port 8883.
    out = rc.node.exec_in_ns(["ss", "-Htln", "sport = :8883"], check=False).stdout
    assert f"{rc.node.node_ip}:8883" in out or "*:8883" in out or "0.0.0.0:8883" in out, out


def test_the_sites_agent_reports_through_the_leaf(bus: Release) -> None:
    """The node is in the site: only the site's DaemonSet runs an agent there, that agent is
    an MQTT client of the leaf (not the hub), and the core sees the node's eBPF telemetry,
    as an operator asks it (cfnetctl on the bus, in a pod of the core image)."""
    rc = bus.rc
    cloud = _get(rc, f"/apis/apps/v1/namespaces/{NS}/daemonsets/cfnet-agent")["status"]
    assert cloud.get("desiredNumberScheduled") == 0, cloud

    def on_leaf() -> list[str]:
        r = rc.node.exec_in_ns(["curl", "-sf", "--max-time", "3",
                                "http://127.0.0.1:8222/connz?auth=true"], check=False,
                               timeout=10)
        got = json.loads(r.stdout) if r.returncode == 0 and r.stdout else {}
        return [str(c.get("mqtt_client")) for c in got.get("connections") or []
                if c.get("mqtt_client") and c.get("authorized_user") == NODE]

    bus.wait(on_leaf, 90, f"the agent of {NODE} as an MQTT client of the site's leaf", ns=NS)
    rc.cp.request("POST", f"/api/v1/namespaces/{NS}/secrets", _secret("ops", {
        "password": bus.pki / "clients" / "ops" / "password", "ca.crt": bus.pki / "ca.crt"}))
    _cfnetctl_ebpf_pod(rc, NS, ["--bus", "nats", "--broker-host", f"nats.{NS}.svc"],
                       until_s=120)
    phase = bus.wait(lambda: _pod_finished(rc, NS, "cfnetctl"), 180, "cfnetctl's pod to finish",
                     ns=NS)
    agent = _pods(rc, NS, f"app.kubernetes.io/name=cfnet-agent-{SITE.lower()}")[0]
    core = _pods(rc, NS, "app.kubernetes.io/name=cfnet-core")[0]
    assert phase == "Succeeded", (
        f"the core never showed {NODE} with probe ebpf:\n"
        f"{rc.node.pod_log(NS, 'cfnetctl', 'ctl')[-3000:]}\n--- agent log\n"
        f"{rc.node.pod_log(NS, agent['metadata']['name'], 'agent')[-3000:]}\n--- core log\n"
        f"{rc.node.pod_log(NS, core['metadata']['name'], 'core')[-3000:]}")
