"""`helm install` of the chart's clustered bus on the test cluster's real node, with the
chart's defaults for it: ``nats.mode=deploy``, the auth callout on, each agent enrolled for
its own client certificate; then ``helm upgrade`` to one ``nats.leaf.sites`` entry whose
leaf runs on the node.

The image is the local ``cfnet-nats`` (``tools/images.sh build nats``: the nats-server that
tools/nats/build.sh builds from the Go module proxy, on the images' Debian base), imported
into the node's containerd; the Secrets are what docs/install.md says to make (the broker
certificate of ``tools.certs`` with the hub's and the site's names, ``tools.nats.cluster
accounts`` in its callout form and, for the leaves, its plain form, ``callout-seed`` and
``callout-accounts`` for the callout, ``tools.nats.leaf remote``). Checked on the running
pods:

* the agent enrolls (a CSR the leading core signs), connects to the hub's MQTT listener
  with its certificate (its Secret holds no password), and the core acknowledges its eBPF
  reports;
* with that certificate, another node's telemetry and status are dropped (nats-server logs
  each ``Publish Violation``), its own is taken; a certificate of another node cannot
  connect with the node's client IDs (the callout refuses, CONNACK not authorized), and the
  node's agent stays connected;
* after the upgrade to an edge site (the node labelled into it): the hub's and the site
  leaf's pods are Running and Ready, the leaf's uplink is connected to the hub (the leaf's
  own monitoring endpoint, ``/leafz``, on the node's loopback), the site's agent is an MQTT
  client of the leaf, and the core sees the node's eBPF telemetry through it, as an
  operator asks it (cfnetctl on the bus, in a pod of the core image).

This cluster has one real node, so the hub is one replica (its required anti-affinity
wants a node per replica) with stream replicas 1, on a local PersistentVolume; one core
replica (the Lease hand-over is tested on Mosquitto, tests/cluster/test_helm_install.py;
the per-site agent DaemonSets' placement: tests/cluster/test_agent_sites.py).
"""

from __future__ import annotations

import base64
import contextlib
import functools
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

from tests.cluster import faults
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


def _secrets(rc: RealCluster, pki: Path) -> dict[str, dict[str, Path]]:
    """The Secrets docs/install.md has the operator make for the hub, its callout and the
    site's leaf, from a ``tools.certs`` store in ``pki``: name -> key -> file."""
    from cloud_core.bus_callout import account_public, new_account_seed
    from tools.certs import CertStore
    from tools.nats.cluster import callout_accounts, render_accounts
    from tools.nats.leaf import render_remote

    store = CertStore(pki)
    for name, role in ((NODE, "agent"), ("core-k8s", "core"), ("ops", "operator")):
        store.add_account(name, role)  # type: ignore[arg-type]
    files = pki / "secrets"
    files.mkdir()
    seed = new_account_seed()
    for name, text in (
            ("seed", seed), ("callout-password", secrets.token_hex(16)),
            ("sys-password", secrets.token_hex(16)), ("leaf-password", secrets.token_hex(16)),
            ("accounts.json", json.dumps(callout_accounts(store)))):
        (files / name).write_text(text)
    (files / "accounts.conf").write_text(render_accounts(
        store, callout_issuer=account_public(seed),
        callout_password=(files / "callout-password").read_text(),
        callout_bypass=("cfnet-leaf",)))
    (files / "leaf-accounts.conf").write_text(render_accounts(store))
    (files / "remote.conf").write_text(render_remote(
        [f"nats-leaf://nats.{NS}.svc:7422"], "cfnet-leaf",
        (files / "leaf-password").read_text(), "/etc/nats/tls/ca.crt"))
    return {
        "nats-tls": {"tls.crt": store.broker_cert, "tls.key": store.broker_key,
                     "ca.crt": store.ca_file},
        "nats-accounts": {"accounts.conf": files / "accounts.conf",
                          "leaf-accounts.conf": files / "leaf-accounts.conf"},
        "nats-callout": {"seed": files / "seed", "password": files / "callout-password",
                         "sys-password": files / "sys-password",
                         "accounts.json": files / "accounts.json"},
        "nats-leaf": {"password": files / "leaf-password", "remote.conf": files / "remote.conf"},
        "ops": {"password": pki / "clients" / "ops" / "password", "ca.crt": store.ca_file}}


