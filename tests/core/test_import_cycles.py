"""No import circles inside the library (issue 36, item 4).

`lint-imports` checks the layers between folders; inside one folder nothing
stopped two modules from importing each other (the runners and their
implementations, `data/storage.py` and `data/remote.py`, the 14 command modules
and `cli/main.py`, the six families). This test builds the import graph of
`zephon_core` and `zephon_vl` from the source with `ast` and refuses any circle.

An import inside a function counts, as it does for `lint-imports`: a lazy import
only postpones the circle (it is how every circle above was built). Imports under
``if TYPE_CHECKING:`` do not count: they are annotations, never executed.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("zephon_core", "zephon_vl")

#: Circles allowed to remain, each a sorted tuple of module names with the reason it
#: stays. Empty: the list may only shrink, never grow.
ALLOWED: dict[tuple[str, ...], str] = {}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the packages: dotted name -> (file, is a package's __init__)."""
    out = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, at any depth, except those that only run
    under ``if TYPE_CHECKING:``."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skipped |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skipped]


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import may load: the module, and for ``from m import x``
    also ``m.x`` (a submodule, when it is one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        parts = package.split(".")
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """module -> the library modules it imports (itself excluded)."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, (path, is_package) in modules.items():
        graph[name]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            graph[name] |= {t for t in _targets(node, name, is_package)
                            if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(tuple(sorted(component)))
    return sorted(found)


def test_the_cycle_finder_finds_a_circle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [("a", "b", "c")]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_count_and_type_checking_ones_do_not() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from pkg.a import A\n"
                     "def f():\n    from . import b\n    import pkg.c\n")
    loaded = {t for node in _imports(tree) for t in _targets(node, "pkg.m", False)}
    assert {"pkg.b", "pkg.c"} <= loaded and "pkg.a" not in loaded
    # and in the library: `make_runner` imports the process runner inside the function
    assert "zephon_core.engine.processes" in import_graph()["zephon_core.engine.runners"]


def test_no_import_circles_in_the_library() -> None:
    found = circles(import_graph())
    new = [c for c in found if c not in ALLOWED]
    assert not new, "import circles (move what both sides need into a module below " \
                    "them):\n" + "\n".join(" <-> ".join(c) for c in new)
    gone = [c for c in ALLOWED if c not in found]
    assert not gone, f"these circles are gone; remove them from ALLOWED: {gone}"
