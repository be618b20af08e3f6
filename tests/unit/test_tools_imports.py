"""No import cycles among the tools' modules, lazy imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _graph() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in TOOLS.rglob("*.py"):
        rel = path.relative_to(TOOLS.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps |= {f"{node.module}.{a.name}" for a in node.names}
        out[name] = {d for d in deps if d.startswith("tools.") and d != name}
    return {k: {d for d in v if d in out} for k, v in out.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        path.append(n)
        for d in sorted(graph[n]):
            if state.get(d) == 1:
                return [*path[path.index(d):], d]
            if d not in state and (found := visit(d)):
                return found
        path.pop()
        state[n] = 2
        return []

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return []


def test_no_import_cycle_among_tools() -> None:
    graph = _graph()
    assert "tools.bench_reaction" in graph and "tools.outage_rig" in graph
    assert _cycle(graph) == []


def test_the_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
