"""The agent as users install it: a wheel in a fresh virtual environment, outside the checkout.

The wheel is built from a clean tree (the sources as git has them: no ``bpf/obj``), so
building it compiles the CO-RE object (setup.py's build hook). One module-scoped agent
process, started from that environment's own ``cfnet-agent`` script (no PYTHONPATH,
working directory outside the checkout, no compiler on its PATH), reporting to a real
Mosquitto (tools/broker.py):

- its reports say ``probe: ebpf``, loaded by the CO-RE loader in the agent's own process
  -- so the wheel carried the BPF object its build compiled, found in site-packages, and
  Debian's libbpf1 loaded it; the environment has no BCC at all (as ``pip install
  cfnet[agent]`` on a device with libbpf1 would be); its ``/status`` says ``loader: core``
  and why, and it is ready (``/readyz``);
- the process maps no LLVM/BCC library;
- after SIGKILL no program it held is left in the kernel: a perf event (the
  tracepoint attachment) holds its program, so a program id that no longer
  resolves means neither program nor attachment survived.

The venv gets exactly the agent's requirements, linked from the test venv's
copies (tests run without network); OR-Tools and the kubernetes client must
not import there.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from edge_agent.bpfsys import prog_alive
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import MqttClient
from tests.integration.helpers import settings, wait_for
from tools.broker import Broker, free_port

pytestmark = [pytest.mark.root, pytest.mark.ebpf, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# msgspec is the agent's too (its strict config parsing: edge_agent/config.py), 0.2 MB
CORE_ONLY = {"ortools", "kubernetes", "numpy"}
HEAVY_LIBS = re.compile(r"libLLVM|libclang|libbcc", re.I)


@dataclass
class Installed:
    venv: Path
    wheel: Path
    proc: subprocess.Popen[bytes]
    log: Path
    reports: list[dict[str, object]]
    health: str  # the agent's /healthz, /readyz, /status and /metrics


def _base_requirements(wheel: Path) -> list[str]:
    """Names the wheel requires with no extra, or with the ``agent`` extra, on this platform."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.message_from_bytes(z.read(meta))
    names = []
    for line in msg.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": "agent"}):
            names.append(canonicalize_name(req.name))
    return names


