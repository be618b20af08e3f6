"""The images built from the Containerfile (tools/images.sh: mmdebstrap base, podman
build), run with podman as the chart runs them, on the real kernel and a real Mosquitto.

A lab of three network namespaces: the broker and the core image in ``cloud`` (non-root,
read-only root filesystem, credentials mounted as the chart's Secret is), the ``agent`` image
(CO-RE: libbpf, no compiler) in ``edgea`` with only BTF and tracefs mounted, and the
``agent-bcc`` image in ``edgeb`` forced to its BCC loader (modules and headers mounted too,
as the DaemonSet does for it). The core built from the image must show both nodes measured by
eBPF and the link between them, asked through cfnetctl as an operator would. The core runs
without --kubernetes here: its Kubernetes mode is exercised against the real API server in
tests/k8s; this test is about the image (interpreter, dependencies, entrypoint, user, mounts).
A test runs the core image in that mode, as the chart runs it, against a real API
server (the session's control plane of tests/k8s/conftest.py, a second instance here).
The arm64 images (tools/images.sh build-arm64) are run under qemu-user: the core's and the
agent's entrypoints answer --help, and the agent runs to where its CO-RE load is refused
(qemu-user has no bpf(2)) and prints why.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from cloud_core.errors import KubeNotFound
from cloud_core.k8s.client import KubeClient
from tests.deploy.conftest import podman_run_flags
from tests.k8s.conftest import DEPLOY, load_manifests, wait_for
from tools import helm as chart
from tools.broker import Broker, free_port
from tools.envtest import ControlPlane
from tools.lab import Lab, SiteSpec
from tools.procs import stop_all

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def inspect(image: str) -> dict[str, object]:
    r = podman("image", "inspect", image)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout)[0])


def test_image_configs(images: dict[str, str]) -> None:
    core = inspect(images["core"])["Config"]
    assert isinstance(core, dict)
    assert core["User"] == "65532:65532"  # the core never runs as root
    assert core["Entrypoint"] == ["cfnet-core"]
    for flavour in ("agent", "agent-bcc"):
        agent = inspect(images[flavour])["Config"]
        assert isinstance(agent, dict)
        assert agent["Entrypoint"] == ["cfnet-agent"]
        assert "CFNET_BPF_DIR=/opt/cfnet-app/bpf" in agent["Env"]
        # BCC only in the image made for it: the CO-RE agent never falls back to a compiler.
        assert ("CFNET_BCC_FALLBACK=true" in agent["Env"]) == (flavour == "agent-bcc")
    # The CO-RE agent image stays within its budget (uncompressed, as podman counts it;
    # README's table): 130 MB, a size an edge node pulls over a thin uplink.
    size = inspect(images["agent"])["Size"]
    assert isinstance(size, int) and size <= 130_000_000, f"agent image {size / 1e6:.1f} MB > 130 MB"
    # Both agents carry the CO-RE object and the C sources; only agent-bcc has BCC (and with
    # it LLVM/clang); the CO-RE agent has libbpf and no compiler at all.
    listing = ("import os, glob, ctypes; d = os.environ['CFNET_BPF_DIR']; "
               "print(sorted(os.listdir(d)), os.listdir(d + '/obj')); ctypes.CDLL('libbpf.so.1'); "
               "print(glob.glob('/usr/lib/*/libLLVM*') + glob.glob('/usr/lib/*/libclang*') "
               "+ glob.glob('/usr/bin/clang*'))")
    r = podman("run", "--rm", *podman_run_flags(), "--network", "none", "--entrypoint",
               "python3", images["agent"], "-c", "import importlib.util as u; "
               "print(u.find_spec('bcc')); " + listing)
    assert r.returncode == 0, r.stderr
    spec, files, compilers = r.stdout.splitlines()
    assert spec == "None" and compilers == "[]", r.stdout
    assert "tcp_links.c" in files and "tcp_links.bpf.o" in files, files
    r = podman("run", "--rm", *podman_run_flags(), "--network", "none", "--entrypoint",
               "python3", images["agent-bcc"], "-c", "import bcc; " + listing)
    assert r.returncode == 0, r.stderr
    assert "tcp_links.bpf.o" in r.stdout and "libLLVM" in r.stdout, r.stdout
    r = podman("run", "--rm", *podman_run_flags(), "--network", "none", "--entrypoint",
               "python3", images["core"], "-c", "import bcc")
    assert r.returncode != 0 and "No module named 'bcc'" in r.stderr


@pytest.fixture
def lab() -> Iterator[Lab]:
    with Lab([SiteSpec("cloud"), SiteSpec("edgea", rate_mbit=50), SiteSpec("edgeb")],
             prefix=f"img{os.getpid() % 1000}") as lb:
        yield lb


class Containers:
    """Detached containers of one test, removed (with their logs kept) at the end."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.names: list[str] = []

    def run(self, name: str, image: str, netns: str, args: list[str], *flags: str) -> str:
        full = f"cfnet-test-{self.tag}-{name}"
        net = ["--network", f"ns:/run/netns/{netns}"] if netns else []
        r = podman("run", "-d", "--name", full, *podman_run_flags(), *net, *flags, image,
                   *args, timeout=120)
        assert r.returncode == 0, r.stderr
        self.names.append(full)
        return full

    def logs(self, name: str) -> str:
        r = podman("logs", name)
        return r.stdout + r.stderr

    def running(self, name: str) -> bool:
        r = podman("inspect", "--format", "{{.State.Running}}", name)
        return r.stdout.strip() == "true"

    def remove(self) -> None:
        for n in self.names:
            with contextlib.suppress(subprocess.SubprocessError):
                podman("rm", "-f", "-t", "5", n)


