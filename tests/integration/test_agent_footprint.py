"""The running CO-RE agent's footprint: its import set and RSS, on a real broker.

One real agent process (``python -X importtime -m edge_agent.main``, the entry point of
``cfnet-agent``) with the CO-RE loader, reporting every second to the module's Mosquitto
(TLS, passwords, ACL). After its first report reaches a core subscriber: its VmRSS is
read from /proc, its log must say it loaded CO-RE, and every module it imported (from
``-X importtime``) is checked against the heavy ones its path must not load
(tests/unit/test_agent_imports.py names who needs each). The RSS bound, 29 MiB,
leaves a margin above what tools/bench_agent.py measures (26.6 MiB): it catches a
heavy import coming back, not noise. tools/bench_agent.py gives the figures in the lab.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edge_agent.host import nvidia_driver
from edge_agent.wire import telemetry_topic
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import MqttClient
from tests.integration.helpers import settings, wait_for
from tests.unit.test_agent_imports import FORBIDDEN
from tools.broker import Broker

pytestmark = [pytest.mark.root, pytest.mark.ebpf]

REPO = Path(__file__).resolve().parents[2]
RSS_CEILING_KIB = 29 * 1024


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def _imported(stderr: str) -> set[str]:
    """Module names from ``-X importtime`` lines (``import time: self | cumulative | name``)."""
    out = set()
    for line in stderr.splitlines():
        if line.startswith("import time:"):
            name = line.rsplit("|", 1)[-1].strip()
            if name and name != "imported package":
                out.add(name)
    return out


def test_core_agent_reports_with_a_light_import_set_and_rss(broker: Broker,
                                                            tmp_path: Path) -> None:
    if os.geteuid() != 0 or not Path("/sys/kernel/btf/vmlinux").exists():
        pytest.fail("needs root and a kernel with BTF (setup provides both here)")
    node = "foot-1"
    creds = broker.add_account(node, "agent")
    pw = tmp_path / "pw"
    pw.write_text(creds.password)
    first: list[float] = []
    lock = threading.Lock()

    def on_message(m: Message) -> None:
        if m.topic == telemetry_topic(node):
            with lock:
                first.append(time.monotonic())

    watcher = MqttClient(settings(broker, broker.add_account("core-foot", "core"),
                                  client_id="core-foot"), on_message=on_message)
    watcher.start()
    log = tmp_path / "agent.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        assert watcher.wait_connected(10), watcher.last_refusal
        watcher.subscribe(telemetry_topic(node))
        env = {k: v for k, v in os.environ.items() if k != "CFNET_BTF_PATH"}
        env["CFNET_BPF_LOADER"] = "core"
        with log.open("wb") as out:
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-X", "importtime", "-m", "edge_agent.main", "--node", node,
                 "--broker-host", broker.host, "--broker-port", str(broker.port),
                 "--password-file", str(pw), "--ca-file", str(broker.ca_file),
                 "--buffer-path", str(tmp_path / "buf.db"), "--interval-s", "1", "--ebpf",
                 "--no-active-probing"],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        wait_for(lambda: first or proc.poll() is not None, 30,
                 "the agent's first report at the core's subscriber")
        assert proc.poll() is None, log.read_text()[-3000:]
        rss = _status_kib(proc.pid, "VmRSS")
        print(f"\nCO-RE agent: first report {first[0] - t0:.2f} s after start, "
              f"VmRSS {rss / 1024:.1f} MiB, VmHWM {_status_kib(proc.pid, 'VmHWM') / 1024:.1f} MiB")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()[-3000:]
    finally:
        watcher.stop()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text(errors="replace")
    assert "probe: loader core " in text or "ebpf probe: loader core" in text, text[-3000:]
    mods = _imported(text)
    assert {"edge_agent.libbpf_loader", "paho.mqtt.client"} <= mods, sorted(mods)
    # typing_extensions is in -X importtime's list as msgspec's attempt, which
    # edge_agent.lightimport refuses (importtime logs an import that fails too);
    # tests/unit/test_agent_imports.py checks sys.modules, where it is not.
    found = {m: why for m, why in FORBIDDEN.items() if m != "typing_extensions"
             and (m in mods or any(x.startswith(m + ".") for x in mods))}
    assert not found, f"the running CO-RE agent imported (and who needs them): {found}"
    if not nvidia_driver():
        assert "pynvml" not in mods, "pynvml imported without an NVIDIA driver"
    assert rss <= RSS_CEILING_KIB, (
        f"CO-RE agent VmRSS {rss / 1024:.1f} MiB > {RSS_CEILING_KIB / 1024:.0f} MiB: "
        f"a heavy import came back? imported: {sorted(m for m in mods if '.' not in m)}")
