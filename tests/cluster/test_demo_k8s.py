"""`make demo`'s Kubernetes part, run as a user runs it (``python -m tools.demo --mode
kubernetes``, its own process): on the test cluster with a real node and kwok, the SLA
Deployment's pod starts on a kwok node, its link degrades, cfnet moves it, and the replacement
is started by the real kubelet and answers. The demo exits 0 only then (it prints what was
missing otherwise); the test also reads its summary.

A process of its own, as ``make demo``: the real node's network namespace and cgroups are
named by the pid (``cfk-<pid>``), so it cannot share this session's ``real_cluster``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.timeout(600)]


def test_demo_moves_the_pod_onto_the_real_node(cluster_binaries: None, tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        # Bounded twice: the demo's own budget for its story (--k8s-duration, after the
        # cluster is up) and this wait for the whole process (cluster start and teardown).
        proc = subprocess.Popen([sys.executable, "-m", "tools.demo", "--mode", "kubernetes",
                                 "--k8s-duration", "150"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=540)
        except subprocess.TimeoutExpired:
            proc.terminate()  # SIGTERM: the demo tears the cluster and the lab down
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = None
    text = log.read_text(errors="replace")
    tail = text[-6000:]
    assert rc == 0, f"demo exit status {rc}:\n{tail}"
    assert "real node edge-zurich Ready" in text, tail
    assert "first pod bound to edge-milan (kwok)" in text, tail
    assert "moved edge-milan -> edge-zurich (real kubelet)" in text, tail
    assert "Running and Ready on edge-zurich (real kubelet)" in text, tail
    summary = text[text.rindex("SUMMARY"):]
    assert "podbin" in summary and "SLA" in summary, summary
    print("\n" + text[text.rindex("STEP (Kubernetes part)"):])
