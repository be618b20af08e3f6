"""`helm install` of the chart as the README gives it, on the test cluster's real node.

One install for the module (``release``): the README's command (credentials.create with
--set-file, the ``mosquitto-auth`` Secret from ``python -m tools.certs``) plus only what this
cluster requires, each override in ``overrides()`` with its reason. The images are the local
builds (``tools/images.sh build core|agent|mosquitto``; podman's store, reused while built
from the same sources), saved from podman and imported into the node's containerd (no
registry). A local PersistentVolume on the node serves Mosquitto's claim. Then, on the running
pods:

* Mosquitto, both core replicas and the agent DaemonSet's pod are Running and Ready, and
  exactly one core leads (the Lease's holder, the only replica whose ``cfnet_leader`` is 1);
* the agent on the real node reports with ``probe: ebpf`` through the in-cluster broker, as
  an operator sees it: ``cfnetctl nodes`` in a pod of the core image;
* a Deployment with ``schedulerName: cfnet-scheduler`` gets its pods Running on the node;
* deleting the leading core pod hands the Lease to the other replica, and its replacement
  starts and becomes Ready;
* ``helm upgrade`` with a changed ``agent.probePort`` rolls the agent, whose echo server then
  listens on the new port; ``helm uninstall`` leaves nothing of the release (namespaced
  objects of every listable kind, its cluster-scoped RBAC, the leader Lease).

What the running pods showed about the chart, fixed there and checked here: the Lease the
core creates outlived ``helm uninstall`` (the chart owns it now); the console refused every
operator, as the chart had no way to pass ``--roles`` (``core.consoleRoles``); in Kubernetes
mode ``cfnetctl nodes`` did not say which probe measured a node. Checked as they are: the
broker's fsGroup (its local volume becomes group 1883, setgid, writable), the agent's hostPaths
(BTF, tracefs, debugfs, modules, headers) under a kubelet in a network namespace: the CO-RE
probe loads.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import faults
from tests.cluster.conftest import RealCluster
from tests.cluster.edge import EdgeDevice
from tools import helm as chart
from tools.envtest.images import PODBIN_IMAGE
from tools.identity_probe import cannot_publish_as

# The module's install (and, on a machine without the images, their cold build: mmdebstrap
# base and three podman builds) runs in the first test's setup; every wait in the tests is
# bounded on its own, well inside this.
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[2]
NS = "cfnet-system"
RELEASE = "cfnet"
NODE = "cfk-node"
TAG = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGES = {t: f"localhost/cfnet-{t}:{TAG}" for t in ("core", "agent", "mosquitto")}
PV_NAME = "cfnet-test-mosquitto"
# The broker's certificate listener's NodePort (mosquitto.service.certNodePort).
CERT_NODE_PORT = 30884
# The previous release's chart (0.1.0), packaged from its commit (tests/cluster/charts/README).
PREVIOUS_CHART = ROOT / "tests" / "cluster" / "charts" / "cfnet-0.1.0-0f1c3cf.tgz"
# The README's install command, as given there (the files are made by tools.certs below).
README_SET_FILES = {"credentials.caCrt": "ca.crt",
                    "credentials.corePassword": "clients/core-k8s/password"}
README_SET = ["credentials.create=true"]


def overrides(node_dir: Path) -> list[str]:
    """What this cluster needs beyond the README's values, and why."""
    return [
        # No registry here: the images are the local builds, imported into containerd.
        "image.registry=localhost", "image.pullPolicy=Never",
        # eclipse-mosquitto cannot be pulled: Debian's mosquitto laid out the same
        # (Containerfile target mosquitto; uid/gid 1883 as the chart's securityContext).
        f"mosquitto.image={IMAGES['mosquitto']}",
        # The session's cluster also has kwok nodes (other tests): cfnet's pods go to the real
        # node, where containers run (Mosquitto follows its local volume there).
        f"core.nodeSelector.kubernetes\\.io/hostname={NODE}",
        f"agent.nodeSelector.kubernetes\\.io/hostname={NODE}",
        # This machine's root has no CAP_SYS_RESOURCE in its bounding set (runc: "unable to
        # apply caps"); the agent needs it only to raise RLIMIT_MEMLOCK on kernels before
        # 5.11. The chart's other capabilities, unchanged.
        "agent.capabilities={BPF,PERFMON,SYS_ADMIN,NET_ADMIN}",
        # The operator this test asks as (cfnetctl), a viewer (the README's tour names its
        # own operator the same way; the value is the chart's, core.consoleRoles).
        "core.consoleRoles.ops=viewer",
        # The agent's offline buffer under the node's temp dir, not the machine's /var/lib.
        f"agent.hostPaths.stateDir={node_dir / 'cfnet-agent-state'}",
        # The broker's certificate listener also on the node's address, for an edge device
        # outside the cluster network (docs/install.md, "Edge nodes"); the agents inside
        # keep the Service's name (no broker.agentHost).
        "mosquitto.service.type=NodePort", f"mosquitto.service.certNodePort={CERT_NODE_PORT}",
    ]


# -- small API helpers -----------------------------------------------------------------------
def _get(rc: RealCluster, path: str) -> Any:
    return rc.cp.request("GET", path)


def _maybe(rc: RealCluster, path: str) -> Any:
    try:
        return rc.cp.request("GET", path)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def _pods(rc: RealCluster, ns: str, selector: str) -> list[dict[str, Any]]:
    sel = selector.replace("=", "%3D").replace("/", "%2F")
    return list(_get(rc, f"/api/v1/namespaces/{ns}/pods?labelSelector={sel}")["items"])


def _ready(pod: dict[str, Any]) -> bool:
    st = pod.get("status") or {}
    return (pod["metadata"].get("deletionTimestamp") is None and st.get("phase") == "Running"
            and any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in st.get("conditions") or []))


def _helm(rc: RealCluster, *args: str, timeout: float = 120) -> str:
    r = subprocess.run([str(chart.ensure_helm()), *args, "--kubeconfig", str(rc.cp.kubeconfig)],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"helm {' '.join(args)} failed:\n{r.stderr}{r.stdout}"
    return r.stdout


def _in_node(rc: RealCluster, code: str, timeout: float = 15) -> str:
    """Python ``code`` run in the node's network namespace (where pod addresses route)."""
    r = rc.node.exec_in_ns([sys.executable, "-c", code], check=False, timeout=timeout)
    return r.stdout if r.returncode == 0 else ""


def _http(rc: RealCluster, url: str) -> tuple[int, str]:
    out = _in_node(rc, "import urllib.request, urllib.error, json\n"
                       f"try:\n r = urllib.request.urlopen({url!r}, timeout=3)\n"
                       " print(json.dumps([r.status, r.read().decode()]))\n"
                       "except urllib.error.HTTPError as e:\n"
                       " print(json.dumps([e.code, e.read().decode()]))")
    if not out:
        return 0, ""
    code, body = json.loads(out)
    return int(code), str(body)


# -- the images ------------------------------------------------------------------------------
def ensure_images() -> dict[str, float]:
    """``tools/images.sh build <target>`` for each image: a no-op when podman's image was built
    from these sources (its srckey label), a (cached-layer) build otherwise, progress on
    stderr. Returns the seconds each call took."""
    took = {}
    for target in IMAGES:
        t0 = time.monotonic()
        proc = subprocess.Popen(["nice", "-n", "10", "bash", str(ROOT / "tools" / "images.sh"),
                                 "build", target], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        tail: list[str] = []
        for line in proc.stderr:
            print(f"[images] {line.rstrip()}", file=sys.__stderr__, flush=True)
            tail = [*tail[-40:], line]
        if proc.wait(timeout=1800) != 0:
            pytest.fail(f"tools/images.sh build {target} failed:\n{''.join(tail)}",
                        pytrace=False)
        took[target] = time.monotonic() - t0
    return took


# What this session's node imported: image name -> podman's image ID (test_helm_nats.py
# imports an image again only when it was rebuilt since).
IMPORTED: dict[str, str] = {}


def podman_id(name: str) -> str:
    return subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", name],
                          capture_output=True, text=True, timeout=60).stdout.strip()


def import_images(rc: RealCluster, names: list[str] | None = None) -> float:
    """podman save -> ctr import, side by side: ``names`` (default: the three of IMAGES),
    skipping those this session's node already has from the same build. docker-archive: its
    layers uncompressed (oci-archive gzips them: 27 s instead of 9 s for the core here)."""
    t0 = time.monotonic()
    ids = {name: podman_id(name) for name in (names or list(IMAGES.values()))}
    procs = []
    for name in [n for n, i in ids.items() if IMPORTED.get(n) != i]:
        archive = rc.node.dir / f"image-{name.rsplit('/', 1)[-1].replace(':', '-')}.tar"
        script = (f"podman save --format docker-archive -o {archive} {name} && "
                  f"{' '.join(rc.node._ctr('images', 'import', str(archive)))}; "
                  f"rc=$?; rm -f {archive}; exit $rc")
        procs.append((name, subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True)))
    failed = []
    for name, p in procs:  # every one waited for (bounded) before any failure is raised
        try:
            out, _ = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n(killed after 600 s)"
        if p.returncode != 0:
            failed.append(f"importing {name} into the node's containerd failed:\n{out}")
    assert not failed, "\n".join(failed)
    IMPORTED.update(ids)
    return time.monotonic() - t0


