"""A real Kubernetes node for the test cluster, inside a network namespace of its own.

``RealNode(control_plane)`` starts, all in a network namespace ``cfk-<pid>`` it creates:
containerd (Debian's 1.6, runc, its own root/state/socket and config under a temp dir),
the kubelet (client certificate ``system:node:<name>`` in ``system:nodes`` from the control
plane's CA; the API server runs the Node authorizer and NodeRestriction), kube-proxy
(iptables mode) and CoreDNS (a process, behind the ``kube-dns`` Service at 10.0.0.10). Pods
get addresses from the CNI bridge plugin (``cni0``, 10.251.0.0/24, host-local IPAM in the
temp dir), also inside that namespace. The images are the local builds of
``tools/envtest/images.py`` (pause, podbin) plus any archive passed to ``import_image``;
nothing is pulled.

Network: a veth pair joins the namespace (``eth0``, 10.250.N.2/30) to the root namespace
(``cfk<pid>``, 10.250.N.1/30). The API server listens on 127.0.0.1 only; a relay in this
process listens on 10.250.N.1:<api port> and forwards to it, and the API server advertises
10.250.N.1 (``ControlPlane(advertise_address=...)``), so the ``kubernetes`` Service's
endpoint is routable from pods (kube-proxy DNATs 10.0.0.1:443 to it, the bridge plugin
masquerades pod traffic to the node's address). The namespace has no default route: it
reaches the veth's /30 and the Service range only, so nothing a pod, the kubelet or CNI does
leaves for the machine's network, and the machine's own routes and netfilter rules are never
touched (the bridge's and kube-proxy's rules live in the namespace's own tables).

Processes are started with ``nsenter --net`` (not ``ip netns exec``, whose private mount
namespace would hide the kubelet's volume mounts from containerd), so the kubelet's mounts
are in the machine's mount namespace, all under the temp dir: ``stop()`` kills the pods'
processes (their cgroups are under ``/cfk-<pid>`` in every v1 hierarchy), stops everything,
unmounts every mount under the temp dir, deletes the namespace and the cgroups. A crashed
run's leftovers (``cfk-<pid>`` of a dead pid) are removed the same way at the next start.

cgroups: this machine has cgroup v1 controllers only; kubelet 1.34 runs on v1 with
``failCgroupV1: false`` (its default until 1.35), cgroupfs driver, ``cgroupRoot: /cfk-<pid>``.

Run by hand: ``python -m tools.envtest.node`` (prints the kubeconfig; Ctrl-C tears it down).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
from pathlib import Path
from types import TracebackType
from typing import Any

from tools.envtest.harness import (
    ControlPlane,
    Credentials,
    EnvtestError,
    _terminate,
    all_binary_paths,
    ensure_binaries,
    sign_client_cert,
)
from tools.envtest.images import PAUSE_IMAGE, build_images

CNI_BIN = Path("/usr/lib/cni")
SHIM_SOCKETS = Path("/run/containerd/s")
# Paths outside the temp dir that the kubelet and containerd 1.6 write whatever they are told:
# the kubelet's device-plugin socket dir, libcni's result cache. Removed at the end when the
# node made them (listed in <workdir>/created, so a crashed run's are removed too).
MACHINE_PATHS = (Path("/var/lib/kubelet"), Path("/var/lib/cni"))
CGROUP_ROOT = Path("/sys/fs/cgroup")
POD_CIDR = "10.251.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"
DNS_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
PREFIX = "cfk"
_NS_RE = re.compile(rf"^{PREFIX}-(\d+)$")


class NodeError(EnvtestError):
    """The real node could not be started; the message carries the relevant log tail."""


def _run(args: list[str], *, check: bool = True,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise NodeError(f"{' '.join(args)} failed: {r.stderr.strip()}")
    return r


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


# -- cleanup (this run's or a crashed one's) ------------------------------------------------------
def _cgroup_dirs(tag: str) -> list[Path]:
    return [d / tag for d in sorted(CGROUP_ROOT.iterdir()) if (d / tag).is_dir()]


def _kill_cgroup_procs(tag: str) -> None:
    for top in _cgroup_dirs(tag):
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)


def _rmdir_cgroups(tag: str) -> None:
    for top in _cgroup_dirs(tag):
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _unmount_under(root: Path) -> None:
    """Unmount every mount point under ``root`` (deepest first, lazily)."""
    prefix = str(root).rstrip("/") + "/"
    for _ in range(3):
        points = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4].encode().decode("unicode_escape")
                if mp.startswith(prefix) or mp == prefix.rstrip("/"):
                    points.append(mp)
        if not points:
            return
        for mp in sorted(set(points), key=len, reverse=True):
            _run(["umount", "-l", mp], check=False)


def _remove_shim_sockets(workdir: Path) -> None:
    """A killed shim leaves its socket in /run/containerd/s (containerd 1.6 puts it there
    whatever its state dir): ``sha256(<containerd socket>/<namespace>/<id>)``, as
    ``runtime/v2/shim.SocketAddress`` names it, for every task of this node's containerd."""
    sock = workdir / "containerd" / "containerd.sock"
    tasks = workdir / "containerd" / "state" / "io.containerd.runtime.v2.task"
    for ns_dir in tasks.glob("*"):
        for task in ns_dir.glob("*"):
            digest = hashlib.sha256(str(sock / ns_dir.name / task.name).encode()).hexdigest()
            with contextlib.suppress(OSError):
                (SHIM_SOCKETS / digest).unlink()


