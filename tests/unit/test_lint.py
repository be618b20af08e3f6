"""The code stays ruff- and mypy-clean: the quality bar is checked by the suite, not by hand."""

from __future__ import annotations

import ast
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


def _edge_agent_imports(path: Path) -> set[str]:
    """The ``edge_agent`` modules one file imports (top level or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from edge_agent import wire`` imports edge_agent.wire, not the whole package
            mods = ([f"{node.module}.{a.name}" for a in node.names] if node.module == "edge_agent"
                    else [node.module])
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            continue
        found.update(m for m in mods if m.split(".")[0] == "edge_agent")
    return found


def test_the_core_imports_only_the_wire_package_and_the_engine_nothing() -> None:
    """cloud_core reaches edge_agent only through edge_agent.wire; the pure placement engine
    not at all (docs/design.md, "Layout")."""
    outside: dict[str, set[str]] = {}
    engine: dict[str, set[str]] = {}
    for f in (REPO / "cloud_core").rglob("*.py"):
        mods = _edge_agent_imports(f)
        name = str(f.relative_to(REPO))
        if bad := {m for m in mods if m != "edge_agent.wire"
                   and not m.startswith("edge_agent.wire.")}:
            outside[name] = bad
        if mods and name.startswith("cloud_core/placement/"):
            engine[name] = mods
    assert not outside, f"cloud_core imports edge_agent outside edge_agent.wire: {outside}"
    assert not engine, f"the placement engine imports edge_agent: {engine}"
    # the scan sees imports at all: the core does import the wire package
    assert "edge_agent.wire" in _edge_agent_imports(REPO / "cloud_core" / "ingest.py")


def test_single_importers() -> None:
    """Only one module imports paho, one the kubernetes client; OR-Tools only the solver's
    back-ends (CP-SAT for classes, the whole-batch exact model and its focused rounds, the
    min-cost flow)."""
    owners = {"paho": {"edge_agent/wire/mqtt.py"}, "kubernetes": {"cloud_core/k8s/endpoint.py"},
              "ortools": {"cloud_core/placement/cpsat.py", "cloud_core/placement/exact.py",
                          "cloud_core/placement/focus.py", "cloud_core/placement/flow.py"}}
    for lib, allowed in owners.items():
        found = set()
        for pkg in ("edge_agent", "cloud_core"):
            for f in (REPO / pkg).rglob("*.py"):
                text = f.read_text()
                if f"import {lib}" in text or f"from {lib}" in text:
                    found.add(str(f.relative_to(REPO)))
        assert found <= allowed, f"{lib} imported by {sorted(found - allowed)}"