# -- the release -----------------------------------------------------------------------------
@dataclass
class Release:
    rc: RealCluster
    pki: Path
    values: list[str]
    workload_ns: str
    timings: dict[str, float] = field(default_factory=dict)
    installed: bool = True

    def helm_args(self) -> list[str]:
        args = ["--namespace", NS]
        for v in [*README_SET, *self.values]:
            args += ["--set", v]
        for key, f in README_SET_FILES.items():
            args += ["--set-file", f"{key}={self.pki / f}"]
        return args

    def diagnose(self, ns: str = NS) -> str:
        """Pods (phase, conditions, container states), events and container logs of ``ns``."""
        out = []
        with contextlib.suppress(Exception):
            for p in _get(self.rc, f"/api/v1/namespaces/{ns}/pods")["items"]:
                st = p.get("status") or {}
                out.append(f"pod {p['metadata']['name']} on {p['spec'].get('nodeName')}: "
                           f"{st.get('phase')} {json.dumps(st.get('conditions'))}\n  "
                           f"{json.dumps(st.get('containerStatuses'))}")
                for c in p["spec"]["containers"]:
                    log = self.rc.node.pod_log(ns, p["metadata"]["name"], c["name"])
                    out.append(f"--- log {p['metadata']['name']}/{c['name']} (tail)\n"
                               f"{log[-1500:]}")
            for e in _get(self.rc, f"/api/v1/namespaces/{ns}/events")["items"][-40:]:
                out.append(f"event {e['involvedObject'].get('name')}: {e.get('reason')}: "
                           f"{e.get('message')}")
        return "\n".join(out) + "\n" + self.rc.node.logs(1500)

    def wait(self, pred: Callable[[], Any], timeout: float, what: str,
             ns: str = NS, story: Callable[[], str] | None = None) -> Any:
        """``pred()`` once truthy, polled every 0.5 s; on timeout, an AssertionError that
        opens with ``story()`` (what the test saw on the way: CI keeps a message's head)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = pred()
            except (OSError, urllib.error.URLError, ValueError, KeyError) as e:
                last = e
            else:
                if last:
                    return last
            time.sleep(0.5)
        told = f"{story()}\n" if story is not None else ""
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} "
                             f"(last: {last!r})\n{told}{self.diagnose(ns)}")

    def core_pods(self) -> list[dict[str, Any]]:
        return [p for p in _pods(self.rc, NS, "app.kubernetes.io/name=cfnet-core")
                if p["metadata"].get("deletionTimestamp") is None]

    def lease_holder(self) -> str:
        lease = _maybe(self.rc, f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/"
                                "cfnet-core")
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def leader_gauge(self, pod: dict[str, Any]) -> float | None:
        code, text = _http(self.rc, f"http://{pod['status']['podIP']}:9108/metrics")
        for line in text.splitlines() if code == 200 else ():
            if line.startswith("cfnet_leader "):
                return float(line.split()[1])
        return None

    def all_ready(self) -> dict[str, list[str]] | None:
        want = {"mosquitto": 1, "cfnet-core": 2, "cfnet-agent": 1}
        got = {}
        for name, n in want.items():
            pods = [p for p in _pods(self.rc, NS, f"app.kubernetes.io/name={name}")
                    if p["metadata"].get("deletionTimestamp") is None]
            if len(pods) != n or not all(map(_ready, pods)):
                return None
            got[name] = [p["metadata"]["name"] for p in pods]
        return got

    def one_leader(self) -> tuple[str, list[dict[str, Any]]] | None:
        """(holder, core pods) when the Lease's holder is a Ready core pod and that pod alone
        reports cfnet_leader 1."""
        pods = self.core_pods()
        holder = self.lease_holder()
        if len(pods) != 2 or not all(map(_ready, pods)):
            return None
        if holder not in {p["metadata"]["name"] for p in pods}:
            return None
        gauges = {p["metadata"]["name"]: self.leader_gauge(p) for p in pods}
        if gauges != {n: (1.0 if n == holder else 0.0) for n in gauges}:
            return None
        return holder, pods


def _local_pv(rc: RealCluster, name: str = PV_NAME, dirname: str = "pv-mosquitto"
              ) -> dict[str, Any]:
    """A 1 Gi local PersistentVolume ``name`` on the real node, in ``dirname`` of its dir."""
    path = rc.node.dir / dirname
    path.mkdir(mode=0o755, exist_ok=True)
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain",
                     "local": {"path": str(path)},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In",
                          "values": [NODE]}]}]}}}}


def _secret(name: str, files: dict[str, Path]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "data": {k: base64.b64encode(p.read_bytes()).decode() for k, p in files.items()}}


def _cfnetctl_ebpf_pod(rc: RealCluster, ns: str, broker: list[str], until_s: int) -> None:
    """Start pod ``cfnetctl`` (the core image, on the real node), as an operator in the
    cluster runs it: ``cfnetctl <broker> ... -o json nodes`` every 2 s for up to ``until_s``,
    exiting 0 once NODE's row says ``probe: ebpf``. Secret ``ops`` (password, ca.crt) in
    ``ns`` holds the operator's credentials."""
    ctl = [*broker, "--broker-port", "8883", "--user", "ops", "--password-file", "/ops/password",
           "--ca-file", "/ops/ca.crt", "--timeout", "10", "-o", "json", "nodes"]
    script = (
        "import json, subprocess, sys, time\n"
        f"end = time.monotonic() + {until_s}\n"
        "while time.monotonic() < end:\n"
        f"    r = subprocess.run(['cfnetctl', *{ctl!r}], capture_output=True, text=True)\n"
        "    print(r.stdout.strip() or r.stderr.strip()[-500:], flush=True)\n"
        f"    if r.returncode == 0 and any(n.get('node') == {NODE!r} and "
        "n.get('probe') == 'ebpf' for n in json.loads(r.stdout)):\n"
        "        sys.exit(0)\n"
        "    time.sleep(2)\n"
        "sys.exit(1)\n")
    rc.cp.request("POST", f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cfnetctl"},
        "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": NODE},
                 "automountServiceAccountToken": False,
                 "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                 "containers": [{"name": "ctl", "image": IMAGES["core"],
                                 "imagePullPolicy": "Never", "command": ["python3", "-c",
                                                                         script],
                                 "volumeMounts": [{"name": "ops", "mountPath": "/ops"}]}],
                 "volumes": [{"name": "ops", "secret": {"secretName": "ops"}}]}})