def cleanup(tag: str, workdir: Path | None) -> None:
    """Remove everything of node ``tag`` (``cfk-<pid>``): processes in its namespace and its
    cgroups, mounts and files under ``workdir``, the namespace (its veth goes with it)."""
    ns = tag
    for _ in range(3):
        _kill_cgroup_procs(tag)
        pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        if not pids:
            break
        time.sleep(0.3)
    if workdir is not None and workdir.exists():
        _unmount_under(workdir)
        _remove_shim_sockets(workdir)
        with contextlib.suppress(OSError):
            for line in (workdir / "created").read_text().splitlines():
                if Path(line) in MACHINE_PATHS:
                    shutil.rmtree(line, ignore_errors=True)
    _run(["ip", "netns", "del", ns], check=False)
    _rmdir_cgroups(tag)
    if workdir is not None and os.environ.get("CFNET_ENVTEST_KEEP") != "1":
        shutil.rmtree(workdir, ignore_errors=True)


def cleanup_stale() -> list[str]:
    """Clean up the nodes of runs whose process is gone (a crash, a kill -9)."""
    names = {line.split()[0] for line in _run(["ip", "netns", "list"], check=False)
             .stdout.splitlines() if line.strip()}
    dirs = {p.name: p for p in Path(tempfile.gettempdir()).glob(f"{PREFIX}-*") if p.is_dir()}
    cgroups = {p.name for d in CGROUP_ROOT.iterdir() if d.is_dir()
               for p in d.glob(f"{PREFIX}-*") if p.is_dir()}
    removed = []
    for tag in sorted(names | set(dirs) | cgroups):
        m = _NS_RE.match(tag)
        if not m or _pid_alive(int(m.group(1))):
            continue
        cleanup(tag, dirs.get(tag))
        removed.append(tag)
    return removed