def _live(rc: RealCluster, names: tuple[str, ...]) -> list[dict[str, Any]]:
    return [p for n in names for p in _pods(rc, NS, f"app.kubernetes.io/name={n}")
            if p["metadata"].get("deletionTimestamp") is None]


def _agent_metrics(rc: RealCluster) -> faults.Samples:
    """The node's agent's /metrics on the node's host network (agent.metricsPort)."""
    r = rc.node.exec_in_ns(["curl", "-sf", "--max-time", "3", "http://127.0.0.1:9109/metrics"],
                           check=False, timeout=10)
    assert r.returncode == 0, f"agent /metrics: {r.returncode} {r.stderr[:300]}"
    return faults.samples(r.stdout)


@pytest.fixture(scope="module")
def bus(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Release]:
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
    made = _secrets(rc, pki)
    values = [
        "image.registry=localhost", "image.pullPolicy=Never",
        "mosquitto.enabled=false", "nats.mode=deploy", f"nats.deploy.image={IMAGE}",
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
    ]
    # The agents' password: only the site's agents (after the upgrade) use it.
    set_files = {"credentials.caCrt": pki / "ca.crt",
                 "credentials.corePassword": pki / "clients" / "core-k8s" / "password",
                 "credentials.agentPassword": pki / "clients" / NODE / "password"}
    values += [f"@{k}={f}" for k, f in set_files.items()]
    rel = Release(rc, pki, values, NS, timings, installed=False)
    try:
        rc.cp.request("POST", "/api/v1/persistentvolumes", _local_pv(rc, PV_NAME, "pv-nats"))
        rc.cp.ensure_namespace(NS)
        for name, fs in made.items():
            rc.cp.request("POST", f"/api/v1/namespaces/{NS}/secrets", _secret(name, fs))
        t1 = time.monotonic()
        _helm(rc, "install", RELEASE, str(chart.CHART), *_args(values))
        rel.installed = True

        def ready() -> bool:
            pods = _live(rc, ("nats", "cfnet-core", "cfnet-agent"))
            return len(pods) == 3 and all(map(_ready, pods))

        rel.wait(ready, 240, "the hub (with its callout), the core and the agent Running "
                             "and Ready", ns=NS)
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


def _args(values: list[str]) -> list[str]:
    """helm's arguments for ``values`` (``@key=file``: a --set-file)."""
    out = ["--namespace", NS]
    for v in values:
        out += ["--set-file", v[1:]] if v.startswith("@") else ["--set", v]
    return out


def _cfnetctl_sees_the_node(bus: Release, agent_pod: str) -> None:
    """cfnetctl on the bus, in a pod of the core image, until the core shows NODE with
    probe ebpf; the pod is deleted after."""
    rc = bus.rc
    _cfnetctl_ebpf_pod(rc, NS, ["--bus", "nats", "--broker-host", f"nats.{NS}.svc"],
                       until_s=120)
    try:
        phase = bus.wait(lambda: _pod_finished(rc, NS, "cfnetctl"), 180,
                         "cfnetctl's pod to finish", ns=NS)
        core = _live(rc, ("cfnet-core",))[0]
        assert phase == "Succeeded", (
            f"the core never showed {NODE} with probe ebpf:\n"
            f"{rc.node.pod_log(NS, 'cfnetctl', 'ctl')[-3000:]}\n--- agent log\n"
            f"{rc.node.pod_log(NS, agent_pod, 'agent')[-3000:]}\n--- core log\n"
            f"{rc.node.pod_log(NS, core['metadata']['name'], 'core')[-3000:]}")
    finally:
        with contextlib.suppress(OSError, urllib.error.URLError):
            rc.cp.request("DELETE", f"/api/v1/namespaces/{NS}/pods/cfnetctl")
        bus.wait(lambda: "cfnetctl" not in [
            p["metadata"]["name"] for p in _get(rc, f"/api/v1/namespaces/{NS}/pods")["items"]],
            60, "cfnetctl's pod gone", ns=NS)


