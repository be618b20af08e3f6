"""An edge device outside the cluster network, for the tests on the real node.

:class:`EdgeDevice` is a network namespace (``cfe-<pid>``) joined by a veth pair to the real
node's namespace (``edge0`` there, 10.252.N.1/30; ``eth0`` in the device, 10.252.N.2/30),
whose only route beyond that link is to the node's address (``RealNode.node_ip``): no
Service range, no pod range, no API server of its own. What the device reaches of the
cluster is what the node publishes on its address: NodePorts. It runs a cfnet agent as
``cfnet-agent`` starts (``python -m edge_agent.main -c <file>``) with the files a device's
node agent would give it (a pod-bound ServiceAccount token, the cluster's CA, the broker's
CA). Everything it makes is removed by :meth:`EdgeDevice.close` (the namespace and, with
it, both ends of the veth).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.faults import Samples, samples
from tools.envtest.node import RealNode
from tools.netns import in_netns
from tools.procs import stop_all

ROOT = Path(__file__).resolve().parents[2]
METRICS_PORT = 19109


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=15)
    if check and r.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


@dataclass
class EdgeDevice:
    node: RealNode
    dir: Path
    ns: str = field(init=False)
    addr: str = field(init=False)
    gateway: str = field(init=False)
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.ns = f"cfe-{os.getpid()}"
        net = self.node.host_ip.split(".")[2]  # this node's /30 number: unique per process
        self.gateway, self.addr = f"10.252.{net}.1", f"10.252.{net}.2"

    def open(self) -> EdgeDevice:
        # A crashed run's device: a namespace of a process that no longer runs (its veth
        # went with that run's node namespace).
        for name in _ip("netns", "list").stdout.split():
            pid = name.removeprefix("cfe-")
            if name.startswith("cfe-") and pid.isdigit() and (
                    int(pid) == os.getpid() or not Path(f"/proc/{pid}").exists()):
                _ip("netns", "del", name, check=False)
        _ip("netns", "add", self.ns)
        try:
            _ip("-n", self.node.ns, "link", "add", "edge0", "type", "veth", "peer", "name",
                "eth0", "netns", self.ns)
            _ip("-n", self.node.ns, "addr", "add", f"{self.gateway}/30", "dev", "edge0")
            _ip("-n", self.node.ns, "link", "set", "edge0", "up")
            for args in (("link", "set", "lo", "up"), ("addr", "add", f"{self.addr}/30", "dev",
                                                       "eth0"),
                         ("link", "set", "eth0", "up"),
                         ("route", "add", f"{self.node.node_ip}/32", "via", self.gateway)):
                _ip("-n", self.ns, *args)
            # The node forwards what a NodePort sends on (kube-proxy's DNAT); its namespace's
            # own setting, which the CNI bridge already turns on for the pods.
            self.node.exec_in_ns(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        except BaseException:
            self.close()
            raise
        return self

    def routes(self) -> str:
        return _ip("-n", self.ns, "-4", "route", "show").stdout

    def reaches(self, addr: str) -> bool:
        """Whether the device has a route to ``addr``."""
        return _ip("-n", self.ns, "route", "get", addr, check=False).returncode == 0

    def connects(self, addr: str, port: int) -> bool:
        """Whether a TCP connection from the device to ``addr:port`` is accepted."""
        def connect() -> bool:
            with contextlib.suppress(OSError), socket.create_connection((addr, port), 2):
                return True
            return False
        return in_netns(self.ns, connect)

    def start_agent(self, config: dict[str, Any]) -> None:
        """``cfnet-agent -c <dir>/agent.yaml`` in the device's namespace (this checkout's
        code), logging to ``<dir>/agent.log``."""
        cfg = self.dir / "agent.yaml"
        cfg.write_text(yaml.safe_dump({**config, "metrics_port": METRICS_PORT}))
        log = open(self.dir / "agent.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.ns}", sys.executable, "-m", "edge_agent.main",
             "-c", str(cfg)], cwd=ROOT, stdout=log, stderr=log, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        log.close()

    def log(self, n: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "agent.log").read_text(errors="replace")[-n:]
        return ""

    def metrics(self) -> Samples:
        """The agent's /metrics, fetched from inside the device's namespace."""
        def fetch() -> str:
            url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
            with urllib.request.urlopen(url, timeout=3) as r:
                return str(r.read().decode())
        return samples(in_netns(self.ns, fetch))

    def close(self) -> None:
        if self.proc is not None:
            stop_all([self.proc])
            self.proc = None
        self.node.exec_in_ns(["ip", "link", "del", "edge0"], check=False)
        _ip("netns", "del", self.ns, check=False)
