"""A real Kubernetes control plane for tests (etcd + kube-apiserver + kube-controller-manager).

``ControlPlane`` builds the binaries when they are missing (``tools/envtest/build.sh``, progress
on stderr), generates a CA, a serving certificate, an admin client certificate
(``system:masters``), a client certificate for kube-controller-manager
(``system:kube-controller-manager``) and a service-account signing key with ``openssl``,
starts etcd and kube-apiserver on random 127.0.0.1 ports with RBAC authorization and the
ServiceAccount admission plugin on, and writes an admin kubeconfig. With ``controllers=True``
(the default) it also runs kube-controller-manager with the controllers workloads need
(Deployments, ReplicaSets, StatefulSets, Jobs, garbage collection, disruption budgets,
ServiceAccounts and their tokens, namespaces), each under its own ServiceAccount as kubeadm
does. There is no kubelet and no node-lifecycle controller: nothing runs a pod, and nodes a
test creates stay as the test wrote them. It can mint ServiceAccount tokens (TokenRequest
API), restart the API server on the same port (etcd keeps the data), and tears everything
down on exit.

This module talks HTTPS with the standard library only; the project's rule is that only
``cloud_core/k8s/endpoint.py`` imports the kubernetes client.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"


class EnvtestError(RuntimeError):
    """The control plane could not be built or started; the message says which step failed."""


CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler")
NODE = ("kubelet", "kube-proxy", "kwok", "coredns")


def all_binary_paths() -> dict[str, Path]:
    """Where build.sh puts every test-cluster binary for the configured versions."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-dir"], check=True,
                         capture_output=True, text=True).stdout.split()
    return {name: Path(p) for name, p in zip(CONTROL_PLANE + NODE, out, strict=True)}


def binary_paths() -> tuple[Path, Path]:
    """Where build.sh puts (kube-apiserver, etcd) for the configured versions."""
    paths = all_binary_paths()
    return paths["kube-apiserver"], paths["etcd"]