def _pod_finished(rc: RealCluster, ns: str, name: str) -> str:
    """The pod's phase once it is Succeeded or Failed, else ''."""
    phase = _get(rc, f"/api/v1/namespaces/{ns}/pods/{name}")["status"].get("phase")
    return str(phase) if phase in ("Succeeded", "Failed") else ""


@pytest.fixture(scope="module")
def release(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Release]:
    rc = real_cluster
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    for target, s in ensure_images().items():
        timings[f"build {target}"] = s
    # The broker's PKI and accounts, as the README says (tools.certs): the broker certificate
    # names the in-cluster Service and the node's address (its NodePort); one account for
    # the cores, one for the agent on the node (its password is credentials.agentPassword),
    # an operator for cfnetctl.
    pki = tmp_path_factory.mktemp("pki")
    certs = [sys.executable, "-m", "tools.certs"]
    for args in (["init", str(pki), "--san", f"DNS:mosquitto.{NS}.svc",
                  "--san", f"IP:{rc.node.node_ip}"],
                 ["add-core", "core-k8s", "--dir", str(pki)],
                 ["add-operator", "ops", "--dir", str(pki)]):
        subprocess.run([*certs, *args], cwd=ROOT, check=True, capture_output=True, timeout=60)
    workload_ns = f"helm-{uuid.uuid4().hex[:6]}"
    rel = Release(rc, pki, overrides(rc.node.dir), workload_ns, timings, installed=False)
    try:
        timings["image import"] = import_images(rc)
        # What the cluster's storage would provide: a local volume on the node for the
        # broker's PersistentVolumeClaim (no provisioner in the test cluster).
        rc.cp.request("POST", "/api/v1/persistentvolumes", _local_pv(rc))
        # The README creates mosquitto-auth right after `helm install`; created first here so
        # the broker's pod does not wait out the kubelet's mount back-off.
        rc.cp.ensure_namespace(NS)
        rc.cp.request("POST", f"/api/v1/namespaces/{NS}/secrets", _secret("mosquitto-auth", {
            f: pki / f for f in ("ca.crt", "broker.crt", "broker.key", "passwd", "acl")}))
        t1 = time.monotonic()
        _helm(rc, "install", RELEASE, str(chart.CHART), "--create-namespace",
              *rel.helm_args())
        rel.installed = True
        rel.wait(rel.all_ready, 240, "Mosquitto, 2 core replicas and the agent Running "
                                     "and Ready")
        timings["install -> all Ready"] = time.monotonic() - t1
        timings["fixture total"] = time.monotonic() - t0
        print(f"[helm-install] {', '.join(f'{k} {v:.1f}s' for k, v in timings.items())}",
              file=sys.__stderr__, flush=True)
        yield rel
    finally:
        if rel.installed:
            subprocess.run([str(chart.ensure_helm()), "uninstall", RELEASE, "-n", NS,
                            "--kubeconfig", str(rc.cp.kubeconfig)], capture_output=True,
                           timeout=120)
        for path in (f"/api/v1/namespaces/{workload_ns}", f"/api/v1/namespaces/{NS}",
                     f"/api/v1/persistentvolumes/{PV_NAME}"):
            with contextlib.suppress(OSError, urllib.error.URLError):
                rc.cp.request("DELETE", path)


# -- the tests -------------------------------------------------------------------------------
def test_every_pod_ready_and_one_core_leads(release: Release) -> None:
    pods = release.all_ready()
    assert pods is not None, release.diagnose()
    for p in _pods(release.rc, NS, "app.kubernetes.io/instance=cfnet"):
        assert p["spec"]["nodeName"] == NODE, p["metadata"]["name"]
    _holder, cores = release.wait(release.one_leader, 90,
                                  "one core holding the Lease, its cfnet_leader alone 1")
    for p in cores:  # both ready by /readyz (leader and follower alike)
        assert _http(release.rc, f"http://{p['status']['podIP']}:9108/readyz")[0] == 200
    # Mosquitto runs as the chart says (never root), and its data volume is writable by it:
    # the kubelet gave the volume to the pod's fsGroup (group-writable, setgid).
    mq = _pods(release.rc, NS, "app.kubernetes.io/name=mosquitto")[0]
    assert mq["spec"]["securityContext"]["runAsUser"] == 1883
    st = (release.rc.node.dir / "pv-mosquitto").stat()
    assert st.st_gid == 1883 and st.st_mode & 0o2070 == 0o2070, oct(st.st_mode)
    log = release.rc.node.pod_log(NS, mq["metadata"]["name"], "mosquitto")
    assert "Opening ipv4 listen socket on port 8883" in log, log[-2000:]
    assert "Error: " not in log and "Unable to" not in log, log[-2000:]


def test_agent_reports_ebpf_through_the_broker(release: Release) -> None:
    """cfnetctl in a pod of the core image, as an operator in the cluster runs it."""
    rc, ns = release.rc, release.workload_ns
    rc.cp.ensure_namespace(ns)
    rc.cp.wait_default_service_account(ns, timeout=60)
    rc.cp.request("POST", f"/api/v1/namespaces/{ns}/secrets", _secret("ops", {
        "password": release.pki / "clients" / "ops" / "password",
        "ca.crt": release.pki / "ca.crt"}))
    _cfnetctl_ebpf_pod(rc, ns, ["--broker-host", f"mosquitto.{NS}.svc"], until_s=90)
    phase = release.wait(lambda: _pod_finished(rc, ns, "cfnetctl"), 150,
                         "cfnetctl's pod to finish", ns=ns)
    log = rc.node.pod_log(ns, "cfnetctl", "ctl")
    agent = _pods(rc, NS, "app.kubernetes.io/name=cfnet-agent")[0]["metadata"]["name"]
    assert phase == "Succeeded", (
        f"the core never showed {NODE} with probe ebpf:\n{log[-3000:]}\n--- agent log\n"
        f"{rc.node.pod_log(NS, agent, 'agent')[-3000:]}")
    # The agent says which probe it loaded (CO-RE: the image has no compiler).
    assert "ebpf probe: loader core" in rc.node.pod_log(NS, agent, "agent")


def test_one_agents_certificate_cannot_publish_as_another_node(release: Release) -> None:
    """One identity per agent (agent.identity: certificate, the chart's default): the agent
    on the node enrolled through a CSR the leading core approved and signed; with that
    certificate, on the broker's certificate listener, its own telemetry is accepted and
    another node's telemetry and status are refused (PUBACK 135)."""
    rc = release.rc
    csrs = [c for c in _get(rc, "/apis/certificates.k8s.io/v1/certificatesigningrequests")
            ["items"] if c["spec"].get("signerName") == "cfnet.io/agent"]
    issued = [c for c in csrs if (c.get("status") or {}).get("certificate")
              and c["spec"].get("extra", {}).get("authentication.kubernetes.io/node-name")
              == [NODE]]
    assert issued, f"no issued cfnet.io/agent CSR for {NODE}: {json.dumps(csrs)[:2000]}"
    state = rc.node.dir / "cfnet-agent-state" / "identity"
    svc = _get(rc, f"/api/v1/namespaces/{NS}/services/mosquitto")
    port = next(p["port"] for p in svc["spec"]["ports"] if p["port"] == 8884)
    # The Service's address, reached from the node's network namespace (kube-proxy there);
    # the broker's certificate names mosquitto.<ns>.svc, so the CA is checked, not the name.
    cannot_publish_as(svc["spec"]["clusterIP"], port, ca_file=release.pki / "ca.crt",
                      certfile=state / "client.crt", keyfile=state / "client.key",
                      node=NODE, other="cfk-other", netns=rc.node.ns, check_hostname=False)