def _closure(names: list[str]) -> set[str]:
    """The requirement closure (no extras), resolved against this interpreter's installs."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for line in metadata.distribution(n).requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def _link_dist(name: str, site: Path) -> None:
    """Symlink an installed distribution (its top-level modules and dist-info) into ``site``."""
    dist = metadata.distribution(name)
    tops = set()
    for f in dist.files or []:
        first = f.parts[0]
        if first == ".." or first == "__pycache__":
            continue
        tops.add(first)
    base = Path(str(dist.locate_file("")))
    for top in tops:
        dst = site / top
        if not dst.exists():
            dst.symlink_to(base / top)


@pytest.fixture(scope="module")
def installed(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    if os.geteuid() != 0:
        pytest.fail("the eBPF agent needs root (run the tests as root)")
    tmp = tmp_path_factory.mktemp("agent-install")
    # Build from a clean copy (setuptools writes build/ and *.egg-info next to the
    # sources): what git tracks, without the object a checkout may have built.
    src = tmp / "src"
    (src / "tools").mkdir(parents=True)
    for f in ("pyproject.toml", "setup.py", "MANIFEST.in", "tools/__init__.py",
              "tools/build_bpf.py"):
        shutil.copy(REPO / f, src / f)
    shutil.copytree(REPO / "bpf", src / "bpf", ignore=shutil.ignore_patterns("obj"))
    for pkg in ("edge_agent", "cloud_core"):
        shutil.copytree(REPO / pkg, src / pkg, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    assert (src / "edge_agent" / "bpf").is_symlink() and not (src / "bpf" / "obj").exists()
    dist = tmp / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-index",
                        "--no-build-isolation", "-w", str(dist), str(src)],
                       timeout=300, capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    out = r.stdout + r.stderr
    assert "cfnet: CO-RE object" in out, out[-3000:]  # compiled by the build hook
    wheel = next(dist.glob("cfnet-*.whl"))
    venv = tmp / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    vpy = venv / "bin" / "python"
    site = Path(subprocess.run([str(vpy), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # No BCC: the CO-RE loader needs only Debian's libbpf1 (a shared library, no Python).
    assert not (site / "bcc").exists()
    for name in _closure(_base_requirements(wheel)):
        _link_dist(name, site)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=300,
                   capture_output=True)
    chk = subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "check"],
                         capture_output=True, text=True, timeout=120)
    assert chk.returncode == 0, chk.stdout + chk.stderr

    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CFNET_BPF_DIR", "CFNET_BPF_LOADER", "CFNET_BTF_PATH",
                        "CFNET_BCC_FALLBACK")}
    # No compiler the agent could reach: only the venv's scripts and the system's basics.
    env["PATH"] = f"{venv / 'bin'}:/usr/sbin:/sbin"
    node = "edge-pkg"
    creds = broker.add_account(node, "agent")
    (tmp / "a.pw").write_text(creds.password)
    reports: list[dict[str, object]] = []
    lock = threading.Lock()

    def on_message(m: Message) -> None:
        with lock:
            reports.append(json.loads(m.payload))

    watcher = MqttClient(settings(broker, broker.add_account("core-pkg", "core")),
                         on_message=on_message)
    watcher.start()
    assert watcher.wait_connected(10), watcher.last_refusal
    watcher.subscribe(f"cfnet/v1/nodes/{node}/telemetry")
    log = tmp / "agent.log"
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(venv / "bin" / "cfnet-agent"), "--node", node, "--broker-host", broker.host,
             "--broker-port", str(broker.port), "--password-file", str(tmp / "a.pw"),
             "--ca-file", str(broker.ca_file), "--buffer-path", str(tmp / "buffer.db"),
             "--interval-s", "1", "--no-active-probing", "--ebpf",
             "--metrics-port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, cwd=str(tmp), env=env)
    try:
        yield Installed(venv, wheel, proc, log, reports, f"http://127.0.0.1:{port}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        watcher.stop()


def test_wheel_is_agent_only_and_carries_the_bpf_sources(installed: Installed) -> None:
    reqs = set(_base_requirements(installed.wheel))
    assert reqs and not reqs & CORE_ONLY, reqs
    with zipfile.ZipFile(installed.wheel) as z:
        names = set(z.namelist())
    assert {"edge_agent/bpf/tcp_links.c", "edge_agent/bpf/cfnet_links.h",
            "edge_agent/bpf/obj/tcp_links.bpf.o"} <= names
    vpy = str(installed.venv / "bin" / "python")
    code = ("import importlib.util as u, edge_agent, edge_agent.bpf_loader as b; "
            "print(edge_agent.__file__); print(b.bpf_dir()); "
            "print(u.find_spec('ortools'), u.find_spec('kubernetes'), u.find_spec('bcc'))")
    r = subprocess.run([vpy, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=str(installed.venv),
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr
    pkg, bpf_dir, specs = r.stdout.splitlines()
    assert pkg.startswith(str(installed.venv)), pkg  # the installed copy, not the checkout
    assert bpf_dir.startswith(str(installed.venv)) and Path(bpf_dir, "tcp_links.c").is_file()
    assert specs == "None None None", specs  # neither OR-Tools, the kubernetes client nor BCC
    assert Path(bpf_dir, "obj", "tcp_links.bpf.o").is_file()


def test_installed_agent_reports_ebpf_and_maps_no_llvm(installed: Installed) -> None:
    wait_for(lambda: len(installed.reports) >= 2 or installed.proc.poll() is not None, 60,
             "two reports from the installed agent")
    log = installed.log.read_text(errors="replace")
    assert installed.proc.poll() is None, log[-3000:]
    probes = {r["probe"] for r in installed.reports}
    assert probes == {"ebpf"}, (probes, log[-3000:])
    maps = Path(f"/proc/{installed.proc.pid}/maps").read_text()
    heavy = sorted({ln.split()[-1] for ln in maps.splitlines() if HEAVY_LIBS.search(ln)})
    assert not heavy, heavy
    m = re.search(r"ebpf probe: loader (\w+) \((.*)\), pid (\d+)", log)
    assert m, log[-3000:]
    # CO-RE, in the agent's own process, and the log says why
    assert m.group(1) == "core" and "BTF" in m.group(2), m.group(0)
    assert int(m.group(3)) == installed.proc.pid, m.group(0)


def test_installed_agent_status_says_loader_core_and_it_is_ready(installed: Installed) -> None:
    wait_for(lambda: len(installed.reports) >= 1 or installed.proc.poll() is not None, 60,
             "a report from the installed agent")
    with urllib.request.urlopen(f"{installed.health}/status", timeout=10) as r:
        status = json.loads(r.read())
    assert status["loader"] == "core", status
    assert "BTF" in status["loader_reason"] and status["probe"] == "ebpf", status
    with urllib.request.urlopen(f"{installed.health}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert re.search(r'^cfnet_agent_loader\{loader="core",reason="kernel BTF at [^"]+"\} 1\.0$',
                     metrics, re.M), metrics[-2000:]
    # Connected and acknowledged by no core (none runs here): buffering within bounds.
    with urllib.request.urlopen(f"{installed.health}/readyz", timeout=10) as r:
        assert r.status == 200 and r.read() == b"[+]sampler ok\n[+]probe ok\n[+]reports ok\nok\n"


def _held(pid: int) -> tuple[set[int], int]:
    """(BPF program ids, perf-event fd count) a process holds."""
    progs, perf = set(), 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target == "anon_inode:[perf_event]":
            perf += 1
        elif target == "anon_inode:bpf-prog":
            info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
            m = re.search(r"^prog_id:\s*(\d+)", info, re.M)
            if m:
                progs.add(int(m.group(1)))
    return progs, perf


def test_sigkill_leaves_no_program_or_attachment(installed: Installed) -> None:
    wait_for(lambda: installed.reports or installed.proc.poll() is not None, 60, "a report")
    assert installed.proc.poll() is None, installed.log.read_text(errors="replace")[-3000:]
    progs, perf = _held(installed.proc.pid)
    assert len(progs) == 3 and perf == 3, (progs, perf)  # three tracepoints, each attached
    assert all(prog_alive(p) for p in progs)
    installed.proc.send_signal(signal.SIGKILL)
    installed.proc.wait(10)
    # The kernel frees programs after an RCU grace period: wait, bounded.
    wait_for(lambda: not any(prog_alive(p) for p in progs), 10, "the programs to be freed")
    # And no other process (a lingering loader) holds one.
    for proc_dir in Path("/proc").iterdir():
        if proc_dir.name.isdigit():
            try:
                held, _ = _held(int(proc_dir.name))
            except OSError:
                continue
            assert not held & progs, (proc_dir.name, held & progs)