def test_the_agent_enrolls_and_reports_with_its_certificate(bus: Release) -> None:
    """The chart's defaults: the agent files a CSR, the leading core signs it, the agent
    connects to the hub's MQTT listener with that certificate (the callout names it; its
    Secret holds no password), and the core acknowledges its eBPF reports."""
    rc = bus.rc
    csrs = _get(rc, "/apis/certificates.k8s.io/v1/certificatesigningrequests")["items"]
    issued = [c for c in csrs if c["spec"].get("signerName") == "cfnet.io/agent"
              and (c.get("status") or {}).get("certificate")
              and c["spec"].get("extra", {}).get("authentication.kubernetes.io/node-name")
              == [NODE]]
    assert issued, f"no issued cfnet.io/agent CSR for {NODE}: {json.dumps(csrs)[:2000]}"
    secret = _get(rc, f"/api/v1/namespaces/{NS}/secrets/cfnet-agent-credentials")
    assert sorted(secret["data"]) == ["ca.crt"]  # no shared password reaches the node

    def acked() -> faults.Samples | None:
        m = _agent_metrics(rc)
        return m if faults.value(m, "cfnet_agent_reports_total", stage="acked") >= 1 else None

    m = bus.wait(acked, 90, "the agent's reports acknowledged", ns=NS)
    # "acked" is the core's end-to-end ack: the report reached the core's state.
    assert faults.value(m, "cfnet_agent_connected") == 1
    assert faults.value(m, "cfnet_agent_probe", probe="ebpf") == 1


