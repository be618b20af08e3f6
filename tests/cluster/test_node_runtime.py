"""The real node's runtime half (``RealNode.start_runtime``: network namespace, veth,
containerd with the locally built images) runs a container, and leaves nothing behind: not
after ``stop()``, and not after a run that was killed (the next run's ``cleanup_stale``).

Needs no Kubernetes binary: runc, containerd and the CNI plugins are Debian's.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.envtest import ControlPlane
from tools.envtest.images import PODBIN_IMAGE
from tools.envtest.node import CGROUP_ROOT, SHIM_SOCKETS, RealNode, cleanup_stale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)
SOCKETS_BEFORE = set(SHIM_SOCKETS.glob("*"))
FIFOS = Path("/run/containerd/fifo")
FIFOS_BEFORE = set(FIFOS.glob("*"))
RUNC = Path("/run/containerd/runc")
RUNC_BEFORE = set(RUNC.glob("*/*"))


def _leftovers(tag: str, workdir: Path) -> list[str]:
    out = []
    if tag in subprocess.run(["ip", "netns", "list"], capture_output=True,
                             text=True).stdout.split():
        out.append(f"netns {tag}")
    with open("/proc/self/mountinfo") as f:
        out += [f"mount {m}" for line in f if (m := line.split()[4]).startswith(str(workdir))]
    out += [f"cgroup {p}" for p in CGROUP_ROOT.glob(f"*/{tag}")]
    if workdir.exists():
        out.append(f"dir {workdir}")
    out += [f"shim socket {p}" for p in set(SHIM_SOCKETS.glob("*")) - SOCKETS_BEFORE]
    out += [f"ctr fifo {p}" for p in set(FIFOS.glob("*")) - FIFOS_BEFORE]
    out += [f"runc state {p}" for p in set(RUNC.glob("*/*")) - RUNC_BEFORE]
    if any(tag[4:] in line for line in subprocess.run(["ip", "-br", "link"],
                                                       capture_output=True, text=True)
           .stdout.splitlines()):
        out.append("veth")
    return out


def test_runtime_runs_a_container_on_the_veth_and_cleans_up() -> None:
    cp = ControlPlane()
    node = RealNode(cp)
    listener = None
    try:
        node.start_runtime()
        # The container (host network = the node's namespace) reaches the root namespace's
        # end of the veth, and nothing else: the namespace has no default route.
        listener = socket.create_server((node.host_ip, 0))
        port = listener.getsockname()[1]
        run = node._ctr("run", "--rm", "--net-host", *node.ctr_run_flags(), "--cgroup", f"/{node.tag}/t1",
                        PODBIN_IMAGE, "t1", "/bin/podbin", "dial", f"{node.host_ip}:{port}")
        r = subprocess.run(run, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "connected" in r.stdout, (r.stdout, r.stderr, node.logs())
        routes = node.exec_in_ns(["ip", "route"]).stdout
        assert "default" not in routes, routes
    finally:
        if listener is not None:
            listener.close()
        node.stop()
        cp.stop()
    assert _leftovers(node.tag, node.dir) == []


def test_a_killed_run_is_cleaned_up_by_the_next() -> None:
    # A child starts the runtime with a container running, then dies by SIGKILL: no finaliser
    # runs, containerd, the shim and the container survive it.
    code = textwrap.dedent(f"""
        import os, signal, subprocess, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tools.envtest import ControlPlane
        from tools.envtest.node import RealNode
        cp = ControlPlane()
        node = RealNode(cp)
        node.start_runtime()
        subprocess.run(node._ctr("run", "-d", "--net-host", *node.ctr_run_flags(),
                                 "--cgroup", f"/{{node.tag}}/t",
                                 {PODBIN_IMAGE!r}, "t", "/bin/podbin", "serve", "18080"),
                       check=True, timeout=120)
        print(node.tag, node.dir, cp.dir, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == -9, r.stderr
    tag, workdir, cp_dir = r.stdout.split()
    shutil.rmtree(cp_dir, ignore_errors=True)  # the unstarted control plane's empty dir
    assert _leftovers(tag, Path(workdir)), "the killed run left nothing to clean up"
    assert tag in cleanup_stale()
    assert _leftovers(tag, Path(workdir)) == []
