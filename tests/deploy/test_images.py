"""The two images built from the Containerfile (tools/images.sh: mmdebstrap base, podman
build), run with podman as the chart runs them, on the real kernel and a real Mosquitto.

A lab of three network namespaces: the broker and the core image in ``cloud`` (non-root,
read-only root filesystem, credentials mounted as the chart's Secret is), an agent image in
``edgea`` and one in ``edgeb`` (privileged, BTF / tracefs / modules / headers mounted from the
host, as the DaemonSet does). The core built from the image must show both nodes measured by
eBPF and the link between them, asked through cfnetctl as an operator would. The core runs
without --kubernetes here: its Kubernetes mode is exercised against the real API server in
tests/k8s; this test is about the image (interpreter, dependencies, entrypoint, user, mounts).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.conftest import podman_run_flags
from tools.broker import Broker
from tools.lab import Lab, SiteSpec

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
    agent = inspect(images["agent"])["Config"]
    assert isinstance(core, dict) and isinstance(agent, dict)
    assert core["User"] == "65532:65532"  # the core never runs as root
    assert core["Entrypoint"] == ["cfnet-core"] and agent["Entrypoint"] == ["cfnet-agent"]
    assert "CFNET_BPF_DIR=/opt/cfnet-app/bpf" in agent["Env"]
    # The agent image carries BCC and the BPF sources; the core image neither.
    r = podman("run", "--rm", *podman_run_flags(), "--network", "none", "--entrypoint",
               "python3", images["agent"], "-c",
               "import bcc, os; print(sorted(os.listdir(os.environ['CFNET_BPF_DIR'])))")
    assert r.returncode == 0, r.stderr
    assert "tcp_links.c" in r.stdout and "cfnet_links.h" in r.stdout
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
        r = podman("run", "-d", "--name", full, *podman_run_flags(),
                   "--network", f"ns:/run/netns/{netns}", *flags, image, *args, timeout=120)
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
            boxes.run(node, images["agent"], lab.ns(site),
                      ["--config", "/etc/cfnet-agent/agent.yaml"], "-e", f"CFNET_NODE={node}",
                      "--privileged", "-v", "/sys/kernel/btf:/sys/kernel/btf:ro",
                      "-v", "/sys/kernel/tracing:/sys/kernel/tracing",
                      "-v", "/sys/kernel/debug:/sys/kernel/debug",
                      "-v", "/lib/modules:/lib/modules:ro", "-v", "/usr/src:/usr/src:ro",
                      "--tmpfs", "/var/lib/cfnet-agent", "-v", f"{d}:/etc/cfnet-agent:ro")
        procs.append(lab.popen("edgeb", [sys.executable, "-m", "tools.traffic", "sink",
                                         "--port", "5201", "--duration", "150"], cwd=str(REPO)))
        procs.append(lab.popen("edgea", [sys.executable, "-m", "tools.traffic", "send",
                                         lab.addr("edgeb"), "--port", "5201", "--rate-mbit",
                                         "5", "--duration", "140", "--max-mb", "100"],
                               cwd=str(REPO)))
        ops = broker.add_account("ops-img", "operator")
        ctl = [str(VENV_BIN / "cfnetctl"), "--broker-host", broker.host, "--broker-port",
               str(broker.port), "--user", "ops-img", "--password", ops.password,
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
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        boxes.remove()
        broker.stop()