def test_one_nodes_certificate_cannot_publish_or_connect_as_another(
        bus: Release, tmp_path: Path) -> None:
    """With the node's enrolled certificate, on the hub's MQTT listener (its Service, from
    the node's network namespace): another node's telemetry and status are dropped, each a
    ``Publish Violation`` in nats-server's log, and its own telemetry is taken; with the
    certificate of another node (signed by the same agent CA, as the core signs) neither of
    the node's client IDs gets in (the callout refuses; CONNACK not authorized), while that
    node's own ID does, and the node's agent stays connected throughout."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from cloud_core.k8s.enroll import AgentSigner
    from edge_agent.wire import status_topic, telemetry_topic
    from tools.identity_probe import NOT_AUTHORIZED, connect_311

    rc, other = bus.rc, "cfk-other"
    svc = _get(rc, f"/api/v1/namespaces/{NS}/services/nats")["spec"]["clusterIP"]
    state = rc.node.dir / "cfnet-agent-state-nats" / "identity"
    # The broker's certificate names nats.<ns>.svc, not the ClusterIP: the CA is checked.
    probe = functools.partial(connect_311, svc, 8883, ca_file=bus.pki / "ca.crt",
                              netns=rc.node.ns, check_hostname=False)
    agent = _live(rc, ("cfnet-agent",))[0]["metadata"]["name"]

    def violations() -> list[str]:
        return [ln for ln in rc.node.pod_log(NS, "nats-0", "nats").splitlines()
                if "Publish Violation" in ln]

    def disconnects() -> int:
        return rc.node.pod_log(NS, agent, "agent").count("disconnected from broker")

    before, dropped_before = violations(), disconnects()
    forged = (telemetry_topic(other), status_topic(other))
    code, acked = probe(certfile=state / "client.crt", keyfile=state / "client.key",
                        client_id=NODE, topics=(*forged, telemetry_topic(NODE)))
    assert code == 0 and len(acked) == 3, (code, acked)  # NATS acks what it drops, too
    new = bus.wait(lambda: v[len(before):] if len(v := violations()) >= len(before) + 2
                   else None, 20, "nats-server's Publish Violations", ns=NS)
    assert len(new) == 2 and all(f'"cfnet.v1.nodes.{other}.' in ln for ln in new), new

    # Another node's certificate, from the agent CA the core keeps in its Secret.
    ca = _get(rc, f"/api/v1/namespaces/{NS}/secrets/cfnet-agent-ca")["data"]
    signer = AgentSigner.from_pem(base64.b64decode(ca["tls.crt"]),
                                  base64.b64decode(ca["tls.key"]))
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, other)]))
           .sign(key, hashes.SHA256()))
    (tmp_path / "o.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (tmp_path / "o.crt").write_bytes(signer.sign(csr, other))
    theirs = functools.partial(probe, certfile=tmp_path / "o.crt", keyfile=tmp_path / "o.key")
    for cid in (f"agent-{NODE}", NODE):
        assert theirs(client_id=cid)[0] == NOT_AUTHORIZED, cid
    assert theirs(client_id=f"agent-{other}")[0] == 0
    assert disconnects() == dropped_before  # the node's session was never taken over
    assert faults.value(_agent_metrics(rc), "cfnet_agent_connected") == 1
    callout = rc.node.pod_log(NS, "nats-0", "callout")
    assert f"is not node '{other}''s" in callout, callout[-2000:]


@pytest.fixture(scope="module")
def site(bus: Release) -> Release:
    """``helm upgrade`` to one edge site whose leaf runs on the node, the node labelled
    into it first: its agent is then the site's, with the agents' password (a leaf has no
    callout), an MQTT client of the leaf."""
    rc = bus.rc
    t0 = time.monotonic()
    _set_site(rc, SITE)
    bus.values += [
        "nats.leaf.enabled=true", f"nats.leaf.sites[0].name={SITE}",
        f"nats.leaf.sites[0].address={rc.node.node_ip}",
        f"nats.leaf.sites[0].nodeSelector.kubernetes\\.io/hostname={NODE}",
        f"nats.leaf.sites[0].hostPath={rc.node.dir / 'nats-leaf'}"]
    _helm(rc, "upgrade", RELEASE, str(chart.CHART), *_args(bus.values))

    def ready() -> bool:
        pods = _live(rc, ("nats", f"nats-leaf-{SITE.lower()}", "cfnet-core",
                          f"cfnet-agent-{SITE.lower()}", "cfnet-agent"))
        return len(pods) == 4 and all(map(_ready, pods))

    bus.wait(ready, 240, "the hub, the site's leaf, the core and the site's agent Running "
                         "and Ready", ns=NS)
    print(f"[helm-nats] upgrade to the site -> Ready {time.monotonic() - t0:.1f}s",
          file=sys.__stderr__, flush=True)
    return bus


def test_hub_and_site_leaf_run_and_the_leaf_is_linked(site: Release) -> None:
    rc, bus = site.rc, site
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


def test_the_sites_agent_reports_through_the_leaf(site: Release) -> None:
    """The node is in the site: only the site's DaemonSet runs an agent there, that agent is
    an MQTT client of the leaf (not the hub), and the core sees the node's eBPF telemetry,
    as an operator asks it (cfnetctl on the bus, in a pod of the core image)."""
    rc = site.rc
    cloud = _get(rc, f"/apis/apps/v1/namespaces/{NS}/daemonsets/cfnet-agent")["status"]
    assert cloud.get("desiredNumberScheduled") == 0, cloud

    def on_leaf() -> list[str]:
        r = rc.node.exec_in_ns(["curl", "-sf", "--max-time", "3",
                                "http://127.0.0.1:8222/connz?auth=true"], check=False,
                               timeout=10)
        got = json.loads(r.stdout) if r.returncode == 0 and r.stdout else {}
        return [str(c.get("mqtt_client")) for c in got.get("connections") or []
                if c.get("mqtt_client") and c.get("authorized_user") == NODE]

    site.wait(on_leaf, 90, f"the agent of {NODE} as an MQTT client of the site's leaf",
              ns=NS)
    agent = _live(rc, (f"cfnet-agent-{SITE.lower()}",))[0]["metadata"]["name"]
    _cfnetctl_sees_the_node(site, agent)
