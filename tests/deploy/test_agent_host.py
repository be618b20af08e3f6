"""The agent on a plain host, as the README's one-line install does it: the wheel built from
this checkout, deploy/systemd/install-agent.sh into a prefix (a venv, the CO-RE BPF object and
the sources, the unit with the prefix filled in, an agent.yaml skeleton), `systemd-analyze verify`
on the installed unit, then the unit's own ExecStart and Environment run (no systemd is PID 1
here, so the test starts the command line systemd would) against a real Mosquitto; a core in
this process must see the node reporting with the eBPF probe."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloud_core.service import CoreConfig, CoreService
from tests.integration.helpers import settings
from tools.broker import Broker

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def unit_settings(unit: Path) -> tuple[list[str], dict[str, str]]:
    argv: list[str] = []
    env: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "ExecStart":
            argv = shlex.split(value)
        elif key == "Environment":
            k, _, v = value.partition("=")
            env[k] = v
    return argv, env


def test_install_script_and_unit_run_the_agent(tmp_path: Path) -> None:
    # Built from a copy: pip builds in the source tree, and a build/ left in the checkout
    # would feed stale modules into later wheels.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "tests", "docs", "deploy"))
    wheel_dir = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                        str(wheel_dir), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = wheel_dir.glob("cfnet-*.whl")
    prefix, units, conf = tmp_path / "opt-cfnet", tmp_path / "units", tmp_path / "etc"
    env = {**os.environ, "CFNET_PREFIX": str(prefix), "SYSTEMD_DIR": str(units),
           "CFNET_CONFIG_DIR": str(conf)}
    r = subprocess.run(["bash", str(REPO / "deploy/systemd/install-agent.sh"), str(wheel)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    unit = units / "cfnet-agent.service"
    assert (prefix / "bpf" / "tcp_links.c").exists() and (conf / "agent.yaml").exists()
    assert (prefix / "bpf" / "obj" / "tcp_links.bpf.o").exists()  # the CO-RE object
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    argv, unit_env = unit_settings(unit)
    assert argv[:3] == [str(prefix / "bin" / "cfnet-agent"), "--config", str(conf / "agent.yaml")]
    assert unit_env == {"CFNET_BPF_DIR": str(prefix / "bpf")}

    broker = Broker(tmp_path / "broker")
    broker.start()
    node = f"host-inst-{os.getpid()}"
    core = None
    proc = None
    try:
        creds = broker.add_account(node, "agent")
        (conf / "password").write_text(creds.password)
        (conf / "ca.crt").write_bytes(broker.ca_file.read_bytes())
        skeleton = (conf / "agent.yaml").read_text()
        (conf / "agent.yaml").write_text(
            skeleton.replace("broker_host: broker.example.org", f"broker_host: {broker.host}")
            .replace("broker_port: 8883", f"broker_port: {broker.port}")
            .replace("/var/lib/cfnet-agent/buffer.db", str(tmp_path / "buffer.db"))
            + f"node: {node}\n")
        core = CoreService(CoreConfig(mqtt=settings(broker, broker.add_account(
            "core-host", "core")), db_path=tmp_path / "core.db"))
        core.start()
        log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen(argv, env={**os.environ, **unit_env}, stdout=log,
                                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        seen = None
        while time.monotonic() < deadline and proc.poll() is None:
            snap = core.state.snapshot(time.time())
            seen = snap.nodes.get(node)
            if seen is not None and seen.reports > 0:
                break
            time.sleep(0.5)
        text = (tmp_path / "agent.log").read_text(errors="replace")
        assert seen is not None and seen.reports > 0, f"no report from {node}:\n{text[-3000:]}"
        assert seen.probe == "ebpf", text[-3000:]
        assert "ebpf probe: loader core" in text, text[-3000:]  # no compiler on the path
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if core is not None:
            core.stop()
        broker.stop()
