"""One identity per agent, end to end: a real kube-apiserver, `cfnet-core --kubernetes` as the
chart runs it, a real Mosquitto with the agents' certificate listener, and the real agent.

(a) A pod on node A, a token bound to it for the agent ServiceAccount (deploy/k8s's RBAC, as
the chart renders it): the agent files its CSR with that token, the leading core approves and
signs it, the agent connects on the certificate listener and the core acknowledges its
reports as node A. (c) With node A's certificate, node B's telemetry topic is refused by the
broker (PUBACK 135, "not authorized"), never reaches a subscriber, and the core never
acknowledges node B. (b) The same token asking for CN = B, a token bound to no pod, and a
pod-bound token of another ServiceAccount are Denied with their reason and an Event.
(d) Hostile CSRs (huge, bad CN characters, server usages, weak keys), more than one pass
handles, are each Denied while an honest CSR filed after them is still issued promptly.
"""

from __future__ import annotations

import base64
import contextlib
import queue
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from paho.mqtt.enums import CallbackAPIVersion

from cloud_core.errors import KubeConflict, KubeForbidden, KubeNotFound
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.enroll import CSR_PATH, SIGNER_NAME, AgentEnroller, ca_from_secret
from edge_agent import wire
from edge_agent.enroll import (
    EnrollError,
    EnrollSettings,
    Renewer,
    ensure_identity,
    load_or_make_key,
    request_certificate,
)
from tests.k8s.conftest import DEPLOY, Cluster, load_manifests, wait_for
from tools.broker import Broker, free_port
from tools.envtest import ControlPlane
from tools.identity_probe import cannot_publish_as
from tools.procs import stop_all

NS = "cfnet-system"  # deploy/k8s's namespace: the agent ServiceAccount and its RBAC
AGENT_SA = "cfnet-agent"


def core_command() -> list[str]:
    exe = Path(sys.executable).parent / "cfnet-core"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cloud_core.main"]


def bound_token(admin: KubeClient, sa: str, node: str) -> tuple[str, str]:
    """A pod of ServiceAccount ``sa`` on ``node`` and a token bound to it (what the
    kubelet's projected volume holds); returns (token, pod name)."""
    name = f"agent-{uuid.uuid4().hex[:8]}"
    pod = admin.create(f"/api/v1/namespaces/{NS}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {"serviceAccountName": sa, "automountServiceAccountToken": False,
                 "nodeName": node, "containers": [{"name": "a", "image": "cfnet-agent:x"}]}})
    tr = admin.create(f"/api/v1/namespaces/{NS}/serviceaccounts/{sa}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600, "boundObjectRef": {
            "kind": "Pod", "apiVersion": "v1", "name": name, "uid": pod["metadata"]["uid"]}}})
    return str(tr["status"]["token"]), name


def unbound_token(admin: KubeClient, sa: str) -> str:
    tr = admin.create(f"/api/v1/namespaces/{NS}/serviceaccounts/{sa}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}})
    return str(tr["status"]["token"])


class Watcher:
    """A password-listener client that sees every node's telemetry and the core's acks (a
    core-role account reads telemetry; acks are read by the sim role: two accounts)."""

    def __init__(self, broker: Broker) -> None:
        self.got: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.seen: list[str] = []
        self.clients = []
        for name, role, topic in (("core-watch", "core", wire.TELEMETRY_WILDCARD),
                                  ("sim-watch", "sim", wire.ACK_WILDCARD)):
            creds = broker.add_account(name, role)  # type: ignore[arg-type]
            c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=name,
                            protocol=mqtt.MQTTv5)
            c.username_pw_set(creds.username, creds.password)
            c.tls_set(ca_certs=str(broker.ca_file))
            subscribed: queue.Queue[bool] = queue.Queue()
            c.on_message = lambda _c, _u, m: self._on(m)
            c.on_subscribe = lambda *_a, q=subscribed: q.put(True)
            c.on_connect = lambda cl, *_a, t=topic: cl.subscribe(t, qos=1)
            c.connect(broker.host, broker.port)
            c.loop_start()
            subscribed.get(timeout=10)
            self.clients.append(c)

    def _on(self, m: mqtt.MQTTMessage) -> None:
        self.seen.append(m.topic)
        self.got.put((m.topic, m.payload))

    def wait(self, topic: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while topic not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no message on {topic} within {timeout}s "
                                     f"(seen: {sorted(set(self.seen))})")
            with contextlib.suppress(queue.Empty):
                self.got.get(timeout=left)

    def close(self) -> None:
        for c in self.clients:
            c.loop_stop()
            c.disconnect()