def test_core_and_agent_images_in_a_lab(images: dict[str, str], lab: Lab,
                                        tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker", host=lab.addr("cloud"), netns=lab.ns("cloud"))
    broker.start()
    boxes = Containers(str(os.getpid()))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # The core's Secret as the chart mounts it: ca.crt, password (+ the operator roles).
        core_dir = tmp_path / "core-mqtt"
        core_dir.mkdir()
        core = broker.add_account("core-img", "core")
        (core_dir / "password").write_text(core.password)
        (core_dir / "ca.crt").write_bytes(broker.ca_file.read_bytes())
        (core_dir / "roles.yaml").write_text("operators: {ops-img: viewer}\n")
        for p in [core_dir, *core_dir.iterdir()]:
            p.chmod(0o755 if p.is_dir() else 0o644)  # readable by the image's uid 65532
        state = tmp_path / "core-state"  # the chart's emptyDir, owned by the pod's fsGroup
        state.mkdir(mode=0o700)
        os.chown(state, 65532, 65532)
        core_box = boxes.run(
            "core", images["core"], lab.ns("cloud"),
            [f"--broker-host={broker.host}", f"--broker-port={broker.port}",
             "--username=core-img", "--password-file=/etc/cfnet/mqtt/password",
             "--ca-file=/etc/cfnet/mqtt/ca.crt", "--roles=/etc/cfnet/mqtt/roles.yaml",
             "--db=/var/lib/cfnet-core/core.db", "--metrics-port=9108", "--table-every=0"],
            "--read-only", "-v", f"{state}:/var/lib/cfnet-core", "--tmpfs", "/tmp",
            "-v", f"{core_dir}:/etc/cfnet/mqtt:ro")
        agents = {"edgea": "edge-ai", "edgeb": "edge-bi"}
        agent_box: dict[str, str] = {}
        for site, node in agents.items():
            d = tmp_path / node
            d.mkdir()
            (d / "password").write_text(broker.add_account(node, "agent").password)
            (d / "ca.crt").write_bytes(broker.ca_file.read_bytes())
            peer = lab.addr("edgeb" if site == "edgea" else "edgea")
            # As the DaemonSet runs it: a config file beside the credentials, the node name
            # from CFNET_NODE (the DaemonSet's spec.nodeName).
            (d / "agent.yaml").write_text(
                f"broker_host: {broker.host}\nbroker_port: {broker.port}\ntls: true\n"
                "ca_file: /etc/cfnet-agent/ca.crt\npassword_file: /etc/cfnet-agent/password\n"
                f"interval_s: 1.0\nebpf: true\npeers: [{peer}]\n"
                "buffer_path: /var/lib/cfnet-agent/buffer.db\n")
            # edgea: the CO-RE agent, which needs no kernel headers; edgeb: agent-bcc, forced
            # to BCC (this kernel has BTF, where it would pick CO-RE too).
            extra = (["-v", "/lib/modules:/lib/modules:ro", "-v", "/usr/src:/usr/src:ro",
                      "-e", "CFNET_BPF_LOADER=bcc"] if site == "edgeb" else [])
            agent_box[node] = boxes.run(
                      node, images["agent-bcc" if site == "edgeb" else "agent"], lab.ns(site),
                      ["--config", "/etc/cfnet-agent/agent.yaml"], "-e", f"CFNET_NODE={node}",
                      "--privileged", "-v", "/sys/kernel/btf:/sys/kernel/btf:ro",
                      "-v", "/sys/kernel/tracing:/sys/kernel/tracing",
                      "-v", "/sys/kernel/debug:/sys/kernel/debug", *extra,
                      "--tmpfs", "/var/lib/cfnet-agent", "-v", f"{d}:/etc/cfnet-agent:ro")
        procs.append(lab.popen("edgeb", [sys.executable, "-m", "tools.traffic", "sink",
                                         "--port", "5201", "--duration", "150"], cwd=str(REPO)))
        procs.append(lab.popen("edgea", [sys.executable, "-m", "tools.traffic", "send",
                                         lab.addr("edgeb"), "--port", "5201", "--rate-mbit",
                                         "5", "--duration", "140", "--max-mb", "100"],
                               cwd=str(REPO)))
        ops = broker.add_account("ops-img", "operator")
        ctl = [str(VENV_BIN / "cfnetctl"), "--broker-host", broker.host, "--broker-port",
               str(broker.port), "--user", "ops-img", f"--password={ops.password}",
               "--ca-file", str(broker.ca_file)]
        deadline = time.monotonic() + 150
        nodes = links = ""
        while time.monotonic() < deadline:
            assert boxes.running(core_box), boxes.logs(core_box)[-3000:]
            r = lab.run("cloud", [*ctl, "nodes"], capture_output=True, text=True, timeout=60)
            nodes = r.stdout
            rows = [ln.split() for ln in nodes.splitlines()]
            ebpf = {row[0] for row in rows if row and "ebpf" in row}
            if set(agents.values()) <= ebpf:
                r = lab.run("cloud", [*ctl, "links", "edge-ai"], capture_output=True, text=True,
                            timeout=60)
                links = r.stdout
                if any(ln.split()[:2] == ["edge-ai", "edge-bi"] for ln in links.splitlines()):
                    break
            time.sleep(2)
        else:
            pytest.fail("no eBPF-measured link edge-ai -> edge-bi in the core image's state:\n"
                        f"nodes:\n{nodes}\nlinks:\n{links}\n" + "\n".join(
                            f"--- {n}\n{boxes.logs(n)[-2000:]}" for n in boxes.names))
        for n in boxes.names:
            assert "Traceback" not in boxes.logs(n), boxes.logs(n)[-3000:]
        for node, loader in (("edge-ai", "core"), ("edge-bi", "bcc")):
            log = boxes.logs(agent_box[node])
            assert f"ebpf probe: loader {loader}" in log, log[-3000:]
    finally:
        stop_all(procs, grace_s=10)
        boxes.remove()
        broker.stop()


def test_core_image_leads_as_the_chart_runs_it(images: dict[str, str],
                                               control_plane: ControlPlane,
                                               tmp_path: Path) -> None:
    """The core image with the chart's own container args, user and securityContext, the
    pod's in-cluster environment (ServiceAccount token, CA and namespace mounted where the
    kubelet puts them; KUBERNETES_SERVICE_HOST/PORT) and the chart's RBAC on a real API
    server: it takes the Lease, connects to a real Mosquitto as the chart's MQTT account, and
    serves /metrics. (Host network: the API server and the broker listen on 127.0.0.1.)"""
    admin = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    try:
        for f in ("namespace.yaml", "rbac.yaml"):
            for obj in load_manifests(DEPLOY / f):
                admin.apply(obj)
    finally:
        admin.close()
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(control_plane.service_account_token(
        "cfnet-system", "cfnet-core", create=False))
    assert control_plane.admin is not None
    (sa / "ca.crt").write_bytes(Path(control_plane.admin.ca_file).read_bytes())
    (sa / "namespace").write_text("cfnet-system")
    broker = Broker(tmp_path / "broker")
    broker.start()
    boxes = Containers(f"{os.getpid()}k")
    try:
        mqtt = tmp_path / "mqtt"  # the Secret cfnet-core-mqtt as the chart mounts it
        mqtt.mkdir()
        (mqtt / "password").write_text(broker.add_account("core-k8s", "core").password)
        (mqtt / "ca.crt").write_bytes(broker.ca_file.read_bytes())
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        os.chown(state, 65532, 65532)
        for p in [sa, mqtt, *sa.iterdir(), *mqtt.iterdir()]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        metrics_port = free_port()
        dep = next(d for d in chart.documents(chart.template(values=[
            "broker.host=127.0.0.1", f"broker.port={broker.port}",
            f"core.metricsPort={metrics_port}"])) if d["kind"] == "Deployment"
            and d["metadata"]["name"] == "cfnet-core")
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["securityContext"]["readOnlyRootFilesystem"]
        host, port = urlsplit(control_plane.admin.host).hostname, \
            urlsplit(control_plane.admin.host).port
        name = boxes.run(
            "core", images["core"], "", c["args"], "--network", "host",
            "--user", f"{pod['securityContext']['runAsUser']}:"
                      f"{pod['securityContext']['runAsGroup']}",
            "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "-e", "POD_NAME=cfnet-core-img-0", "-e", "POD_NAMESPACE=cfnet-system",
            "-e", f"KUBERNETES_SERVICE_HOST={host}", "-e", f"KUBERNETES_SERVICE_PORT={port}",
            "-v", f"{sa}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
            "-v", f"{mqtt}:/etc/cfnet/mqtt:ro", "-v", f"{state}:/var/lib/cfnet-core",
            "--tmpfs", "/tmp")
        admin = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))

        def holder() -> object:
            assert boxes.running(name), boxes.logs(name)[-3000:]
            try:
                lease = admin.get("/apis/coordination.k8s.io/v1/namespaces/cfnet-system/"
                                  "leases/cfnet-core")
            except KubeNotFound:
                return None
            return lease["spec"].get("holderIdentity") == "cfnet-core-img-0"

        try:
            wait_for(holder, timeout=90, every=0.5, what="the core image holding the Lease")
        finally:
            admin.close()
        wait_for(lambda: "as core-k8s" in broker.log_text(), timeout=30,
                 what="the leader connecting to MQTT as core-k8s")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            assert r.status == 200 and b"cfnet_" in r.read()
        assert "Traceback" not in boxes.logs(name), boxes.logs(name)[-3000:]
    finally:
        boxes.remove()
        broker.stop()


