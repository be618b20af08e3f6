"""The structure checks (docs/design.md, "Code structure"), read from the source with ``ast``:

* no import cycle among the modules of ``cloud_core/``, ``edge_agent/`` and ``tools/``,
  imports inside functions counted too (those under ``if TYPE_CHECKING:`` never run and
  are left out);
* no upward import: ``edge_agent`` never imports ``cloud_core`` or ``tools``; ``cloud_core``
  never imports ``tools``; ``cloud_core/placement`` imports nothing from ``edge_agent``;
* no file in ``cloud_core/`` or ``edge_agent/`` over 600 lines and no function over 100
  lines, but those listed with a reason in docs/design.md's "Size exceptions" table: no
  longer than the lines recorded there, or any length while the reason says "pending"
  (being split as the table is written).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cloud_core", "edge_agent", "tools")
MAX_FILE = 600
MAX_FUNCTION = 100


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out[_module_name(path)] = path
    return out


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative ones resolved from ``path``)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(module: str) -> set[str]:
    """The project modules ``module`` imports anywhere in its file: ``from p import x``
    counts as importing ``p.x`` when that is a module, else ``p``."""
    mods = _modules()
    path = mods[module]
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and _type_checking(node)
                   for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target
                     for a in node.names]
        for name in names:
            # the longest prefix that is one of ours (``import a.b.c`` imports ``a.b.c``)
            parts = name.split(".")
            while parts and ".".join(parts) not in mods:
                parts.pop()
            if parts and ".".join(parts) != module:
                out.add(".".join(parts))
    return out


def _type_checking(node: ast.If) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): imports for the type checker."""
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


@cache
def _graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(_imports(m)) for m in _modules()}


def _cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, todo = work[-1]
            if todo:
                w = todo.pop()
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, sorted(graph.get(w, ()))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp: list[str] = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _a_cycle(comp: list[str], graph: dict[str, frozenset[str]]) -> list[str]:
    """One concrete cycle through a component's first module, for the message."""
    start = comp[0]
    members = set(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def test_the_cycle_finder_finds_a_cycle() -> None:
    g = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}),
         "d": frozenset({"a"})}
    comps = _cycles(g)
    assert comps == [["a", "b", "c"]]
    assert _a_cycle(comps[0], g) == ["a", "b", "c", "a"]
    assert _cycles({"a": frozenset({"b"}), "b": frozenset()}) == []


def test_imports_read_relative_and_function_level_imports() -> None:
    deps = _graph()["cloud_core.placement.engine"]
    assert "cloud_core.placement.prepared" in deps
    assert "cloud_core.placement.solver" in deps


def test_no_import_cycle() -> None:
    graph = _graph()
    found = [" -> ".join(_a_cycle(c, graph)) + f"  (component: {', '.join(c)})"
             for c in _cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def _upward(prefix: str, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{m} imports {d}" for m, deps in sorted(_graph().items())
            if m == prefix or m.startswith(prefix + ".")
            for d in sorted(deps) if d.split(".")[0] in forbidden
            or any(d == f or d.startswith(f + ".") for f in forbidden)]


def test_edge_agent_imports_neither_the_core_nor_tools() -> None:
    assert not _upward("edge_agent", ("cloud_core", "tools"))


def test_the_core_does_not_import_tools() -> None:
    assert not _upward("cloud_core", ("tools",))


def test_placement_imports_nothing_from_the_agent() -> None:
    assert not _upward("cloud_core.placement", ("edge_agent",))


# -- sizes -------------------------------------------------------------------------------
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*`?([^|`]+?)`?\s*\|\s*(\d+)\s*\|\s*(.+?)\s*\|\s*$")


def _exceptions() -> dict[tuple[str, str], int]:
    """docs/design.md's "Size exceptions" rows: (path, function or "(file)") -> the lines
    recorded there, which the item may not exceed (no bound while it is "pending")."""
    text = (ROOT / "docs" / "design.md").read_text()
    at = text.index("### Size exceptions")
    out: dict[tuple[str, str], int] = {}
    for line in text[at:].splitlines()[1:]:
        if line.startswith("#"):
            break
        m = _ROW.match(line)
        if m:
            path, name, lines, reason = m.groups()
            assert reason.strip(), f"size exception without a reason: {line}"
            pending = reason.strip().lower().startswith("pending")
            out[path, name.strip()] = 1 << 30 if pending else int(lines)
    return out


def _sizes() -> dict[tuple[str, str], int]:
    """Every file of cloud_core/ and edge_agent/ and every function there (qualified by
    its classes and enclosing functions): its length in lines."""
    out: dict[tuple[str, str], int] = {}
    for pkg in ("cloud_core", "edge_agent"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text()
            out[rel, "(file)"] = len(text.splitlines())

            def visit(node: ast.AST, prefix: str, rel: str = rel) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                          ast.ClassDef)):
                        name = f"{prefix}{child.name}"
                        if not isinstance(child, ast.ClassDef):
                            first = min([child.lineno,
                                         *(d.lineno for d in child.decorator_list)])
                            out[rel, name] = (child.end_lineno or child.lineno) - first + 1
                        visit(child, name + ".")
                    else:
                        visit(child, prefix)

            visit(ast.parse(text, rel), "")
    return out


def test_the_exceptions_table_parses() -> None:
    # every row of the table is read (the table may be empty: no exception at all)
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("### Size exceptions"):].splitlines()[1:]
    table = [ln for ln in section[:next((i for i, ln in enumerate(section)
                                         if ln.startswith("#")), len(section))]
             if ln.startswith("| `")]
    rows = _exceptions()
    assert len(rows) == len(table), f"docs/design.md: Size exceptions rows not read: {table}"
    assert all(n > 0 for n in rows.values())
    assert _ROW.match("| `a.py` | `(file)` | 700 | why |")


def test_no_file_or_function_over_its_size() -> None:
    allowed = _exceptions()
    over = []
    for (path, name), lines in sorted(_sizes().items()):
        limit = MAX_FILE if name == "(file)" else MAX_FUNCTION
        if lines <= limit:
            continue
        if lines <= allowed.get((path, name), 0):
            continue
        what = "file" if name == "(file)" else f"function {name}"
        recorded = allowed.get((path, name))
        over.append(f"{path}: {what} has {lines} lines (limit {limit}"
                    + (f", recorded {recorded})" if recorded else ")"))
    assert not over, ("over size (split it, or list it with a reason in docs/design.md, "
                      "Size exceptions):\n" + "\n".join(over))
