"""The Kubernetes core's shape, checked on its source (ast): the scheduler cache alone
writes the assumed pods, no class mixes in more than one base, no module imports another's
private names, and the modules import each other without a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "cloud_core" / "k8s"
CACHE = K8S / "cache.py"
TYPING_BASES = {"Protocol", "Generic", "NamedTuple", "TypedDict"}


def parsed(root: Path) -> dict[Path, ast.Module]:
    return {f: ast.parse(f.read_text(), str(f)) for f in sorted(root.rglob("*.py"))}


def cache_private_attributes() -> set[str]:
    """The attributes ``SchedulerCache`` keeps to itself (``self._x = ...`` in its class)."""
    tree = ast.parse(CACHE.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SchedulerCache"]
    return {t.attr for n in ast.walk(cls) if isinstance(n, ast.Assign | ast.AnnAssign)
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self" and t.attr.startswith("_")}


def bypasses_of_the_cache(files: dict[Path, ast.Module]) -> list[str]:
    """Every place outside cache.py that names the assumed pods' store (on any object), or
    reaches into a cache's private attributes (on anything but ``self``)."""
    private = cache_private_attributes()
    found = []
    for f, tree in files.items():
        if f == CACHE:
            continue
        for n in ast.walk(tree):
            if not isinstance(n, ast.Attribute) or n.attr not in private:
                continue
            on_self = isinstance(n.value, ast.Name) and n.value.id == "self"
            if n.attr == "_assumed" or not on_self:
                found.append(f"{f.relative_to(REPO)}:{n.lineno} .{n.attr}")
    return found


def test_only_the_scheduler_cache_writes_assumed_pods() -> None:
    private = cache_private_attributes()
    assert {"_assumed", "_entries", "_usage"} <= private
    assert bypasses_of_the_cache(parsed(REPO / "cloud_core")) == []


def test_the_cache_check_finds_a_bypass() -> None:
    """The check above fails on code that writes the assumed pods itself."""
    bad = {K8S / "binder.py": ast.parse("self._assumed[key] = (node, 0.0, None)\n"),
           K8S / "source.py": ast.parse("n = len(self._cache._usage)\n")}
    assert len(bypasses_of_the_cache(bad)) == 2


def bases(node: ast.ClassDef) -> list[str]:
    out = []
    for b in node.bases:
        b = b.value if isinstance(b, ast.Subscript) else b
        out.append(b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", ast.dump(b)))
    return out


def test_no_class_in_the_kubernetes_core_mixes_in_more_than_one_base() -> None:
    many = [f"{f.name}:{n.name}({', '.join(bases(n))})" for f, tree in parsed(K8S).items()
            for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
            and len([b for b in bases(n) if b not in TYPING_BASES]) > 1]
    assert many == []


def test_no_private_name_is_imported_across_modules() -> None:
    found = [f"{f.relative_to(REPO)}: {a.name}" for f, tree in parsed(K8S).items()
             for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             for a in n.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []


def module_imports(f: Path, tree: ast.Module) -> set[str]:
    """The cloud_core.k8s modules ``f`` imports at module level (TYPE_CHECKING included)."""
    out: set[str] = set()
    stmts: list[ast.stmt] = list(tree.body)
    while stmts:
        s = stmts.pop()
        if isinstance(s, ast.If | ast.Try):
            stmts.extend(s.body)
            stmts.extend(getattr(s, "orelse", []))
            continue
        if isinstance(s, ast.ImportFrom):
            mod = s.module or ""
            if s.level:  # relative: from .x import y
                mod = "cloud_core.k8s" + (f".{mod}" if mod else "")
            if mod == "cloud_core.k8s":
                out.update(f"cloud_core.k8s.{a.name}" for a in s.names)
            elif mod.startswith("cloud_core.k8s."):
                out.add(mod)
        elif isinstance(s, ast.Import):
            out.update(a.name for a in s.names if a.name.startswith("cloud_core.k8s."))
    return {m for m in out if (K8S / f"{m.rsplit('.', 1)[1]}.py").exists()} - {
        f"cloud_core.k8s.{f.stem}"}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in ``graph`` (as the modules on it), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return [*path[path.index(d):], d]
            if d not in state and (c := visit(d)) is not None:
                return c
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)) is not None:
            return c
    return None


def test_the_kubernetes_modules_import_each_other_without_a_cycle() -> None:
    graph = {f"cloud_core.k8s.{f.stem}": module_imports(f, t) for f, t in parsed(K8S).items()}
    assert cycle(graph) is None
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert not (K8S / "actuator_state.py").exists()
