"""Unit: no import cycle in the package (the measuring script of ../shared/reviews/structure-4.md,
kept as a check).

The graph is every import of the package's own modules, module level or inside a function
(``TYPE_CHECKING`` blocks included: a type-level cycle is a cycle of ideas too). A cycle is a
strongly connected component of more than one module (Tarjan's algorithm).
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_distrank"


def dotted(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (relative imports, as the package writes)."""
    files = {p: ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}
    mods = {dotted(p) for p in files}
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for path, tree in files.items():
        name = dotted(path)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join(
                    package[: len(package) - node.level + 1]
                    + ([node.module] if node.module else [])
                )
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                    if target in mods and target != name:
                        edges[name].add(target)
        edges.setdefault(name, set())
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                out.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles (break each with a protocol, a callable or a value):\n" + (
        "\n".join(" <-> ".join(c) for c in found)
    )


def test_the_graph_reader_sees_relative_imports() -> None:
    edges = import_graph()
    assert "pytest_distrank.pool.onetest.ranks" in edges["pytest_distrank.pool.onetest.attempt"]
    assert "pytest_distrank.outcome.merge" in edges["pytest_distrank.outcome.finish"]


@given(
    st.dictionaries(
        st.sampled_from("abcdefg"), st.sets(st.sampled_from("abcdefg"), max_size=3), max_size=7
    )
)
def test_a_cycle_is_found_exactly_when_a_node_reaches_itself(edges: dict[str, set[str]]) -> None:
    """Property: a node lies in a reported component iff it reaches itself through another node;
    two nodes share a component iff each reaches the other."""
    graph = {v: {w for w in ws if w != v} for v, ws in edges.items()}

    def reach(v: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph.get(v, ()))
        while todo:
            w = todo.pop()
            if w not in seen:
                seen.add(w)
                todo.extend(graph.get(w, ()))
        return seen

    reached = {v: reach(v) for v in {*graph, *(w for ws in graph.values() for w in ws)}}
    found = cycles(graph)
    in_cycle = {v for c in found for v in c}
    assert in_cycle == {v for v, r in reached.items() if v in r}
    for component in found:
        for v in component:
            for w in component:
                assert v == w or (w in reached[v] and v in reached[w])


@pytest.mark.parametrize(
    ("edges", "expected"),
    [({"a": {"b"}, "b": {"a"}}, [["a", "b"]]), ({"a": {"b"}, "b": set()}, [])],
)
def test_two_modules_importing_each_other_are_a_cycle(
    edges: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert cycles(edges) == expected
