"""The code stays ruff- and mypy-clean: the quality bar is checked by the suite, not by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_ruff_clean() -> None:
    r = subprocess.run([str(BIN / "ruff"), "check", "edge_agent", "cloud_core", "tools", "tests"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_mypy_clean() -> None:
    r = subprocess.run([str(BIN / "mypy"), "edge_agent", "cloud_core", "tools"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_agent_does_not_import_core_or_heavy_deps() -> None:
    # The agent stays light: no cloud_core, no OR-Tools, no kubernetes client.
    code = ("import sys, edge_agent.main, edge_agent.probes, edge_agent.active; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('cloud_core', 'ortools', 'kubernetes')]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_single_importers() -> None:
    """Only one module imports paho, one the kubernetes client, one OR-Tools."""
    owners = {"paho": {"edge_agent/mqtt.py"}, "kubernetes": {"cloud_core/k8s/client.py"},
              "ortools": {"cloud_core/placement/solver.py"}}
    for lib, allowed in owners.items():
        found = set()
        for pkg in ("edge_agent", "cloud_core"):
            for f in (REPO / pkg).rglob("*.py"):
                text = f.read_text()
                if f"import {lib}" in text or f"from {lib}" in text:
                    found.add(str(f.relative_to(REPO)))
        assert found <= allowed, f"{lib} imported by {sorted(found - allowed)}"