def test_arm64_images_run_under_qemu(images: dict[str, str], tmp_path: Path) -> None:
    """The arm64 core and agent, run under qemu-user (binfmt_misc, set up by tools/setup.sh):
    their entrypoints start, and the agent gets as far as loading eBPF, refuses, and says why
    (qemu-user passes no bpf(2) through)."""
    for flavour in ("core-arm64", "agent-arm64"):
        info = inspect(images[flavour])
        assert info["Architecture"] == "arm64", (flavour, info["Architecture"])
    for flavour, cmd in (("core-arm64", "cfnet-core"), ("agent-arm64", "cfnet-agent")):
        r = podman("run", "--rm", *podman_run_flags(), "--network", "none", images[flavour],
                   "--help", timeout=300)
        assert r.returncode == 0 and cmd in r.stdout, (flavour, r.stdout[-2000:], r.stderr)
    r = podman("run", "--rm", *podman_run_flags(), "--network", "none", "--entrypoint",
               "python3", images["agent-arm64"], "-c",
               "import platform, ctypes; ctypes.CDLL('libbpf.so.1'); print(platform.machine())",
               timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "aarch64", (r.stdout, r.stderr)
    # The agent itself, with a broker that is not there: it must get as far as choosing its
    # probe and say why eBPF is not it.
    (tmp_path / "pw").write_text("x")
    name = f"cfnet-arm64-{os.getpid()}"
    proc = subprocess.Popen(
        ["podman", "run", "--rm", "--name", name, *podman_run_flags(), "--network", "none",
         "-v", "/sys/kernel/btf:/sys/kernel/btf:ro", "-v", f"{tmp_path}:/etc/cfnet-agent:ro",
         "--tmpfs", "/var/lib/cfnet-agent", images["agent-arm64"], "--node", "arm-1",
         "--broker-host", "127.0.0.1", "--broker-port", "1", "--no-tls",
         "--password-file", "/etc/cfnet-agent/pw", "--buffer-path",
         "/var/lib/cfnet-agent/buffer.db", "--ebpf", "--interval-s", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            lines.append(line)
            if "eBPF not used" in line or time.monotonic() > deadline:
                break
    finally:
        podman("rm", "-f", "-t", "2", name)
        proc.kill()
        proc.wait(30)
    out = "".join(lines)
    refused = [ln for ln in lines if "eBPF not used" in ln]
    assert refused, f"the arm64 agent never reached its probe choice:\n{out[-3000:]}"
    # The CO-RE loader was chosen (BTF is mounted) and aarch64 libbpf opened the object; the
    # refusal is libbpf's own (qemu-user implements no bpf(2): "Function not implemented").
    # (Its sock_diag fallback then fails too: qemu-user has no NETLINK_SOCK_DIAG.)
    assert "libbpf" in refused[0], refused[0]