EDGE_NODE = "cfk-edge"
API_NODE_PORT = 30443


def _api_on_the_node(rc: RealCluster) -> None:
    """The API server published on the node's address: a NodePort Service in ``default``
    whose one endpoint is the address it advertises (an EndpointSlice of our own, no
    selector), as a cluster publishes its control plane to devices outside its network.
    kube-proxy masquerades what it forwards there (externalTrafficPolicy Cluster), so the
    answer comes back through the node; the API server's certificate names the node's
    address (tests/cluster/conftest.py)."""
    rc.cp.request("POST", "/api/v1/namespaces/default/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-apiserver-edge"},
        "spec": {"type": "NodePort", "ports": [{"name": "https", "port": 443,
                                                 "targetPort": rc.cp.api_port,
                                                 "nodePort": API_NODE_PORT}]}})
    rc.cp.request("POST", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kube-apiserver-edge", "labels": {
            "kubernetes.io/service-name": "kube-apiserver-edge",
            "endpointslice.kubernetes.io/managed-by": "cfnet-tests"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [rc.cp.advertise_address],
                       "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": rc.cp.api_port, "protocol": "TCP"}]})


def _pod_bound_token(rc: RealCluster, pod: str) -> str:
    """What a device's node agent (the kubelet, edgecore) does for its pods: pod ``pod`` of
    the ``cfnet-agent`` ServiceAccount, bound to EDGE_NODE, and a token for that account
    bound to the pod (TokenRequest with boundObjectRef). The API server then records the
    pod's node in every CSR the token files (docs/security.md, "One identity per agent")."""
    obj = rc.cp.request("POST", f"/api/v1/namespaces/{NS}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
        "spec": {"nodeName": EDGE_NODE, "serviceAccountName": "cfnet-agent",
                 "automountServiceAccountToken": False,
                 "containers": [{"name": "agent", "image": IMAGES["agent"]}]}})
    tr = rc.cp.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/cfnet-agent/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600, "boundObjectRef": {
            "kind": "Pod", "apiVersion": "v1", "name": pod,
            "uid": obj["metadata"]["uid"]}}})
    return str(tr["status"]["token"])


def test_edge_agent_outside_the_cluster_network_enrols_and_reports(
        release: Release, tmp_path: Path) -> None:
    """An edge device whose only route is to the node's address (tests/cluster/edge.py),
    its Node (EDGE_NODE, kwok standing in for its node agent) and, as its node agent would
    give it, a token bound to its agent's pod. The agent, started as ``cfnet-agent`` is,
    files its CSR with the API server through the node's address (the API server published
    on a NodePort), the leading core approves it for that node and signs it, and the agent
    connects to the broker's certificate listener through its NodePort: its reports are
    acknowledged by the core, and nothing of the cluster is reachable from the device but
    the node's address. Prints the time from the agent's start to its first acknowledged
    report."""
    rc = release.rc
    pod = f"cfnet-agent-{EDGE_NODE}"
    device = EdgeDevice(rc.node, tmp_path)
    rc.kwok.node(EDGE_NODE)
    try:
        _api_on_the_node(rc)
        (tmp_path / "token").write_text(_pod_bound_token(rc, pod))
        device.open()
        assert not device.reaches("10.0.0.1") and not device.reaches(rc.cp.advertise_address) \
            and device.reaches(rc.node.node_ip), device.routes()
        # kube-proxy refuses a NodePort until it has programmed the Service's endpoints (a
        # second or so); a device's agent that finds the API server away exits, and its
        # service manager would start it again: here it starts once both answer.
        release.wait(lambda: device.connects(rc.node.node_ip, API_NODE_PORT)
                     and device.connects(rc.node.node_ip, CERT_NODE_PORT), 30,
                     "the API server's and the broker's NodePorts answering the device")
        t0 = time.monotonic()
        device.start_agent({
            "node": EDGE_NODE, "broker_host": rc.node.node_ip, "broker_port": CERT_NODE_PORT,
            "ca_file": str(release.pki / "ca.crt"), "identity": "certificate",
            "identity_dir": str(tmp_path / "identity"),
            "api_server": f"https://{rc.node.node_ip}:{API_NODE_PORT}",
            "api_token_file": str(tmp_path / "token"),
            "api_ca_file": str(rc.cp.dir / "pki" / "ca.crt"),
            "ebpf": False, "probe_port": 17950, "buffer_path": str(tmp_path / "buffer.db")})

        def story() -> str:
            return f"--- edge agent log\n{device.log()}"

        def acked() -> faults.Samples | None:
            assert device.proc is not None and device.proc.poll() is None, story()
            m = device.metrics()
            return m if faults.value(m, "cfnet_agent_connected") == 1 and faults.value(
                m, "cfnet_agent_reports_total", stage="acked") >= 3 else None

        m = release.wait(acked, 120, "the edge agent enrolled, connected through the "
                         "NodePort, its reports acknowledged", story=story)
        took = time.monotonic() - t0
        assert faults.agent_drops(m) == 0
        csrs = [c for c in _get(rc, "/apis/certificates.k8s.io/v1/certificatesigningrequests")
                ["items"] if c["spec"].get("signerName") == "cfnet.io/agent"
                and c["spec"].get("extra", {}).get("authentication.kubernetes.io/node-name")
                == [EDGE_NODE]]
        assert [c["spec"]["username"] for c in csrs] == \
            [f"system:serviceaccount:{NS}:cfnet-agent"], csrs
        conds = {c["type"] for c in csrs[0]["status"].get("conditions") or []}
        assert conds == {"Approved"} and csrs[0]["status"].get("certificate"), csrs
        cert = (tmp_path / "identity" / "client.crt").read_bytes()
        assert cert.strip() == base64.b64decode(csrs[0]["status"]["certificate"]).strip()
        print(f"[edge] agent outside the cluster network: enrolled and first reports "
              f"acknowledged {took:.1f} s after its start", file=sys.__stderr__, flush=True)
    finally:
        device.close()
        for path in (f"/api/v1/namespaces/{NS}/pods/{pod}", f"/api/v1/nodes/{EDGE_NODE}",
                     "/api/v1/namespaces/default/services/kube-apiserver-edge",
                     "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/"
                     "kube-apiserver-edge"):
            with contextlib.suppress(OSError, urllib.error.URLError):
                rc.cp.request("DELETE", path)


def _web_deployment(rc: RealCluster, ns: str) -> None:
    """Deployment ``web`` in ``ns``: 2 replicas scheduled by cfnet onto the real node."""
    rc.cp.ensure_namespace(ns)
    rc.cp.wait_default_service_account(ns, timeout=60)
    rc.cp.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                     "schedulerName": "cfnet-scheduler", "terminationGracePeriodSeconds": 1,
                     "nodeSelector": {"kubernetes.io/hostname": NODE},
                     "containers": [{"name": "main", "image": PODBIN_IMAGE,
                                     "imagePullPolicy": "Never", "args": ["serve", "8080"],
                                     "resources": {"requests": {"cpu": "10m",
                                                                "memory": "16Mi"}}}]}}}})