def ensure_binaries(*, stream: Any = None, node: bool = False,
                    kwok: bool = False) -> tuple[Path, Path]:
    """Build kube-apiserver and etcd when missing (a no-op when cached); return their paths.

    With ``node`` also the real node's kubelet, kube-proxy, kwok and CoreDNS
    (``tools/envtest/node.py``); with ``kwok`` the control plane and kwok only (the simulated
    nodes of tests/k8s: ``tools/envtest/kwok.py``). Progress goes to ``stream`` (default: the
    real stderr, so pytest's capture does not hide a twenty-minute compile).
    """
    all_paths = all_binary_paths()
    paths = {n: p for n, p in all_paths.items()
             if node or n in CONTROL_PLANE or (kwok and n == "kwok")}
    apiserver, etcd = paths["kube-apiserver"], paths["etcd"]
    if all(p.exists() for p in paths.values()):
        return apiserver, etcd
    out = stream or sys.__stderr__
    only = "all" if node else "control-plane+kwok" if kwok else "control-plane"
    what = ("test cluster (control plane and node)" if node else
            "control plane and kwok" if kwok else "control plane")
    print(f"[envtest] building {what} binaries into {apiserver.parent.parent.parent} "
          "(first run only; several minutes on a small machine)", file=out, flush=True)
    env = {**os.environ, "CFNET_ENVTEST_ONLY": only}
    proc = subprocess.Popen(["nice", "-n", "10", "bash", str(BUILD_SCRIPT)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    tail: list[str] = []
    for line in proc.stderr:
        print(line.rstrip(), file=out, flush=True)
        tail = [*tail[-40:], line]
    if proc.wait() != 0 or not all(p.exists() for p in paths.values()):
        raise EnvtestError("building the control plane failed (tools/envtest/build.sh):\n"
                           + "".join(tail))
    return apiserver, etcd


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (released again for the server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise EnvtestError(f"openssl {' '.join(args)} failed: {r.stderr.strip()}")


def sign_client_cert(d: Path, name: str, subject: str) -> None:
    """``<name>.crt``/``.key`` in ``d``: a client certificate for ``subject`` from d's CA."""
    (d / f"{name}.ext").write_text("extendedKeyUsage=clientAuth\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.csr", "-subj", subject, cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile",
             f"{name}.ext", cwd=d)


def generate_pki(d: Path, extra_ips: tuple[str, ...] = ()) -> None:
    """CA, apiserver serving cert (loopback, service IP, ``extra_ips``), admin client cert,
    the API server's client cert for kubelets, SA signing key."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "2", "-subj", "/CN=cfnet-envtest-ca", cwd=d)
    certs = {
        "apiserver": ("/CN=kube-apiserver",
                      "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,"
                      + "".join(f"IP:{ip}," for ip in extra_ips)
                      + "DNS:localhost,DNS:kubernetes,"
                      "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
                      "extendedKeyUsage=serverAuth\n"),
        "admin": ("/O=system:masters/CN=cfnet-envtest-admin", "extendedKeyUsage=clientAuth\n"),
        "controller-manager": ("/CN=system:kube-controller-manager",
                               "extendedKeyUsage=clientAuth\n"),
        # The API server's identity towards kubelets (logs, exec): kubeadm's
        # apiserver-kubelet-client, in system:masters.
        "kubelet-client": ("/O=system:masters/CN=kube-apiserver-kubelet-client",
                           "extendedKeyUsage=clientAuth\n"),
    }
    for name, (subj, ext) in certs.items():
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", subj, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile",
                 f"{name}.ext", cwd=d)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


@dataclass(frozen=True)
class Credentials:
    """How to reach the API server: host, CA bundle, and a client cert/key or a bearer token."""

    host: str
    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None

    def kubeconfig(self, user: str = "admin") -> dict[str, Any]:
        """A kubeconfig (as a dict) for these credentials."""
        u: dict[str, Any] = {}
        if self.token:
            u["token"] = self.token
        if self.cert_file:
            u["client-certificate"] = self.cert_file
            u["client-key"] = self.key_file
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": "envtest",
            "clusters": [{"name": "envtest",
                          "cluster": {"server": self.host, "certificate-authority": self.ca_file}}],
            "users": [{"name": user, "user": u}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": user}}],
        }

    def write_kubeconfig(self, path: Path, user: str = "admin") -> Path:
        path.write_text(json.dumps(self.kubeconfig(user), indent=1))
        return path


class ControlPlane:
    """etcd + kube-apiserver on loopback; use as a context manager.

    ``admin`` holds client-certificate credentials in ``system:masters``; ``kubeconfig`` is the
    path of a kubeconfig written for them.
    """

    # The controllers cfnet's workloads need (names as kube-controller-manager --help lists
    # them). Left out on purpose: the node-lifecycle controller (no kubelet posts heartbeats
    # here, so it would taint every test node unreachable and evict its pods) and the ones
    # for kinds the tests never create.
    CONTROLLERS = ("serviceaccount-controller", "serviceaccount-token-controller",
                   "namespace-controller", "garbage-collector-controller",
                   "deployment-controller", "replicaset-controller", "statefulset-controller",
                   "job-controller", "disruption-controller",
                   "root-ca-certificate-publisher-controller")

    # With a real node: also the DaemonSet controller (the chart's agent), the PV binder (a
    # PersistentVolumeClaim, Mosquitto's, bound to a local PersistentVolume on the node) and
    # the protection controllers that lift a deleted claim's or volume's finalizer once no
    # pod uses it (without them a deleted PVC stays Terminating).
    NODE_CONTROLLERS = ("node-lifecycle-controller", "endpointslice-controller",
                        "taint-eviction-controller", "pod-garbage-collector-controller",
                        "daemonset-controller", "persistentvolume-binder-controller",
                        "persistentvolumeclaim-protection-controller",
                        "persistentvolume-protection-controller")

    def __init__(self, workdir: Path | None = None, *, log_stream: Any = None,
                 controllers: bool = True, priority_and_fairness: bool = False,
                 advertise_address: str = "127.0.0.1", real_nodes: bool = False,
                 authorization_mode: str = "Node,RBAC", extra_sans: tuple[str, ...] = ()
                 ) -> None:
        self.controllers = controllers
        # More addresses the API server's certificate names (IPs): where a client outside
        # the node's network reaches it, e.g. a real node's address in front of it.
        self.extra_sans = extra_sans
        # Node: kubelets (tools/envtest/node.py); tools/bench_k8s --authz measures its cost
        # against RBAC alone
        self.authorization_mode = authorization_mode
        # With nodes whose kubelet (or kwok) posts heartbeats: the node-lifecycle controller
        # (removes the not-ready taint, marks silent nodes unreachable), the EndpointSlice
        # controller (kube-proxy and CoreDNS route Services by them) and kube-scheduler.
        self.real_nodes = real_nodes
        self.sched_proc: subprocess.Popen[bytes] | None = None
        # The address the API server advertises (the ``kubernetes`` Service's endpoint). It
        # still listens on 127.0.0.1 only; a real node (tools/envtest/node.py) relays its own
        # address on a veth into its namespace to that port, so pods reach the Service.
        self.advertise_address = advertise_address
        # API Priority and Fairness is off by default here (one client, no tenants to keep
        # apart; the benchmarks' tables are measured so); a test of how cfnet meets its 429s
        # turns it on, as every real cluster has it.
        self.priority_and_fairness = priority_and_fairness
        self.kcm_proc: subprocess.Popen[bytes] | None = None
        self.kcm_bin = Path()
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="cfnet-envtest-"))
        self.log_stream = log_stream
        self.etcd_proc: subprocess.Popen[bytes] | None = None
        self.api_proc: subprocess.Popen[bytes] | None = None
        self.etcd_port = 0
        self.api_port = 0
        self.apiserver_bin = Path()
        self.etcd_bin = Path()
        self.admin: Credentials | None = None
        self.kubeconfig = self.dir / "admin.kubeconfig"

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        self.apiserver_bin, self.etcd_bin = ensure_binaries(stream=self.log_stream)
        extra = () if self.advertise_address == "127.0.0.1" else (self.advertise_address,)
        generate_pki(self.dir / "pki", (*extra, *self.extra_sans))
        try:
            self._start_etcd()
            self.api_port = free_port()
            self._start_apiserver()
        except BaseException:
            self.stop()
            raise
        pki = self.dir / "pki"
        self.admin = Credentials(host=f"https://127.0.0.1:{self.api_port}",
                                 ca_file=str(pki / "ca.crt"), cert_file=str(pki / "admin.crt"),
                                 key_file=str(pki / "admin.key"))
        self.admin.write_kubeconfig(self.kubeconfig)
        if self.controllers:
            try:
                self._start_controller_manager()
                if self.real_nodes:
                    self._start_scheduler()
            except BaseException:
                self.stop()
                raise

    def _stop_controllers(self) -> tuple[bool, bool]:
        """Stop kube-scheduler and kube-controller-manager; whether each of them ran."""
        ran = (self.kcm_proc is not None, self.sched_proc is not None)
        for proc in (self.sched_proc, self.kcm_proc):
            if proc is not None:
                _terminate(proc)
        self.sched_proc = self.kcm_proc = None
        return ran

    def stop(self) -> None:
        self._stop_controllers()
        self.stop_apiserver()
        if self.etcd_proc is not None:
            _terminate(self.etcd_proc)
            self.etcd_proc = None
        if self._own_dir and os.environ.get("CFNET_ENVTEST_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def stop_apiserver(self) -> None:
        if self.api_proc is not None:
            _terminate(self.api_proc)
            self.api_proc = None

    def start_apiserver(self) -> None:
        """Start kube-apiserver again (same port, same etcd) after ``stop_apiserver``.

        kube-controller-manager (and kube-scheduler) start again with it, from a full list.
        While the API server was away their informers' watches backed off (client-go: up to
        30 s); a pod a controller created and someone deleted inside that window is never seen
        by its informer, and the ReplicaSet controller then waits out its creation
        expectation (5 minutes) before it makes a replacement. A restarted controller manager
        lists first, so the tests after a restart do not depend on that backoff.
        """
        if self.api_proc is not None:
            return
        self._start_apiserver()
        kcm, scheduler = self._stop_controllers()
        if kcm:
            self._start_controller_manager()
        if scheduler:
            self._start_scheduler()

    def restart(self, down_s: float = 0.0) -> None:
        """Stop kube-apiserver, stay down ``down_s`` seconds, start it on the same port."""
        self.stop_apiserver()
        time.sleep(down_s)
        self.start_apiserver()

    # -- processes -----------------------------------------------------------------------------
    def _start_etcd(self) -> None:
        for _attempt in range(3):
            self.etcd_port, peer = free_port(), free_port()
            log = open(self.dir / "etcd.log", "ab")  # noqa: SIM115 - owned by the process
            self.etcd_proc = subprocess.Popen(
                [str(self.etcd_bin), "--name=envtest", f"--data-dir={self.dir / 'etcd'}",
                 f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                 f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                 f"--listen-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-cluster=envtest=http://127.0.0.1:{peer}",
                 "--unsafe-no-fsync=true", "--log-level=warn"],
                stdout=log, stderr=log, start_new_session=True)
            log.close()
            if self._wait(lambda: _http_ok(f"http://127.0.0.1:{self.etcd_port}/health"),
                          self.etcd_proc, 30):
                return
            _terminate(self.etcd_proc)
        raise EnvtestError(f"etcd did not become healthy; see {self.dir / 'etcd.log'}")

    def _start_apiserver(self) -> None:
        pki = self.dir / "pki"
        log = open(self.dir / "kube-apiserver.log", "ab")  # noqa: SIM115 - owned by the process
        self.api_proc = subprocess.Popen(
            [str(self.apiserver_bin),
             f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
             "--bind-address=127.0.0.1", f"--advertise-address={self.advertise_address}",
             f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
             f"--kubelet-client-key={pki / 'kubelet-client.key'}",
             "--kubelet-preferred-address-types=InternalIP",
             "--enable-admission-plugins=NodeRestriction",
             f"--secure-port={self.api_port}",
             f"--cert-dir={self.dir / 'apiserver-certs'}",
             f"--tls-cert-file={pki / 'apiserver.crt'}",
             f"--tls-private-key-file={pki / 'apiserver.key'}",
             f"--client-ca-file={pki / 'ca.crt'}",
             f"--service-account-key-file={pki / 'sa.pub'}",
             f"--service-account-signing-key-file={pki / 'sa.key'}",
             "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
             "--api-audiences=https://kubernetes.default.svc.cluster.local",
             f"--authorization-mode={self.authorization_mode}",
             "--anonymous-auth=false",
             # ServiceAccount admission on: kube-controller-manager creates the "default"
             # accounts (ControlPlane(controllers=False) turns it off, as nothing would).
             *([] if self.controllers else ["--disable-admission-plugins=ServiceAccount"]),
             "--service-cluster-ip-range=10.0.0.0/24",
             "--allow-privileged=true",
             f"--enable-priority-and-fairness={str(self.priority_and_fairness).lower()}",
             "--profiling=false", "--v=1"],
            stdout=log, stderr=log, start_new_session=True)
        log.close()
        if not self._wait(self._ready, self.api_proc, 90):
            tail = (self.dir / "kube-apiserver.log").read_text(errors="replace")[-3000:]
            raise EnvtestError(f"kube-apiserver did not become ready:\n{tail}")

    def _start_controller_manager(self) -> None:
        pki = self.dir / "pki"
        self.kcm_bin = all_binary_paths()["kube-controller-manager"]
        assert self.admin is not None
        creds = Credentials(host=self.admin.host, ca_file=self.admin.ca_file,
                            cert_file=str(pki / "controller-manager.crt"),
                            key_file=str(pki / "controller-manager.key"))
        kc = creds.write_kubeconfig(self.dir / "controller-manager.kubeconfig",
                                    user="system:kube-controller-manager")
        controllers = self.CONTROLLERS + (self.NODE_CONTROLLERS if self.real_nodes else ())
        log = open(self.dir / "kube-controller-manager.log", "ab")  # noqa: SIM115
        self.kcm_proc = subprocess.Popen(
            [str(self.kcm_bin), f"--kubeconfig={kc}",
             f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
             f"--controllers={','.join(controllers)}",
             f"--service-account-private-key-file={pki / 'sa.key'}",
             f"--root-ca-file={pki / 'ca.crt'}",
             "--use-service-account-credentials=true",
             "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
             "--profiling=false", "--v=1"],
            stdout=log, stderr=log, start_new_session=True)
        log.close()
        # Ready when the controllers have made the "default" ServiceAccount (the admission
        # plugin refuses pods without it) in a namespace created now.
        probe = f"envtest-ready-{os.getpid()}-{int(time.monotonic() * 1000)}"  # per start
        self.ensure_namespace(probe)

        def sa_ready() -> bool:
            try:
                self.request("GET", f"/api/v1/namespaces/{probe}/serviceaccounts/default")
                return True
            except (OSError, urllib.error.URLError):
                return False

        if not self._wait(sa_ready, self.kcm_proc, 120):
            tail = (self.dir / "kube-controller-manager.log").read_text(errors="replace")[-3000:]
            raise EnvtestError(f"kube-controller-manager did not become ready:\n{tail}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            self.request("DELETE", f"/api/v1/namespaces/{probe}")

    def _start_scheduler(self) -> None:
        """kube-scheduler (default profile) with the admin credentials, no leader election."""
        cfg = self.dir / "kube-scheduler.yaml"
        cfg.write_text("apiVersion: kubescheduler.config.k8s.io/v1\n"
                       "kind: KubeSchedulerConfiguration\n"
                       f"clientConnection:\n  kubeconfig: {self.kubeconfig}\n"
                       "leaderElection:\n  leaderElect: false\n")
        log = open(self.dir / "kube-scheduler.log", "ab")  # noqa: SIM115
        self.sched_proc = subprocess.Popen(
            [str(all_binary_paths()["kube-scheduler"]), f"--config={cfg}", "--secure-port=0",
             "--v=1"], stdout=log, stderr=log, start_new_session=True)
        log.close()

    def wait_default_service_account(self, namespace: str, timeout: float = 30.0) -> None:
        """Block until the ServiceAccount controller made ``namespace``'s "default" account."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.1)
        raise EnvtestError(f"no default ServiceAccount in {namespace} after {timeout}s")

    def _wait(self, ok: Any, proc: subprocess.Popen[bytes], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            if ok():
                return True
            time.sleep(0.2)
        return False

    # -- HTTPS with the admin certificate ------------------------------------------------------
    def _ssl(self) -> ssl.SSLContext:
        pki = self.dir / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{self.api_port}/readyz",
                                        context=self._ssl(), timeout=2) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """An admin HTTPS request to the API server; returns the decoded JSON body."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"https://127.0.0.1:{self.api_port}{path}", data=data,
                                     method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=self._ssl(), timeout=10) as r:
            return json.loads(r.read() or b"null")

    def ensure_namespace(self, name: str) -> None:
        with contextlib.suppress(urllib.error.HTTPError):
            self.request("POST", "/api/v1/namespaces",
                         {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def service_account_token(self, namespace: str, name: str, *, create: bool = True,
                              expiration_s: int = 3600) -> str:
        """Mint a token for ServiceAccount ``namespace/name`` (created first when ``create``)."""
        if create:
            self.ensure_namespace(namespace)
            with contextlib.suppress(urllib.error.HTTPError):
                self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                             {"apiVersion": "v1", "kind": "ServiceAccount",
                              "metadata": {"name": name, "namespace": namespace}})
        tr = self.request("POST",
                          f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                           "spec": {"expirationSeconds": expiration_s}})
        return str(tr["status"]["token"])

    def token_credentials(self, token: str) -> Credentials:
        assert self.admin is not None
        return Credentials(host=self.admin.host, ca_file=self.admin.ca_file, token=token)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _terminate(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> int:
    """`python -m tools.envtest.harness` : build if needed, start, print the kubeconfig, wait."""
    with ControlPlane() as cp:
        print(f"kubeconfig: {cp.kubeconfig}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
