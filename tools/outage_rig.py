"""The outage rig that the disconnection benchmarks and tests share.

:class:`Rig` is a lab (a ``cloud`` site and edge sites around the router), a TLS
Mosquitto in the cloud namespace, a :class:`cloud_core.service.CoreService`
running in this process but inside the cloud namespace (its MQTT connection in
a child process, as ``cfnet-core`` runs it; the core object stays here so the
tests can read its state directly), and real
``cfnet-agent`` processes in the edge namespaces. It can SIGKILL an agent,
take a site's link down (``Lab.link_down``: nobody reaches the site) or
*partition* it from the cloud only (an nftables table of our own in the
router's forward hook dropping site <-> cloud packets, while the site still
talks to its peers), and it reads the core's health verdict directly from
the core's state. Used by ``tools.bench_offline``, ``tools.bench_reaction`` and
tests/integration/test_outage.py; :func:`wait_until` by the Kubernetes reaction rig too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_core.health import Health, HealthConfig, node_health
from cloud_core.service import CoreConfig, CoreService
from edge_agent.wire.mqtt import MqttSettings
from tools.broker import Broker
from tools.lab import Lab, LabError, SiteSpec
from tools.netns import in_netns

VENV_BIN = Path(sys.executable).parent


@dataclass
class AgentProc:
    node: str
    site: str
    proc: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class Rig:
    """Lab + broker in the cloud namespace + core (MQTT child process) + agent processes."""

    lab: Lab
    broker: Broker
    core: CoreService
    workdir: Path
    agents: dict[str, AgentProc] = field(default_factory=dict)
    helpers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    partitioned: set[str] = field(default_factory=set)

    # ------------------------------------------------------------------ agents

    def start_agent(self, site: str, node: str, *, interval_s: float = 1.0,
                    extra: Sequence[str] = ()) -> AgentProc:
        creds = self.broker.add_account(node, "agent")
        pw = self.workdir / f"{node}.pw"
        pw.write_text(creds.password)
        log_path = self.workdir / f"{node}.log"
        argv = [str(VENV_BIN / "cfnet-agent"), "--node", node,
                "--broker-host", self.broker.host, "--broker-port", str(self.broker.port),
                "--password-file", str(pw), "--ca-file", str(self.broker.ca_file),
                "--buffer-path", str(self.workdir / f"{node}.db"),
                "--interval-s", str(interval_s), "--no-ebpf", "--no-active-probing", *extra]
        out = open(log_path, "ab")  # noqa: SIM115 - the process owns it
        try:
            proc = self.lab.popen(site, argv, stdout=out, stderr=subprocess.STDOUT)
        finally:
            out.close()
        a = AgentProc(node, site, proc, log_path)
        self.agents[node] = a
        return a

    def kill_agent(self, node: str) -> None:
        a = self.agents.pop(node)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(10)

    def stop_agent(self, node: str) -> None:
        a = self.agents.pop(node)
        a.proc.terminate()
        try:
            a.proc.wait(15)
        except subprocess.TimeoutExpired:
            a.proc.kill()
            a.proc.wait(10)

    # ------------------------------------------------------------------ traffic

    def traffic(self, a: str, b: str, seconds: float, *, port: int = 5201,
                rate_mbit: float = 1.0) -> None:
        """Bounded paced TCP flows a -> b and b -> a (both sites measure each other)."""
        py = sys.executable
        for src, dst in ((a, b), (b, a)):
            self.helpers.append(self.lab.popen(dst, [py, "-m", "tools.traffic", "sink",
                                                     "--port", str(port),
                                                     "--duration", str(seconds + 5)],
                                               stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
            self.helpers.append(self.lab.popen(src, [py, "-m", "tools.traffic", "send",
                                                     self.lab.addr(dst), "--port", str(port),
                                                     "--rate-mbit", str(rate_mbit),
                                                     "--duration", str(seconds),
                                                     "--max-mb", str(rate_mbit * seconds / 8 + 1)],
                                               stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))

    # ------------------------------------------------------------------ faults

    def _nft_table(self, site: str) -> str:
        return f"cfnet_part_{site}"

    def partition(self, site: str) -> None:
        """Drop everything between ``site`` and the cloud site in the router; peers unaffected."""
        s, c = self.lab.addr(site), self.lab.addr("cloud")
        script = (f"table inet {self._nft_table(site)} {{\n"
                  "  chain forward {\n"
                  "    type filter hook forward priority -10; policy accept;\n"
                  f"    ip saddr {s} ip daddr {c} counter drop\n"
                  f"    ip saddr {c} ip daddr {s} counter drop\n"
                  "  }\n}\n")
        _nft(self.lab.router, ["-f", "-"], script)
        self.partitioned.add(site)

    def heal(self, site: str) -> None:
        _nft(self.lab.router, ["delete", "table", "inet", self._nft_table(site)], check=False)
        self.partitioned.discard(site)

    # ------------------------------------------------------------------ core view

    def health(self, node: str) -> Health:
        return node_health(self.core.state.snapshot(time.time()), node, self.core.cfg.health)

    def history(self, node: str) -> list[tuple[str, int]]:
        return self.core.state.node_history(node)

    def boot_seqs(self, node: str, boot: str) -> list[int]:
        return [s for b, s in self.history(node) if b == boot]

    def current(self, node: str) -> tuple[str, int]:
        v = self.core.state.snapshot(time.time()).nodes.get(node)
        return (v.boot, v.seq) if v is not None else ("", 0)

    def close(self) -> None:
        for node in list(self.agents):
            with contextlib.suppress(Exception):
                self.stop_agent(node)
        for p in self.helpers:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(Exception):
                p.wait(5)
        for site in list(self.partitioned):
            self.heal(site)


def wait_until(pred: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.05
               ) -> Any:
    """``pred()`` until truthy (returned) or ``timeout_s`` (TimeoutError with its last
    answer)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