def test_cfnet_scheduled_deployment_runs_on_the_node(release: Release) -> None:
    rc, ns = release.rc, release.workload_ns
    _web_deployment(rc, ns)

    def running() -> list[dict[str, Any]] | None:
        pods = _pods(rc, ns, "app=web")
        return pods if len(pods) == 2 and all(map(_ready, pods)) else None

    pods = release.wait(running, 120, "2 cfnet-scheduled pods Running", ns=ns)
    events = _get(rc, f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    bound_by = {e["regarding"]["name"]: e.get("reportingController") for e in events
                if e.get("reason") == "Scheduled"}
    for p in pods:
        assert p["spec"]["nodeName"] == NODE
        assert p["spec"]["schedulerName"] == "cfnet-scheduler"
        assert bound_by.get(p["metadata"]["name"]) == "cfnet-scheduler", bound_by


def test_deleting_the_leader_hands_over_and_the_pod_returns(release: Release) -> None:
    """The leader's pod deleted: it releases the Lease on SIGTERM and another Ready core
    takes it (the warm standby, or the replacement pod once its caches are ready: both are
    candidates, as with kube-scheduler), well within one lease duration of the release;
    then the replacement runs and exactly one core leads."""
    rc = release.rc
    holder, cores = release.wait(release.one_leader, 90, "one leading core")
    other = next(p["metadata"]["name"] for p in cores if p["metadata"]["name"] != holder)
    t0 = time.monotonic()
    seen: list[str] = []  # each change of the Lease, with the time since the DELETE
    last_log = {"": ""}  # the deleted holder's log tail while its pod still exists

    def lease_moved() -> str | None:
        lease = _maybe(rc, f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/cfnet-core")
        spec = (lease or {}).get("spec") or {}
        now = (f"holder={spec.get('holderIdentity')!r} renewTime={spec.get('renewTime')} "
               f"transitions={spec.get('leaseTransitions')}")
        if not seen or not seen[-1].endswith(now):
            seen.append(f"t+{time.monotonic() - t0:.1f}s {now}")
        with contextlib.suppress(Exception):
            if log := rc.node.pod_log(NS, holder, "core"):
                last_log[""] = log[-2500:]
        h = str(spec.get("holderIdentity") or "")
        return h if h and h != holder else None

    def story() -> str:
        return ("the Lease after the DELETE of its holder " + holder + " (standby " + other
                + "):\n  " + "\n  ".join(seen) + f"\n--- log {holder}/core (last seen)\n"
                + last_log[""])

    rc.cp.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{holder}")
    new_holder = release.wait(lease_moved, 60, f"the Lease to pass from {holder} to "
                              "another core", story=story)
    took = time.monotonic() - t0
    print(f"lease handed over in {took:.1f} s to {new_holder} "
          f"({'the standby' if new_holder == other else 'the replacement'})")

    def replaced() -> Any:
        got = release.one_leader()
        return got if got and holder not in {p["metadata"]["name"] for p in got[1]} else None

    leader, _pods_now = release.wait(replaced, 150, f"a new core pod Ready in place of "
                                     f"{holder}, {new_holder} leading", story=story)
    assert leader == new_holder, story()  # one handover, no flapping


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def _agent_metrics(rc: RealCluster) -> faults.Samples:
    """The agent's /metrics on the node's host network (agent.metricsPort); asked up to 5
    times (on a loaded machine one fetch may time out)."""
    for _ in range(5):
        code, text = _http(rc, "http://127.0.0.1:9109/metrics")
        if code == 200:
            return faults.samples(text)
        time.sleep(1)
    raise AssertionError(f"agent /metrics: {code} {text[:300]}")


def _leader_metrics(release: Release) -> faults.Samples:
    holder = release.lease_holder()
    pod = next(p for p in release.core_pods() if p["metadata"]["name"] == holder)
    code, text = _http(release.rc, f"http://{pod['status']['podIP']}:9108/metrics")
    assert code == 200, f"leader /metrics: {code}"
    return faults.samples(text)


def _scale(rc: RealCluster, ns: str, name: str, replicas: int) -> None:
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale"
    scale = _get(rc, path)
    scale["spec"]["replicas"] = replicas
    rc.cp.request("PUT", path, scale)


def _core_samples(release: Release) -> dict[str, faults.Samples]:
    """The /metrics of every core pod with an address, terminating ones too (their last
    reports count), fetched by one process in the node's network namespace."""
    ips = {p["metadata"]["name"]: p["status"]["podIP"]
           for p in _pods(release.rc, NS, "app.kubernetes.io/name=cfnet-core")
           if (p.get("status") or {}).get("podIP")}
    out = _in_node(release.rc, (
        "import json, urllib.request\nout = {}\n"
        f"for name, ip in {ips!r}.items():\n"
        "    try:\n"
        "        r = urllib.request.urlopen('http://' + ip + ':9108/metrics', timeout=2)\n"
        "        out[name] = r.read().decode()\n"
        "    except OSError:\n"
        "        pass\n"
        "print(json.dumps(out))\n"), timeout=20)
    return {k: faults.samples(v) for k, v in (json.loads(out) if out else {}).items()}


def _sample(release: Release, watch: faults.CoreWatch, t0: float) -> None:
    watch.add(time.monotonic() - t0, _core_samples(release), release.lease_holder())


def test_sigkilled_leader_stays_down_and_the_standby_takes_over(release: Release) -> None:
    """The leading core's container SIGKILLed through containerd (a crash: no SIGTERM, the
    Lease is not released), and each container the kubelet restarts in its pod killed too
    until the standby holds the Lease (a leader that stays down: a restart in time would
    take its own Lease back, as its identity is its pod's name). The standby takes the
    Lease once it expires; the kubelet's restart then comes back as a follower: sampled
    all along, never two cores report cfnet_leader 1, and exactly one leads at the end.
    The pods scaled up across the handover are each bound once, by cfnet; the agent loses
    no report and its reports are acknowledged again. Prints the handover (the first
    SIGKILL to the standby's renewal)."""
    rc, ns = release.rc, release.workload_ns
    holder, cores = release.wait(release.one_leader, 90, "one leading core")
    standby = next(p["metadata"]["name"] for p in cores if p["metadata"]["name"] != holder)
    pod = next(p for p in cores if p["metadata"]["name"] == holder)
    restarts = int(faults.container(pod, "core").get("restartCount") or 0)
    agent0 = _agent_metrics(rc)
    watch = faults.CoreWatch()
    killed = [faults.container_id(pod, "core")]
    faults.sigkill(rc.node._ctr, _run, killed[0])
    t0 = time.monotonic()
    _scale(rc, ns, "web", 4)  # pods to place while the Lease is in limbo

    def taken_by_the_standby() -> str | None:
        st = faults.container(_get(rc, f"/api/v1/namespaces/{NS}/pods/{holder}"), "core")
        cid = str(st.get("containerID") or "").partition("://")[2]
        if "running" in (st.get("state") or {}) and cid and cid not in killed:
            faults.sigkill(rc.node._ctr, _run, cid)  # the restart, down again
            killed.append(cid)
        _sample(release, watch, t0)
        return standby if watch.leaders[-1][2] == standby else None

    def story() -> str:
        return (f"killed {holder}'s containers {killed}; samples (t, leaders, holder):\n  "
                + "\n  ".join(f"{s[0]:.1f} {s[1]} {s[2]}" for s in watch.leaders[-40:]))

    release.wait(taken_by_the_standby, 90, f"the standby {standby} to take the Lease",
                 story=story)
    handover = time.monotonic() - t0

    def restarted() -> bool:
        _sample(release, watch, t0)
        p = _get(rc, f"/api/v1/namespaces/{NS}/pods/{holder}")
        return int(faults.container(p, "core").get("restartCount") or 0) > restarts \
            and _ready(p) and faults.container_id(p, "core") not in killed

    release.wait(restarted, 180, f"the kubelet to restart {holder}'s core container, Ready",
                 story=story)
    leader, _ = release.wait(release.one_leader, 90, "exactly one leading core", story=story)
    _sample(release, watch, t0)
    assert leader == standby, story()  # the restarted replica did not take it back
    assert not watch.two_leaders(), story()
    assert watch.holders() == [holder, standby], story()  # never back to the old one

    def web_running() -> list[dict[str, Any]] | None:
        pods = _pods(rc, ns, "app=web")
        return pods if len(pods) == 4 and all(map(_ready, pods)) else None

    pods = release.wait(web_running, 150, "4 cfnet-scheduled pods Running", ns=ns)
    for p in pods:  # bound to the node through cfnet's binding (no other scheduler is named)
        assert p["spec"]["nodeName"] == NODE and p["spec"]["schedulerName"] == "cfnet-scheduler"
        assert any(c.get("type") == "PodScheduled" and c.get("status") == "True"
                   for c in p["status"].get("conditions") or []), p["status"]
    # A binding is made once by the API server (a second one is a 409); the Events are the
    # cores' own account and must never claim two. An Event may be missing: the recorder
    # sends from a queue, and a restarted container that took its own Lease back and bound a
    # pod can be SIGKILLed before the queue drains (kube-scheduler's broadcaster alike).
    counts = faults.scheduled_per_pod(
        _get(rc, f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"])
    names = {p["metadata"]["name"] for p in pods}
    assert all(counts.get(n, 0) <= 1 for n in names), counts  # never bound twice
    assert sum(counts.get(n, 0) for n in names) >= 2, counts  # the first two, before the kill

    def acked_again() -> faults.Samples | None:
        m = _agent_metrics(rc)
        acked = faults.value(m, "cfnet_agent_reports_total", stage="acked")
        return m if acked >= faults.value(agent0, "cfnet_agent_reports_total",
                                          stage="acked") + 5 else None

    agent1 = release.wait(acked_again, 90, "the agent's reports acknowledged again")
    assert faults.agent_drops(agent1) == faults.agent_drops(agent0) == 0
    print(f"[faults] leader {holder} SIGKILLed ({len(killed)} containers): the standby "
          f"{standby} renewed the Lease {handover:.1f} s after the first kill; "
          f"{len(watch.leaders)} samples, never two leaders", file=sys.__stderr__, flush=True)


def test_broker_killed_agents_buffer_then_drain(release: Release) -> None:
    """Mosquitto's container SIGKILLed through containerd: the agent buffers while the kubelet
    restarts the broker, then drains its buffer; no report lost (nothing thinned, expired or
    refused), none ingested twice (the leader's accepted reports grow by exactly what the
    agent had taken and no longer holds). Prints the outage and the drain."""
    rc = release.rc
    mq = _pods(rc, NS, "app.kubernetes.io/name=mosquitto")[0]
    restarts = int(faults.container(mq, "mosquitto").get("restartCount") or 0)

    def quiet() -> tuple[faults.Samples, faults.Samples] | None:
        a = _agent_metrics(rc)
        return (a, _leader_metrics(release)) if faults.value(
            a, "cfnet_agent_buffer_reports") <= 1 else None

    agent0, leader0 = release.wait(quiet, 60, "the agent's buffer drained before the kill")
    t0 = time.monotonic()
    faults.sigkill(rc.node._ctr, _run, faults.container_id(mq, "mosquitto"))
    peak = {"depth": 0.0, "disconnected": 0.0}

    def broker_back() -> bool:
        # The agent watched meanwhile: how many reports wait, whether it saw the broker go.
        m = _agent_metrics(rc)
        peak["depth"] = max(peak["depth"], faults.value(m, "cfnet_agent_buffer_reports"))
        if faults.value(m, "cfnet_agent_connected") == 0:
            peak["disconnected"] = 1.0
        p = _pods(rc, NS, "app.kubernetes.io/name=mosquitto")[0]
        return int(faults.container(p, "mosquitto").get("restartCount") or 0) > restarts \
            and _ready(p)

    release.wait(broker_back, 120, "the kubelet to restart Mosquitto, Ready")
    t_back = time.monotonic()

    def drained() -> tuple[faults.Samples, faults.Samples] | None:
        m = _agent_metrics(rc)
        peak["depth"] = max(peak["depth"], faults.value(m, "cfnet_agent_buffer_reports"))
        if faults.value(m, "cfnet_agent_connected") != 1 or \
                faults.value(m, "cfnet_agent_buffer_reports") > 1:
            return None
        return m, _leader_metrics(release)

    agent1, leader1 = release.wait(drained, 120, "the agent's buffer drained")
    drain = time.monotonic() - t_back
    # The outage reached the agent: it saw the broker gone, or reports piled up meanwhile.
    assert peak["disconnected"] or peak["depth"] >= 2, peak
    assert faults.agent_drops(agent1) == faults.agent_drops(agent0) == 0

    def held(m: faults.Samples) -> float:  # taken and not yet acknowledged
        return faults.value(m, "cfnet_agent_reports_total", stage="taken") - \
            faults.value(m, "cfnet_agent_buffer_reports")

    accepted = (faults.value(leader1, "cfnet_reports_total", result="accepted")
                - faults.value(leader0, "cfnet_reports_total", result="accepted"))
    # The two scrapes are not one instant: a report a second may land between them.
    assert abs(accepted - (held(agent1) - held(agent0))) <= 2, (accepted, held(agent1),
                                                                 held(agent0))
    print(f"[faults] broker SIGKILLed: back Ready {t_back - t0:.1f} s after the kill, "
          f"peak buffer {peak['depth']:.0f} reports, drained {drain:.1f} s after",
          file=sys.__stderr__, flush=True)


def _agent_csrs(rc: RealCluster) -> list[str]:
    return [c["metadata"]["name"] for c in
            _get(rc, "/apis/certificates.k8s.io/v1/certificatesigningrequests")["items"]
            if c["spec"].get("signerName") == "cfnet.io/agent"]


def test_node_services_restart_and_everything_returns(release: Release) -> None:
    """The node's kubelet and containerd stopped, every container with them, and started
    again (a reboot of the node's services): the release's pods return Running and Ready with
    one leader; the agent starts from its state directory on the node, with the certificate
    it already holds (no new CSR) and its buffer (nothing thinned, expired or refused), and
    its reports are acknowledged again. Prints the time to a Ready node and to every pod."""
    rc = release.rc
    cert = rc.node.dir / "cfnet-agent-state" / "identity" / "client.crt"
    before = (cert.read_bytes(), _agent_csrs(rc))
    agent0 = _agent_metrics(rc)
    def containers() -> dict[str, str]:
        return {p["metadata"]["name"]: str(c.get("containerID"))
                for p in _pods(rc, NS, "app.kubernetes.io/instance=cfnet")
                for c in (p.get("status") or {}).get("containerStatuses") or []}

    old = containers()
    t0 = time.monotonic()
    node_ready = rc.node.restart_services()

    def returned() -> bool:
        now = containers()  # every container a new one (the API may still show the old Ready)
        return bool(now) and not set(now.items()) & set(old.items()) and bool(
            release.all_ready())

    release.wait(returned, 300, "every pod of the release back in new containers, Ready")
    back = time.monotonic() - t0
    release.wait(release.one_leader, 90, "one leading core")

    def acked() -> faults.Samples | None:
        m = _agent_metrics(rc)
        return m if faults.value(m, "cfnet_agent_reports_total", stage="acked") >= 3 else None

    agent1 = release.wait(acked, 120, "the restarted agent's reports acknowledged")
    assert faults.agent_drops(agent1) == faults.agent_drops(agent0) == 0
    assert (cert.read_bytes(), _agent_csrs(rc)) == before  # the same identity, no new CSR
    print(f"[faults] kubelet and containerd restarted: node Ready {node_ready:.1f} s, every "
          f"pod Ready {back:.1f} s after the stop", file=sys.__stderr__, flush=True)


def _scrape_targets(rc: RealCluster, d: Path) -> None:
    """The release's pods with a ``metrics`` port, as Kubernetes service discovery's role
    ``pod`` lists them (address, job = app.kubernetes.io/name, namespace, pod), into the
    file Prometheus reads: Debian's prometheus 2.42 is built without Kubernetes service
    discovery, so the API server's pod list is read here instead."""
    groups = []
    for p in _get(rc, f"/api/v1/namespaces/{NS}/pods")["items"]:
        ip = (p.get("status") or {}).get("podIP")
        name = (p["metadata"].get("labels") or {}).get("app.kubernetes.io/name", "")
        if not ip or name not in ("cfnet-core", "cfnet-agent"):
            continue
        for c in p["spec"]["containers"]:
            for port in c.get("ports") or []:
                if port.get("name") == "metrics":
                    groups.append({"targets": [f"{ip}:{port['containerPort']}"],
                                   "labels": {"job": name, "namespace": NS,
                                              "pod": p["metadata"]["name"]}})
    tmp = d / "targets.json.tmp"
    tmp.write_text(json.dumps(groups))
    tmp.replace(d / "targets.json")


def _prometheus_config(rc: RealCluster, d: Path) -> Path:
    """A Prometheus configuration: cfnet's rules (CfnetAgentStale's ``for`` cut to 10 s, so
    the test waits 40 s, not 90 s) and one scrape job over the release's pods' ``metrics``
    ports (both cores and the agent on the node's host network, :func:`_scrape_targets`),
    every 2 s."""
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "cfnet-rules.yaml").read_text())
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] == "CfnetAgentStale":
            rule["for"] = "10s"
    (d / "rules.yaml").write_text(yaml.safe_dump(rules))
    _scrape_targets(rc, d)
    cfg = {"global": {"scrape_interval": "2s", "evaluation_interval": "2s",
                      "scrape_timeout": "2s"},
           "rule_files": [str(d / "rules.yaml")],
           "scrape_configs": [{"job_name": "cfnet", "file_sd_configs": [
               {"files": [str(d / "targets.json")], "refresh_interval": "2s"}]}]}
    (d / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    return d / "prometheus.yml"


def test_prometheus_scrapes_cfnet_and_the_agent_stale_alert_fires(
        release: Release, tmp_path: Path) -> None:
    """Debian's Prometheus in the node's network namespace, scraping the core replicas and the
    agent found in the API server's pod list: all three scraped (up 1), one leader
    (sum of cfnet_leader), the agent's loader core; then the agent stopped (its DaemonSet
    moved off the node): CfnetAgentStale fires; the agent returns."""
    rc = release.rc
    exe = shutil.which("prometheus")
    assert exe, "prometheus not found: tools/setup.sh installs Debian's prometheus package"
    cfg = _prometheus_config(rc, tmp_path)
    port = 19090
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{rc.node.ns}", exe,
                             f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=log)
    log.close()
    ds_path = f"/apis/apps/v1/namespaces/{NS}/daemonsets/cfnet-agent"
    moved = False

    def query(q: str) -> list[dict[str, Any]]:
        code, body = _http(rc, f"http://127.0.0.1:{port}/api/v1/query?query="
                               + urllib.parse.quote(q))
        return list(json.loads(body)["data"]["result"]) if code == 200 else []

    def story() -> str:
        return f"--- prometheus log\n{(tmp_path / 'prometheus.log').read_text()[-2000:]}"

    try:
        def scraped() -> list[str] | None:
            up = query('up{namespace="cfnet-system"} == 1')
            jobs = sorted(r["metric"]["job"] for r in up)
            return jobs if jobs == ["cfnet-agent", "cfnet-core", "cfnet-core"] else None

        release.wait(scraped, 90, "Prometheus scraping 2 cores and the agent", story=story)
        release.wait(lambda: [r for r in query("sum(cfnet_leader)") if r["value"][1] == "1"],
                     30, "sum(cfnet_leader) == 1 in Prometheus", story=story)
        assert query('cfnet_agent_loader{loader="core"} == 1'), story()
        ds = _get(rc, ds_path)
        ds["spec"]["template"]["spec"]["nodeSelector"] = {"cfnet-test/stopped": "yes"}
        rc.cp.request("PUT", ds_path, ds)
        moved = True
        release.wait(lambda: not _pods(rc, NS, "app.kubernetes.io/name=cfnet-agent"), 90,
                     "the agent stopped")
        t0 = time.monotonic()

        def firing() -> list[dict[str, Any]] | None:
            code, body = _http(rc, f"http://127.0.0.1:{port}/api/v1/alerts")
            alerts = json.loads(body)["data"]["alerts"] if code == 200 else []
            return [a for a in alerts if a["labels"]["alertname"] == "CfnetAgentStale"
                    and a["state"] == "firing"] or None

        (alert,) = release.wait(firing, 120, "CfnetAgentStale firing", story=story)
        assert alert["labels"]["namespace"] == NS and alert["labels"]["severity"] == "warning"
        print(f"[prometheus] CfnetAgentStale firing {time.monotonic() - t0:.1f} s after the "
              "agent stopped", file=sys.__stderr__, flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
        if moved:
            ds = _get(rc, ds_path)
            ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
            rc.cp.request("PUT", ds_path, ds)
    release.wait(lambda: (p := _pods(rc, NS, "app.kubernetes.io/name=cfnet-agent"))
                 and _ready(p[0]), 120, "the agent back, Ready")


def _buffer(rc: RealCluster) -> tuple[int, int, int]:
    """The agent's report buffer on the node (its SQLite file in the state directory, read
    only): (reports ever put in it, reports in it now, reports dropped for good: thinned,
    expired, refused). All three outlive the agent's process, which its /metrics do not."""
    db = sqlite3.connect(f"file:{rc.node.dir / 'cfnet-agent-state' / 'buffer.db'}?mode=ro",
                         uri=True, timeout=5)
    try:
        seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name='reports'").fetchone()
        depth = db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]
        drops = db.execute("SELECT COALESCE(SUM(v), 0) FROM meta WHERE k IN "
                           "('thinned', 'expired', 'refused')").fetchone()[0]
    finally:
        db.close()
    return int(seq[0]) if seq else 0, int(depth), int(drops)


def _names(release: Release, app: str) -> set[str]:
    return {p["metadata"]["name"] for p in _pods(release.rc, NS, f"app.kubernetes.io/name={app}")
            if p["metadata"].get("deletionTimestamp") is None}


def _web_bindings(release: Release) -> dict[str, tuple[str, str, int]]:
    """The cfnet-scheduled ``web`` pods (created when missing, waited for Running): name ->
    (uid, node, bindings seen as Scheduled events)."""
    rc, ns = release.rc, release.workload_ns
    if _maybe(rc, f"/apis/apps/v1/namespaces/{ns}/deployments/web") is None:
        _web_deployment(rc, ns)

    def running() -> list[dict[str, Any]] | None:
        pods = _pods(rc, ns, "app=web")
        return pods if pods and all(map(_ready, pods)) else None

    pods = release.wait(running, 120, "the cfnet-scheduled pods Running", ns=ns)
    counts = faults.scheduled_per_pod(
        _get(rc, f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"])
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"],
                                    counts.get(p["metadata"]["name"], 0)) for p in pods}


def _drained(rc: RealCluster) -> tuple[int, int, int] | None:
    b = _buffer(rc)
    return b if b[1] <= 1 else None


def _install_previous_chart(release: Release) -> None:
    """The release back on the previous release's chart (PREVIOUS_CHART, the release's own
    values, which it accepts as they are): its agent (no health port) and Mosquitto roll;
    returns once they are new and Ready, one core leads and the agent's reports are taken
    and acknowledged through the broker."""
    agent, broker = _names(release, "cfnet-agent"), _names(release, "mosquitto")
    _helm(release.rc, "upgrade", RELEASE, str(PREVIOUS_CHART), *release.helm_args())

    def rolled() -> bool:
        return bool(release.all_ready()) and not (_names(release, "cfnet-agent") & agent) \
            and not (_names(release, "mosquitto") & broker)

    release.wait(rolled, 180, "the previous chart's agent and Mosquitto Ready")
    release.wait(release.one_leader, 90, "one leading core")
    start = _buffer(release.rc)[0]
    release.wait(lambda: (b := _buffer(release.rc))[0] >= start + 3 and b[1] <= 1, 90,
                 "the previous chart's agent taking reports that the core acknowledges")


def test_upgrade_from_the_previous_chart_with_the_agent_reporting(release: Release) -> None:
    """`helm upgrade` from the previous release's chart (tests/cluster/charts: 0.1.0; the
    images are today's, only the chart changes) to the current one while the agent reports,
    with cfnet-scheduled pods running. The release is first put on the previous chart with
    its own values (accepted unchanged); the upgrade then rolls the agent (the health port
    and probes are new), Mosquitto (its configuration changed) and, with one changed value
    as a new core version would, both core replicas (core.logFormat=json). Sampled about
    every second until everything is new and Ready, one core leads and the agent's buffer
    is drained: never two cores report cfnet_leader 1 and the Lease passes once, from an
    old core to a new one; the agent loses no report (nothing thinned, expired or refused in its buffer, which
    outlives its process) and the cores count none twice: the reports accepted over the
    upgrade, summed over every core process, equal the reports put in the agent's buffer
    and gone from it (within 2: the scrapes are not one instant); no pod is re-bound (the
    web pods keep their UIDs, nodes and single Scheduled event). Prints the roll's time
    and the Lease's holders."""
    rc = release.rc
    web = _web_bindings(release)
    t_prev = time.monotonic()
    _install_previous_chart(release)
    prev = time.monotonic() - t_prev
    # What an operator passes without the install's values at hand (docs/install.md):
    # --reuse-values renders the new templates with the previous chart's defaults, where a
    # key new since has no value, and fails; --reset-then-reuse-values takes the new
    # chart's defaults under the release's values (both checked by the API server).
    def dry_run(flag: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(chart.ensure_helm()), "upgrade", RELEASE, str(chart.CHART),
                               "-n", NS, flag, "--dry-run=server", "--kubeconfig",
                               str(rc.cp.kubeconfig)], capture_output=True, text=True,
                              timeout=60)

    reuse, reset = dry_run("--reuse-values"), dry_run("--reset-then-reuse-values")
    assert reuse.returncode != 0 and ".Values.prometheusRule.enabled" in reuse.stderr, \
        reuse.stderr
    assert reset.returncode == 0 and "metrics_port: 9109" in reset.stdout, reset.stderr
    release.wait(release.one_leader, 90, "one leading core")
    watch = faults.CoreWatch()
    t0 = time.monotonic()
    agent0 = release.wait(lambda: _drained(rc), 60, "the agent's buffer drained before the "
                                                    "upgrade")
    _sample(release, watch, t0)
    before = set(watch.last)
    agent, broker = _names(release, "cfnet-agent"), _names(release, "mosquitto")
    # Kept in the release's values: the next upgrade then leaves the cores as they are.
    release.values.append("core.logFormat=json")
    _helm(rc, "upgrade", RELEASE, str(chart.CHART), *release.helm_args())

    def rolled() -> tuple[int, int, int] | None:
        _sample(release, watch, t0)
        cores = {p["metadata"]["name"] for p in release.core_pods()}
        if len(cores) != 2 or cores & before or _names(release, "cfnet-agent") & agent \
                or _names(release, "mosquitto") & broker or not release.all_ready() \
                or release.one_leader() is None:
            return None
        m = _agent_metrics(rc)  # the current chart's agent serves them
        b = _buffer(rc)
        return b if faults.value(m, "cfnet_agent_connected") == 1 and b[1] <= 1 else None

    def story() -> str:
        return ("samples (t, leaders, holder):\n  "
                + "\n  ".join(f"{s[0]:.1f} {s[1]} {s[2]}" for s in watch.leaders[-60:]))

    agent1 = release.wait(rolled, 300, "new cores (one leading), agent and Mosquitto, the "
                                       "agent's buffer drained", story=story)
    took = time.monotonic() - t0
    _sample(release, watch, t0)
    assert not watch.two_leaders(), story()
    # The Lease passes once, from an old core to a new one: the chart's roll starts both
    # new replicas and removes the old ones together (core.rollingUpdate), so the old
    # follower is never left alone to take it.
    holders = watch.holders()
    assert len(holders) == 2 and holders[0] in before and holders[1] not in before, story()
    assert agent1[2] == agent0[2] == 0, (agent0, agent1)  # nothing dropped
    handed = (agent1[0] - agent0[0]) - (agent1[1] - agent0[1])
    accepted = watch.accepted(before)
    assert abs(accepted - handed) <= 2, (accepted, handed, watch.first, watch.last, story())
    assert _web_bindings(release) == web  # the same pods, on the same node, bound once
    print(f"[upgrade] back to the previous chart, its agent reporting, in {prev:.1f} s; "
          f"previous chart -> current with the agent reporting in {took:.1f} s: "
          f"{accepted:.0f} reports accepted once ({handed} handed over), "
          f"{sum(watch.duplicates.values()):.0f} redeliveries recognised, Lease holders "
          f"{' -> '.join(watch.holders())}, {len(web)} web pods kept",
          file=sys.__stderr__, flush=True)