# -- the API server relay --------------------------------------------------------------------
class Relay:
    """TCP relay: ``listen`` (an address on the veth) to ``target`` (127.0.0.1:port)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(listen)
        self.sock.listen(128)
        self.sock.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="cfk-relay", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.sel.select(0.2):
                if key.data is None:
                    self._accept()
                else:
                    self._pump(key.fileobj, key.data)  # type: ignore[arg-type]

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            conn, _ = self.sock.accept()
            try:
                up = socket.create_connection(self.target, timeout=5)
            except OSError:
                conn.close()
                return
            for s in (conn, up):
                s.setblocking(False)
            self.sel.register(conn, selectors.EVENT_READ, up)
            self.sel.register(up, selectors.EVENT_READ, conn)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            data = src.recv(65536)
            if data:
                dst.setblocking(True)
                dst.sendall(data)
                dst.setblocking(False)
                return
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(s)
            s.close()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.sel.close()


# -- the node ------------------------------------------------------------------------------
class RealNode:
    """containerd + kubelet + kube-proxy + CoreDNS in a network namespace; a context manager.

    ``cp`` must have been started with ``advertise_address=RealNode.host_address()``.
    """

    def __init__(self, cp: ControlPlane, name: str = "cfk-node", *,
                 log_stream: Any = None) -> None:
        self.cp = cp
        self.name = name
        self.tag = f"{PREFIX}-{os.getpid()}"
        self.ns = self.tag
        self.host_if = f"{PREFIX}{os.getpid()}"[:15]
        self.host_ip = RealNode.host_address()
        self.node_ip = RealNode.node_address()
        self.dir = Path(tempfile.gettempdir()) / self.tag
        self.log_stream = log_stream
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.relay: Relay | None = None
        self.bins: dict[str, Path] = {}

    _host_address: str | None = None

    @staticmethod
    def host_address() -> str:
        """The root namespace's end of this process's veth: 10.250.N.1/30, the first /30 no
        interface holds yet, starting from one the pid picks (chosen once per process)."""
        if RealNode._host_address is None:
            held = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
            start = os.getpid() % 64
            for i in range(64):
                addr = f"10.250.{(start + i) % 64 * 4}.1"
                if f" {addr}/" not in held:
                    break
            RealNode._host_address = addr
        return RealNode._host_address

    @staticmethod
    def node_address() -> str:
        """The node's own address (``eth0`` in its namespace, 10.250.N.2): the other end of
        :meth:`host_address`'s veth."""
        return RealNode.host_address().rsplit(".", 1)[0] + ".2"

    @property
    def containerd_sock(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    def __enter__(self) -> RealNode:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- lifecycle -----------------------------------------------------------------------------
    def start_runtime(self) -> None:
        """The namespace, its veth and containerd with the local images (no Kubernetes)."""
        images = build_images()
        cleanup_stale()
        cleanup(self.tag, self.dir)
        self.dir.mkdir(parents=True)
        (self.dir / "created").write_text(
            "".join(f"{p}\n" for p in MACHINE_PATHS if not p.exists()))
        try:
            self._network()
            self._cgroups()
            self._containerd()
            for img in images:
                self.import_image(img.archive)
        except BaseException:
            self.stop()
            raise

    def start(self) -> None:
        if self.cp.advertise_address != self.host_ip:
            raise NodeError(f"the control plane must advertise {self.host_ip} "
                            f"(ControlPlane(advertise_address=RealNode.host_address()))")
        ensure_binaries(stream=self.log_stream, node=True)
        self.bins = all_binary_paths()
        self.start_runtime()
        try:
            self.relay = Relay((self.host_ip, self.cp.api_port), ("127.0.0.1", self.cp.api_port))
            self._pki()
            self._rbac_and_dns_service()
            self._kubelet()
            self._kube_proxy()
            self._coredns()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for name in ("kubelet", "kube-proxy", "coredns"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                _terminate(proc, grace=5)
        if "containerd" in self.procs:
            self._kill_tasks()
            _terminate(self.procs.pop("containerd"), grace=5)
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        cleanup(self.tag, self.dir)

    # -- steps ---------------------------------------------------------------------------------
    def _network(self) -> None:
        ns, ip = self.ns, ["ip"]
        _run([*ip, "netns", "add", ns])
        _run([*ip, "link", "add", self.host_if, "type", "veth", "peer", "name", "eth0",
              "netns", ns])
        _run([*ip, "addr", "add", f"{self.host_ip}/30", "dev", self.host_if])
        _run([*ip, "link", "set", self.host_if, "up"])
        nsip = [*ip, "-n", ns]
        _run([*nsip, "link", "set", "lo", "up"])
        _run([*nsip, "addr", "add", f"{self.node_ip}/30", "dev", "eth0"])
        _run([*nsip, "link", "set", "eth0", "up"])
        # No default route: only the /30 and the Service range (routed so a local connect to
        # a ClusterIP finds a route before kube-proxy's OUTPUT DNAT rewrites it).
        _run([*nsip, "route", "add", SERVICE_CIDR, "via", self.host_ip])
        # Bridged pod-to-pod traffic through iptables, so a Service whose backend shares the
        # client's bridge gets its reply un-DNATed (this kernel has br_netfilter built in;
        # the sysctl is per namespace).
        self.exec_in_ns(["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"], check=False)

    def _pki(self) -> None:
        pki = self.cp.dir / "pki"
        host = f"https://{self.host_ip}:{self.cp.api_port}"
        for who, subj in (("kubelet", f"/O=system:nodes/CN=system:node:{self.name}"),
                          ("kube-proxy", "/CN=system:kube-proxy"),
                          ("coredns", "/CN=system:coredns")):
            sign_client_cert(pki, f"node-{who}", subj)
            Credentials(host=host, ca_file=str(pki / "ca.crt"),
                        cert_file=str(pki / f"node-{who}.crt"),
                        key_file=str(pki / f"node-{who}.key")).write_kubeconfig(
                self.dir / f"{who}.kubeconfig", user=who)

    def _cgroups(self) -> None:
        """``/<tag>`` in every v1 hierarchy, the kubelet's cgroupRoot (cpuset filled in)."""
        for d in sorted(CGROUP_ROOT.iterdir()):
            if not d.is_dir() or d.is_symlink() or not (d / "cgroup.procs").exists():
                continue
            (d / self.tag).mkdir(exist_ok=True)
            if (d / "cpuset.cpus").exists():
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / self.tag / f).write_text((d / f).read_text())

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.procs[name] = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.ns}", *args], stdout=log, stderr=log,
            start_new_session=True, env={**os.environ, **(env or {})})
        log.close()

    def _wait(self, name: str, ok: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        proc = self.procs[name]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise NodeError(f"{name} exited ({proc.returncode}) before {what}:\n"
                                f"{_tail(self.dir / f'{name}.log')}")
            with contextlib.suppress(Exception):
                if ok():
                    return
            time.sleep(0.3)
        raise NodeError(f"{name}: no {what} after {timeout:.0f}s:\n"
                        f"{_tail(self.dir / f'{name}.log')}")

    def _containerd(self) -> None:
        d = self.dir / "containerd"
        (d / "cni").mkdir(parents=True, exist_ok=True)  # exists on a restart
        (d / "cni" / "10-cfk.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "cfk",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "dataDir": str(d / "ipam"),
                          "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ]}, indent=1))
        (d / "config.toml").write_text(f"""\
version = 2
root = "{d / 'root'}"
state = "{d / 'state'}"
[grpc]
  address = "{self.containerd_sock}"
[ttrpc]
  address = "{d / 'containerd.sock.ttrpc'}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{d / 'cni'}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "runc"
        Root = "{d / 'runc'}"
""")
        self._spawn("containerd", ["containerd", "--config", str(d / "config.toml")])
        self._wait("containerd", lambda: _run(self._ctr("version"), check=False,
                                              timeout=5).returncode == 0,
                   60, "answer on its socket")

    def ctr_run_flags(self) -> list[str]:
        """Flags that keep a ``ctr run``'s fifos and runc state under the temp dir (ctr's
        defaults are /run/containerd/...: a killed run's state there would be left behind)."""
        return ["--fifo-dir", str(self.dir / "fifo"),
                "--runc-root", str(self.dir / "containerd" / "runc")]

    def _ctr(self, *args: str) -> list[str]:
        return ["ctr", "--address", str(self.containerd_sock), "-n", "k8s.io", *args]

    def import_image(self, archive: Path) -> None:
        """Load an OCI/docker image archive into the node's containerd (no registry)."""
        _run(self._ctr("images", "import", str(archive)), timeout=600)

    def import_podman_image(self, name: str) -> None:
        """Load an image from podman's store (``tools/images.sh build``) into the node's
        containerd: ``podman save`` to an OCI archive in the temp dir, then ``ctr import``."""
        archive = self.dir / "podman-image.tar"
        try:
            _run(["podman", "save", "--format", "oci-archive", "-o", str(archive), name],
                 timeout=600)
            self.import_image(archive)
        finally:
            archive.unlink(missing_ok=True)

    def _kill_tasks(self) -> None:
        r = _run(self._ctr("tasks", "ls", "-q"), check=False, timeout=10)
        for task in r.stdout.split():
            _run(self._ctr("tasks", "kill", "-s", "SIGKILL", task), check=False, timeout=10)
        for task in r.stdout.split():
            _run(self._ctr("tasks", "delete", "-f", task), check=False, timeout=10)

    def _rbac_and_dns_service(self) -> None:
        cp = self.cp

        def apply(path: str, obj: dict[str, Any]) -> None:
            with contextlib.suppress(urllib.error.HTTPError):
                cp.request("POST", path, obj)

        apply("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods",
                                                       "namespaces"],
                       "verbs": ["list", "watch"]},
                      {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                       "verbs": ["list", "watch"]}]})
        apply("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:coredns"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": "system:coredns"}]})
        ports = [{"name": "dns", "port": 53, "protocol": "UDP"},
                 {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
        apply("/api/v1/namespaces/kube-system/services", {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system",
                         "labels": {"k8s-app": "kube-dns"}},
            "spec": {"clusterIP": DNS_IP, "ports": [{**p, "targetPort": 53} for p in ports]}})
        # No selector: CoreDNS runs as a process on the node's address, named here.
        apply("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kube-dns-node", "namespace": "kube-system",
                         "labels": {"kubernetes.io/service-name": "kube-dns",
                                    "endpointslice.kubernetes.io/managed-by": "cfnet-envtest"}},
            "addressType": "IPv4", "ports": ports,
            "endpoints": [{"addresses": [self.node_ip], "conditions": {"ready": True}}]})

    def _kubelet(self) -> None:
        d = self.dir
        (d / "resolv.conf").write_text("")
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "authentication": {"anonymous": {"enabled": False},
                               "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cp.dir / "pki" / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{self.tag}",
            "failCgroupV1": False, "failSwapOn": False,
            "clusterDNS": [DNS_IP], "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(d / "resolv.conf"),
            "podLogsDir": str(d / "pod-logs"),
            "address": self.node_ip, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            # A shared test machine: the kubelet must not evict or garbage-collect because
            # the disk is fuller than a production node's thresholds.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "maxPods": 110,
            "localStorageCapacityIsolation": False,
            "nodeStatusReportFrequency": "10s",
            "registerNode": True,
        }
        (d / "kubelet.yaml").write_text(json.dumps(cfg, indent=1))
        self._spawn("kubelet", [
            str(self.bins["kubelet"]), f"--config={d / 'kubelet.yaml'}",
            f"--kubeconfig={d / 'kubelet.kubeconfig'}", f"--root-dir={d / 'kubelet'}",
            f"--cert-dir={d / 'kubelet-pki'}", f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}", "--v=1"])

    def _kube_proxy(self) -> None:
        cfg = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "iptables", "clusterCIDR": POD_CIDR, "hostnameOverride": self.name,
            "clientConnection": {"kubeconfig": str(self.dir / "kube-proxy.kubeconfig")},
            "bindAddress": self.node_ip,
            "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
            # Leave the conntrack sysctls (some are machine-wide) as they are.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False},
        }
        (self.dir / "kube-proxy.yaml").write_text(json.dumps(cfg, indent=1))
        self._spawn("kube-proxy", [str(self.bins["kube-proxy"]),
                                   f"--config={self.dir / 'kube-proxy.yaml'}", "--v=1"])

    def _coredns(self) -> None:
        (self.dir / "Corefile").write_text(f"""\
.:53 {{
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.dir / 'coredns.kubeconfig'}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
    loop
    loadbalance
}}
""")
        self._spawn("coredns", [str(self.bins["coredns"]), "-conf", str(self.dir / "Corefile")])

    def _wait_ready(self, timeout: float = 180) -> None:
        def ready() -> bool:
            node = self.cp.request("GET", f"/api/v1/nodes/{self.name}")
            conds = (node.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

        self._wait("kubelet", ready, timeout, f"Ready node {self.name}")
        self._wait("coredns", lambda: _http_in_ns(self, "http://127.0.0.1:8181/ready"), 60,
                   "ready answer")

    def restart_services(self) -> float:
        """Stop the kubelet, every container and containerd, then start containerd and the
        kubelet again, as a reboot of the node's services does (the pods' containers start
        again from their images; what they keep is on their volumes). kube-proxy's rules and
        CoreDNS stay. Returns the seconds until the Node is Ready again."""
        t0 = time.monotonic()
        kubelet = self.procs.pop("kubelet", None)
        if kubelet is not None:
            _terminate(kubelet, grace=5)
        self._kill_tasks()
        containerd = self.procs.pop("containerd", None)
        if containerd is not None:
            _terminate(containerd, grace=5)
        self._containerd()
        self._kubelet()
        self._wait_ready()
        return time.monotonic() - t0

    # -- helpers for tests ---------------------------------------------------------------------
    def exec_in_ns(self, args: list[str], *, check: bool = True,
                   timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a command in the node's network namespace."""
        return _run(["nsenter", f"--net=/run/netns/{self.ns}", *args], check=check,
                    timeout=timeout)

    def logs(self, n: int = 2500) -> str:
        """The tails of the kubelet's and containerd's logs (for failure messages)."""
        return "\n".join(f"--- {name}.log (tail) ---\n{_tail(self.dir / f'{name}.log', n)}"
                         for name in ("kubelet", "containerd"))

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        """A container's log as the kubelet wrote it (podLogsDir), all restarts joined."""
        base = self.dir / "pod-logs"
        out = []
        for d in sorted(base.glob(f"{namespace}_{pod}_*/{container}")):
            for f in sorted(d.glob("*.log")):
                out.append(f.read_text(errors="replace"))
        return "".join(out)


def _http_in_ns(node: RealNode, url: str) -> bool:
    code = ("import sys,urllib.request;"
            f"sys.exit(0 if urllib.request.urlopen({url!r},timeout=2).status==200 else 1)")
    return node.exec_in_ns([sys.executable, "-c", code], check=False).returncode == 0


def main() -> int:
    """`python -m tools.envtest.node`: a control plane and a real node until Ctrl-C."""
    with ControlPlane(advertise_address=RealNode.host_address()) as cp, RealNode(cp) as node:
        print(f"kubeconfig: {cp.kubeconfig}\nnode: {node.name} (netns {node.ns}, "
              f"logs {node.dir})", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    # Ctrl-C (even when started from a shell that ignores SIGINT in the background) and
    # SIGTERM tear everything down.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    raise SystemExit(main())