def _nft(router: str, args: Sequence[str], script: str | None = None, *,
         check: bool = True) -> None:
    """``nft ARGS`` in the lab's router namespace."""
    argv = ["ip", "netns", "exec", router, "nft", *args]
    try:
        cp = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=30,
                            check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"nft failed: {exc}") from exc
    if check and cp.returncode != 0:
        raise LabError(f"{' '.join(argv)}: rc={cp.returncode}: {cp.stderr.strip()[:400]}")


@contextlib.contextmanager
def rig(edges: Sequence[str], workdir: Path, *, prefix: str = "",
        health: HealthConfig = HealthConfig()) -> Iterator[Rig]:
    """Bring up the lab, the broker (cloud), the core (cloud; MQTT in its child process,
    as shipped); tear all down."""
    if os.geteuid() != 0:
        raise PermissionError("the outage rig needs root (network namespaces)")
    prefix = prefix or f"out{os.getpid() % 10000}"
    sites = [SiteSpec("cloud"), *(SiteSpec(e) for e in edges)]
    with Lab(sites, prefix=prefix) as lab:
        broker = Broker(workdir / "broker", host=lab.addr("cloud"), netns=lab.ns("cloud"))
        broker.start()
        try:
            creds = broker.add_account("core-0", "core")
            mqtt = MqttSettings(host=broker.host, port=broker.port, username=creds.username,
                                password=creds.password, tls=True, ca_file=creds.ca_file,
                                client_id="core-0", keepalive_s=5)
            cfg = CoreConfig(mqtt=mqtt, db_path=workdir / "core.db", health=health,
                             step_interval_s=0.5)
            core: CoreService = in_netns(lab.ns("cloud"), lambda: CoreService(cfg))
            in_netns(lab.ns("cloud"), core.start)
            r = Rig(lab, broker, core, workdir)
            try:
                if not core.mqtt.wait_connected(15):
                    raise TimeoutError("core did not connect to the broker")
                yield r
            finally:
                r.close()
                core.stop()
        finally:
            broker.stop()