def denial(admin: KubeClient, name: str) -> tuple[str, str]:
    obj = admin.get(f"{CSR_PATH}/{name}")
    (cond,) = [c for c in obj["status"].get("conditions", []) if c["type"] == "Denied"]
    return cond["reason"], cond["message"]


def csr_events(admin: KubeClient, name: str) -> list[dict[str, Any]]:
    evs = admin.list("/apis/events.k8s.io/v1/namespaces/default/events")[0]
    return [e for e in evs if (e.get("regarding") or {}).get("name") == name]


@pytest.fixture(scope="module")
def shipped_rbac(control_plane: ControlPlane) -> Iterator[None]:
    """deploy/k8s's ServiceAccounts and RBAC (rendered from the chart), as installed."""
    admin = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    for f in ("namespace.yaml", "rbac.yaml"):
        for obj in load_manifests(DEPLOY / f):
            admin.apply(obj)
    admin.close()
    yield


@pytest.fixture
def stack(control_plane: ControlPlane, admin: KubeClient, cluster: Cluster, shipped_rbac: None,
          tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The core (leading, with the agent CA it made) and the broker with both listeners."""
    ca_path = tmp_path / "agent-ca.crt"
    broker = Broker(tmp_path / "broker", agent_ca=ca_path)
    core = broker.add_account("core-id", "core")
    (tmp_path / "core.pw").write_text(core.password)
    err = open(tmp_path / "core.stderr", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*core_command(), "--kubernetes", "--kubeconfig", str(control_plane.kubeconfig),
         "--identity", "core-id", "--lease-namespace", cluster.namespace,
         "--lease-name", "identity", "--lease-duration", "3",
         "--agent-ca-secret", f"{cluster.namespace}/agent-ca",
         "--agent-service-account", f"{NS}:{AGENT_SA}",
         "--broker-host", broker.host, "--broker-port", str(broker.port),
         "--username", "core-id", "--password-file", str(tmp_path / "core.pw"),
         "--ca-file", str(broker.ca_file), "--db", str(tmp_path / "core.db"),
         "--ack-interval", "0.3", "--table-every", "0"],
        stdout=subprocess.DEVNULL, stderr=err)
    try:
        # The leader makes the agent CA Secret; the broker trusts its certificate only.
        secret = wait_for(lambda: admin.get(f"/api/v1/namespaces/{cluster.namespace}/"
                                            "secrets/agent-ca"), timeout=30,
                          what="the agent CA Secret made by the leading core")
        assert secret["type"] == "kubernetes.io/tls"
        ca_path.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
        broker.start()
        yield {"broker": broker, "proc": proc, "tmp": tmp_path,
               "a": cluster.node(f"id-a-{uuid.uuid4().hex[:6]}", region="eu")["metadata"]
               ["name"],
               "b": cluster.node(f"id-b-{uuid.uuid4().hex[:6]}", region="eu")["metadata"]
               ["name"]}
    finally:
        stop_all([proc], grace_s=20)
        err.close()
        broker.stop()
        for p in admin.list(f"/api/v1/namespaces/{NS}/pods")[0]:
            if p["metadata"]["name"].startswith("agent-"):
                with contextlib.suppress(KubeNotFound):
                    admin.delete(f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}",
                                 grace_period_s=0)


def settings(control_plane: ControlPlane, tmp: Path, node: str, token: str,
             timeout_s: float = 30) -> EnrollSettings:
    tf = tmp / f"token-{uuid.uuid4().hex[:6]}"
    tf.write_text(token)
    assert control_plane.admin is not None
    return EnrollSettings(node=node, identity_dir=tmp / f"id-{node}",
                          api_server=control_plane.admin.host, token_file=tf,
                          ca_file=Path(control_plane.admin.ca_file), timeout_s=timeout_s,
                          poll_s=0.2)


def run_agent(control_plane: ControlPlane, broker: Broker, tmp: Path, node: str,
              token: str) -> subprocess.Popen[bytes]:
    """The real agent (cfnet-agent's main) with identity certificate, as the chart's
    agent.yaml configures it (sock_diag: no eBPF needed here)."""
    tf = tmp / "agent-token"
    tf.write_text(token)
    assert control_plane.admin is not None
    conf = {"node": node, "broker_host": broker.host, "broker_port": broker.cert_port,
            "tls": True, "ca_file": str(broker.ca_file), "identity": "certificate",
            "identity_dir": str(tmp / "agent-state" / "identity"),
            "api_server": control_plane.admin.host, "api_token_file": str(tf),
            "api_ca_file": str(control_plane.admin.ca_file), "enroll_timeout_s": 30,
            "ebpf": False, "active_probing": False, "interval_s": 0.2,
            "probe_port": free_port(), "buffer_path": str(tmp / "agent-state" / "buffer.db")}
    (tmp / "agent.yaml").write_text(yaml.safe_dump(conf))
    return subprocess.Popen([sys.executable, "-m", "edge_agent.main", "--config",
                             str(tmp / "agent.yaml")],
                            stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "agent.stderr", "wb"))


def test_agent_enrolls_and_cannot_publish_as_another_node(
        control_plane: ControlPlane, admin: KubeClient, stack: dict[str, Any]) -> None:
    broker, tmp, a, b = stack["broker"], stack["tmp"], stack["a"], stack["b"]
    watcher = Watcher(broker)
    token, _pod = bound_token(admin, AGENT_SA, a)
    agent = run_agent(control_plane, broker, tmp, a, token)
    try:
        # (a) enrolled, connected on the certificate listener, acknowledged as node A.
        watcher.wait(wire.telemetry_topic(a))
        watcher.wait(wire.ack_topic(a))
    except AssertionError:
        stop_all([agent])
        raise AssertionError((tmp / "agent.stderr").read_text()[-3000:]
                             + (tmp / "core.stderr").read_text()[-3000:]) from None
    stop_all([agent])
    ident = tmp / "agent-state" / "identity"
    assert stat.S_IMODE((ident / "client.key").stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((ident / "client.crt").read_bytes())
    assert cert.subject.rfc4514_string() == f"CN={a}"
    issued = [o for o in admin.list(CSR_PATH)[0]
              if o["spec"]["signerName"] == SIGNER_NAME
              and o["spec"]["extra"].get("authentication.kubernetes.io/node-name") == [a]]
    assert len(issued) == 1 and issued[0]["status"]["certificate"]
    assert [c["type"] for c in issued[0]["status"]["conditions"]] == ["Approved"]

    # (c) node A's certificate cannot publish node B's telemetry: refused by the broker, not
    # delivered, never acknowledged by the core. Node A's own topic, same connection kind,
    # goes through, and arrives after the refused one would have.
    # Renewal in place (the agent's Renewer, its clock moved into the certificate's last
    # third): a new CSR with the same key, approved and signed by the core, the file replaced.
    # The checks below then run with the renewed certificate.
    renewed: list[Path] = []
    done = threading.Event()
    s = settings(control_plane, tmp, a, token)
    renewer = Renewer(EnrollSettings(node=a, identity_dir=ident, api_server=s.api_server,
                                     token_file=s.token_file, ca_file=s.ca_file,
                                     timeout_s=20, poll_s=0.2),
                      lambda c, _k: (renewed.append(c), done.set()), done,
                      clock=lambda: time.time() + 400 * 86400).start()
    renewer.join(30)
    assert renewed == [ident / "client.crt"], "the certificate was not renewed"
    new = x509.load_pem_x509_certificate((ident / "client.crt").read_bytes())
    assert new.serial_number != cert.serial_number and new.subject == cert.subject

    # tools.identity_probe: the same check the installed-chart test runs. Node B's telemetry
    # and status first, then node A's own, on one connection, each QoS 1 with MQTT 5.
    marker = wire.telemetry_topic(a)
    before = watcher.seen.count(marker)
    codes = cannot_publish_as(broker.host, broker.cert_port, ca_file=broker.ca_file,
                              certfile=ident / "client.crt", keyfile=ident / "client.key",
                              node=a, other=b)
    assert codes == {wire.telemetry_topic(b): 135, wire.status_topic(b): 135, marker: 0}
    wait_for(lambda: watcher.seen.count(marker) > before, timeout=10,
             what="node A's own message after the refused ones")
    watcher.wait(wire.ack_topic(a))  # the core is alive and acking
    assert wire.telemetry_topic(b) not in watcher.seen
    assert wire.ack_topic(b) not in watcher.seen
    # Nor can the certificate reach the password listener as anyone: no password.
    assert broker.probe(a, None) != 0
    watcher.close()

    # The agent reuses its certificate on restart: no new CSR.
    key = serialization.load_pem_private_key((ident / "client.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    s = settings(control_plane, tmp, a, token)
    crt, _k = ensure_identity(EnrollSettings(node=a, identity_dir=ident,
                                             api_server=s.api_server, token_file=s.token_file,
                                             ca_file=s.ca_file, timeout_s=5))
    assert crt == ident / "client.crt"
    assert len([o for o in admin.list(CSR_PATH)[0]
                if o["spec"]["extra"].get("authentication.kubernetes.io/node-name")
                == [a]]) == 2  # the first and the renewal


def test_csrs_for_another_node_or_from_another_identity_are_denied(
        control_plane: ControlPlane, admin: KubeClient, stack: dict[str, Any]) -> None:
    tmp, a, b = stack["tmp"], stack["a"], stack["b"]
    token, _pod = bound_token(admin, AGENT_SA, a)
    key = load_or_make_key(tmp / "denied" / "client.key")  # the agent's own key file

    def denied(s: EnrollSettings) -> str:
        with pytest.raises(EnrollError, match="denied") as ei:
            request_certificate(s, key)
        return str(ei.value)

    # The same pod-bound token asking for node B's name.
    msg = denied(settings(control_plane, tmp, b, token))
    assert "NodeMismatch" in msg and a in msg
    name = msg.split()[1]
    assert denial(admin, name)[0] == "NodeMismatch"
    ev = wait_for(lambda: csr_events(admin, name), timeout=15, what="the CSRDenied Event")
    assert ev[0]["reason"] == "CSRDenied" and ev[0]["type"] == "Warning"
    assert "NodeMismatch" in ev[0]["note"]

    # A token of the agent ServiceAccount bound to no pod: no node to speak for.
    msg = denied(settings(control_plane, tmp, a, unbound_token(admin, AGENT_SA)))
    assert "NoNodeBinding" in msg

    # A pod-bound token of another ServiceAccount that may file CSRs too.
    admin.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": "intruder", "namespace": NS}})
    admin.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": "intruder-csr"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": AGENT_SA},
                 "subjects": [{"kind": "ServiceAccount", "name": "intruder",
                               "namespace": NS}]})
    other, _ = bound_token(admin, "intruder", a)
    msg = wait_for(lambda: _try_denied(settings(control_plane, tmp, a, other), key), timeout=15,
                   what="the intruder's CSR (RBAC binding live) denied")
    assert "NotAgentServiceAccount" in msg
    admin.delete("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/intruder-csr")


def _try_denied(s: EnrollSettings, key: Path) -> str | None:
    try:
        request_certificate(s, key)
    except EnrollError as e:
        return str(e) if "denied" in str(e) else None
    return None


def _csr_pem(cn: str, key: Any, sans: int = 0) -> bytes:
    b = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(f"n{i}.example.org") for i in range(sans)]), critical=False)
    return b.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def test_hostile_csrs_are_denied_without_stalling_enrollment(
        control_plane: ControlPlane, admin: KubeClient, stack: dict[str, Any]) -> None:
    tmp, a = stack["tmp"], stack["a"]
    token, _pod = bound_token(admin, AGENT_SA, a)
    assert control_plane.admin is not None
    agent = KubeClient.from_token(control_plane.admin.host, token, control_plane.admin.ca_file)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    weak = rsa.generate_private_key(65537, 1024)
    p521 = ec.generate_private_key(ec.SECP521R1())
    hostile = {  # what each is, the request, the usages, the expected reason
        "huge": (_csr_pem(a, ec_key, sans=600), ["client auth"], "RequestTooLarge"),
        "bad-cn": (_csr_pem("Node_A;rm", ec_key), ["client auth"], "BadCommonName"),
        "server": (_csr_pem(a, ec_key), ["server auth"], "BadUsages"),
        "rsa1024": (_csr_pem(a, weak), ["client auth"], "BadKey"),
        "p521": (_csr_pem(a, p521), ["client auth"], "BadKey"),
    }
    names: dict[str, str] = {}
    # More than one pass handles (50): 12 of each kind, all filed before the honest one.
    for _i in range(12):
        for kind, (pem, usages, _r) in hostile.items():
            obj = agent.create(CSR_PATH, {
                "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"generateName": f"hostile-{kind}-"},
                "spec": {"request": base64.b64encode(pem).decode(),
                         "signerName": SIGNER_NAME, "usages": usages}})
            names[obj["metadata"]["name"]] = kind
    t0 = time.monotonic()
    crt, _k = ensure_identity(settings(control_plane, tmp, a, token, timeout_s=30))
    took = time.monotonic() - t0
    assert crt.exists()
    assert took < 20, f"the honest CSR took {took:.1f}s behind 60 hostile ones"
    for name, kind in names.items():
        reason = wait_for(lambda n=name: _reason(admin, n), timeout=15,
                          what=f"hostile CSR {name} answered")
        assert reason == hostile[kind][2], (name, reason)
    agent.close()


def _reason(admin: KubeClient, name: str) -> str | None:
    obj = admin.get(f"{CSR_PATH}/{name}")
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c["reason"] for c in conds if c["type"] == "Denied"), None)


def test_core_enrollment_calls_pass_the_shipped_rbac(
        control_plane: ControlPlane, admin: KubeClient, shipped_rbac: None) -> None:
    """The enroller's calls under the chart's core ServiceAccount (deploy/k8s/rbac.yaml):
    the CA Secret in its namespace, listing, approving and signing cfnet.io/agent CSRs; and
    what it must not do: approve another signer's CSR."""
    token = control_plane.service_account_token(NS, "cfnet-core", create=False)
    assert control_plane.admin is not None
    core = KubeClient.from_token(control_plane.admin.host, token, control_plane.admin.ca_file)
    name = f"rbac-ca-{uuid.uuid4().hex[:6]}"
    # The shipped Role names one Secret (cfnet-agent-ca): another name can be made, not read.
    signer = ca_from_secret(core, NS, "cfnet-agent-ca")
    assert "CN=cfnet agent CA" in signer.ca.subject.rfc4514_string()
    with pytest.raises(KubeForbidden):
        core.get(f"/api/v1/namespaces/{NS}/secrets/{name}")
    node = f"id-r-{uuid.uuid4().hex[:6]}"
    admin.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                   "metadata": {"name": node}})
    try:
        token_a, _ = bound_token(admin, AGENT_SA, node)
        key = ec.generate_private_key(ec.SECP256R1())
        agent = KubeClient.from_token(control_plane.admin.host, token_a,
                                      control_plane.admin.ca_file)
        obj = agent.create(CSR_PATH, {
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"generateName": "rbac-"},
            "spec": {"request": base64.b64encode(_csr_pem(node, key)).decode(),
                     "signerName": SIGNER_NAME, "usages": ["client auth"]}})
        # The agent may not approve its own CSR.
        with pytest.raises(KubeForbidden):
            agent.replace(f"{CSR_PATH}/{obj['metadata']['name']}/approval", {
                **obj, "status": {"conditions": [{"type": "Approved", "status": "True",
                                                  "reason": "Self"}]}})
        enroller = AgentEnroller(core, signer,
                                 agent_user=f"system:serviceaccount:{NS}:{AGENT_SA}")
        wait_for(lambda: enroller.run_once() >= 0 and admin.get(
            f"{CSR_PATH}/{obj['metadata']['name']}")["status"].get("certificate"),
            timeout=15, what="the CSR signed under the core's shipped RBAC")
        assert enroller.stats.errors == 0
        # Another signer's CSR cannot be approved under these rules.
        other = admin.create(CSR_PATH, {
            "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"generateName": "rbac-other-"},
            "spec": {"request": base64.b64encode(_csr_pem(node, key)).decode(),
                     "signerName": "example.com/other", "usages": ["client auth"]}})
        with pytest.raises((KubeForbidden, KubeConflict)):
            core.replace(f"{CSR_PATH}/{other['metadata']['name']}/approval", {
                **other, "status": {"conditions": [{"type": "Approved", "status": "True",
                                                    "reason": "X"}]}})
        agent.close()
    finally:
        admin.delete(f"/api/v1/nodes/{node}")
        core.close()