def test_upgrade_takes_effect_and_uninstall_leaves_nothing(release: Release) -> None:
    rc = release.rc
    old = _pods(rc, NS, "app.kubernetes.io/name=cfnet-agent")[0]["metadata"]["name"]
    _helm(rc, "upgrade", RELEASE, str(chart.CHART), *release.helm_args(),
          "--set", "agent.probePort=7951")

    def listening() -> bool:
        pods = _pods(rc, NS, "app.kubernetes.io/name=cfnet-agent")
        if not (len(pods) == 1 and _ready(pods[0]) and pods[0]["metadata"]["name"] != old):
            return False
        out = rc.node.exec_in_ns(["ss", "-Htln", "sport = :7951"], check=False).stdout
        return "7951" in out

    release.wait(listening, 120, "the upgraded agent (a new pod) listening on 7951")
    assert "7950" not in rc.node.exec_in_ns(["ss", "-Htln", "sport = :7950"]).stdout

    _helm(rc, "uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s", timeout=150)
    release.installed = False

    def leftovers() -> list[str]:
        left = []
        for api in ("/api/v1", "/apis/apps/v1", "/apis/policy/v1",
                    "/apis/rbac.authorization.k8s.io/v1", "/apis/coordination.k8s.io/v1",
                    "/apis/discovery.k8s.io/v1"):
            for res in _get(rc, api)["resources"]:
                if "/" in res["name"] or "list" not in res["verbs"]:
                    continue
                path = (f"{api}/namespaces/{NS}/{res['name']}" if res["namespaced"]
                        else f"{api}/{res['name']}")
                for o in _get(rc, path)["items"]:
                    m = o["metadata"]
                    if res["namespaced"] and (
                            # the operator's own (README: kubectl create secret), not the
                            # release's; and what Kubernetes keeps in every namespace
                            m["name"] in ("mosquitto-auth", "default", "kube-root-ca.crt")
                            or res["name"] == "events"):
                        continue
                    # The test's own volume, and the namespace --create-namespace made
                    # (helm never deletes a namespace).
                    if m["name"] in (PV_NAME, NS):
                        continue
                    labels = m.get("labels") or {}
                    if res["namespaced"] or labels.get("app.kubernetes.io/part-of") == "cfnet" \
                            or m["name"].startswith("cfnet"):
                        left.append(f"{res['kind']} {m['name']}")
        return left

    release.wait(lambda: not leftovers() or None, 60, "nothing of the release left")
    assert leftovers() == []
    webhooks = [w["metadata"]["name"] for kind in ("mutatingwebhookconfigurations",
                                                   "validatingwebhookconfigurations")
                for w in _get(rc, f"/apis/admissionregistration.k8s.io/v1/{kind}")["items"]]
    assert not [w for w in webhooks if "cfnet" in w], webhooks
