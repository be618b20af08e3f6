"""kwok for the test cluster: many simulated nodes with no kubelet.

``Kwok(control_plane)`` runs the kwok controller (built by ``tools/envtest/build.sh`` from
``sigs.k8s.io/kwok``) with kwok's own "fast" stages
(``$CFNET_CACHE/envtest/kwok-<v>/stages-fast.yaml``: nodes initialised and kept alive with a
Lease; pods Pending -> Running/Ready at once, completed, and terminating pods removed). It
manages only the nodes annotated ``kwok.x-k8s.io/node: fake`` (``Kwok.node()`` makes one),
so a real kubelet's node beside them is left alone. kwok touches
nothing but the API server: no network, no containers.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from types import TracebackType
from typing import Any

from tools.envtest.harness import (
    ControlPlane,
    EnvtestError,
    _terminate,
    all_binary_paths,
    ensure_binaries,
    free_port,
)

ANNOTATION = "kwok.x-k8s.io/node"
POD_CIDR = "10.252.0.0/16"


class Kwok:
    """The kwok controller against ``cp``; a context manager."""

    def __init__(self, cp: ControlPlane, *, log_stream: Any = None) -> None:
        self.cp = cp
        self.log_stream = log_stream
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = cp.dir / "kwok.log"

    def __enter__(self) -> Kwok:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Start kwok and wait until it runs a node. kwok v0.8.0 can die while it starts
        ("fatal error: concurrent map writes" in its CEL registry, easycel types.go: a race
        of its own start-up goroutines, seen once in tests/k8s): an exit before it is ready
        is retried, up to 3 starts, saying so."""
        for attempt in range(1, 4):
            try:
                self._start_once()
                return
            except _KwokExited as e:
                if attempt == 3:
                    raise
                sys.stderr.write(f"[envtest] kwok exited while starting (start {attempt} of "
                                 f"3), starting it again: {str(e).splitlines()[0]}\n")

    def _start_once(self) -> None:
        ensure_binaries(stream=self.log_stream, kwok=True)
        binary = all_binary_paths()["kwok"]
        stages = binary.parent.parent / "stages-fast.yaml"
        if not stages.exists():
            raise EnvtestError(f"kwok's stages are missing ({stages}); rerun build.sh")
        log = open(self.log, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [str(binary), f"--kubeconfig={self.cp.kubeconfig}", f"--config={stages}",
             "--manage-all-nodes=false",
             f"--manage-nodes-with-annotation-selector={ANNOTATION}=fake",
             f"--cidr={POD_CIDR}", "--node-ip=10.252.255.254",
             f"--server-address=127.0.0.1:{free_port()}"],
            stdout=log, stderr=log, start_new_session=True)
        log.close()
        # Ready when it has initialised a node of its own.
        probe = f"kwok-probe-{int(time.time() * 1000)}"
        self.node(probe)
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise _KwokExited(f"kwok exited ({self.proc.returncode}):\n{self.tail()}")
                if node_ready(self.cp, probe):
                    return
                time.sleep(0.2)
            raise EnvtestError(f"kwok did not make node {probe} Ready in 60 s:\n{self.tail()}")
        finally:
            with contextlib.suppress(OSError, urllib.error.URLError):
                self.cp.request("DELETE", f"/api/v1/nodes/{probe}")

    def stop(self) -> None:
        if self.proc is not None:
            _terminate(self.proc, grace=5)
            self.proc = None

    def tail(self, n: int = 3000) -> str:
        try:
            return Path(self.log).read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def node(self, name: str, *, labels: dict[str, str] | None = None, cpu: str = "4",
             memory: str = "8Gi", taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
        """Create a kwok-managed Node (kwok fills in its status and heartbeats)."""
        obj: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                    **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
        }
        return dict(self.cp.request("POST", "/api/v1/nodes", obj))


class _KwokExited(EnvtestError):
    """kwok exited before it was ready (``Kwok.start`` tries again)."""


def node_ready(cp: ControlPlane, name: str) -> bool:
    try:
        node = cp.request("GET", f"/api/v1/nodes/{name}")
    except (OSError, urllib.error.URLError):
        return False
    conds = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
