"""Every decision of the core goes through ``DecisionLoop`` (grep-able): no module of
``cloud_core`` calls the engine's ``place`` or ``plan_moves`` (or places on a
``PreparedCluster`` of its own) except inside ``class DecisionLoop`` in ``cloud_core/loop.py``.

Read from the syntax tree, not by regex, so a call split over lines, an aliased import
(``from cloud_core.placement import place as p``) or a module attribute
(``placement.plan_moves(...)``) is found too.

The engine's own package, ``cloud_core/placement/``, is left out on purpose: it *is* the
engine. ``place`` is ``PreparedCluster(...).place`` (``placement/__init__.py``),
``plan_moves`` probes destinations with ``PreparedCluster(...).place`` and the engine's
sequential path is built on it (``replan.py``, ``sequential.py``); those are the engine's
internals that the loop calls, not decisions taken beside the loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "cloud_core"
ENGINE = {"place", "plan_moves", "PreparedCluster", "prepare"}


def _engine_names(tree: ast.Module) -> set[str]:
    """Local names bound to the engine's entry points or to its package."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                ("cloud_core.placement", "placement")):
            for a in node.names:
                if a.name in ENGINE:
                    names.add(a.asname or a.name)
        if isinstance(node, ast.ImportFrom) and node.module == "cloud_core":
            names |= {a.asname or a.name for a in node.names if a.name == "placement"}
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names
                      if a.name.startswith("cloud_core.placement")}
    return names


def _engine_calls(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, call, enclosing class) of each call to the engine in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    names = _engine_names(tree)
    out: list[tuple[int, str, str | None]] = []

    def visit(node: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.ClassDef) else cls
            if isinstance(child, ast.Call):
                f = child.func
                what = None
                if isinstance(f, ast.Name) and f.id in names:
                    what = f.id
                elif isinstance(f, ast.Attribute) and f.attr in ENGINE and (
                        # placement.place(...), PreparedCluster(...).place(...)
                        (isinstance(f.value, ast.Name) and f.value.id in names)
                        or (isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name)
                        and f.value.func.id in names)):
                    what = ast.unparse(f)
                if what is not None:
                    out.append((child.lineno, what, cls))
            visit(child, inner)

    visit(tree, None)
    return out


def test_the_loop_is_the_only_caller_of_the_engine() -> None:
    found = []
    in_loop = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        if rel.startswith("placement/"):
            continue  # the engine itself (module docstring)
        for line, what, cls in _engine_calls(f):
            if rel == "loop.py" and cls == "DecisionLoop":
                in_loop.append(what)
            else:
                found.append(f"cloud_core/{rel}:{line}: {what} (in {cls or 'module level'})")
    assert not found, "the engine decides outside DecisionLoop:\n" + "\n".join(found)
    # the check sees the loop's own calls (it would pass vacuously if it saw nothing)
    assert {"place", "plan_moves"} <= set(in_loop), in_loop


def test_the_check_finds_a_call_beside_the_loop(tmp_path: Path) -> None:
    """What the check above would flag: the engine called from another module or class."""
    f = tmp_path / "pools.py"
    f.write_text("from cloud_core.placement import place as p, PreparedCluster\n"
                 "import cloud_core.placement as engine\n"
                 "def plan(s, w):\n"
                 "    p(s,\n      w)\n"
                 "    PreparedCluster(s).place(w)\n"
                 "    engine.plan_moves(s, w, None)\n")
    assert sorted((line, what) for line, what, _ in _engine_calls(f)) == [
        (4, "p"), (6, "PreparedCluster"), (6, "PreparedCluster(s).place"),
        (7, "engine.plan_moves")]
