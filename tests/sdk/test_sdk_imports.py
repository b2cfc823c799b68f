"""The import graph of ``client/``, ``server/`` and ``kernels/``: no cycles, and each side imports
only what it may.

Every import statement counts, wherever it stands (module level, inside a function, under
``if TYPE_CHECKING``): a lazy import hides a cycle from Python, not from the reader. An import
of a package (``from sparseserve import kernels``) is an edge to its ``__init__``; the
parent packages Python runs before a submodule are not edges of their own.

Layers, from the bottom: ``sparseserve.core`` (with the generated ``sparseserve.v1``) imports
no other part; ``sparseserve.kernels`` imports nothing of ours; the server imports the core,
the kernels and itself; the SDK imports the core and itself. ``sparseserve.cli``, the command
line, starts the server and may import it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# Folders and the import names they install as (pyproject.toml's package-dir).
PACKAGES = {"client": "sparseserve", "server": "sparseserve.server", "kernels": "sparseserve.kernels"}


def module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[0] in PACKAGES:  # a folder mapped on its own (none nest today)
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module of ours, line) for every import statement in ``path``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from P import m``: the module P.m where there is one, else P itself.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        found += [(t, node.lineno) for t in targets if t in modules]
    return found


def graph() -> tuple[dict[str, Path], dict[str, list[tuple[str, int]]]]:
    modules = module_files()
    return modules, {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected groups of more than one module, or of one importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or any(w == v for w, _ in edges[v]):
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return groups


def test_no_import_cycles():
    modules, edges = graph()
    found = cycles(edges)
    described = []
    for group in found:
        inside = [f"  {modules[a].relative_to(ROOT)}:{line} imports {b}"
                  for a in group for b, line in edges[a] if b in group]
        described.append("\n".join([" <-> ".join(group), *inside]))
    assert not found, "import cycles:\n" + "\n".join(described)


def layer(module: str) -> str:
    if module == "sparseserve.cli":
        return "cli"
    for prefix, name in (("sparseserve.core", "core"), ("sparseserve.v1", "core"),
                         ("sparseserve.kernels", "kernels"), ("sparseserve.server", "server")):
        if module == prefix or module.startswith(prefix + "."):
            return name
    return "sdk"


# What each layer may import (besides itself).
ALLOWED = {"core": {"core"}, "kernels": {"kernels"}, "server": {"core", "kernels", "server"},
           "sdk": {"core", "sdk"}, "cli": {"core", "sdk", "server"}}


def test_each_side_imports_only_the_core_of_the_other():
    modules, edges = graph()
    wrong = [f"{modules[a].relative_to(ROOT)}:{line} ({layer(a)}) imports {b} ({layer(b)})"
             for a in sorted(edges) for b, line in edges[a] if layer(b) not in ALLOWED[layer(a)]]
    assert not wrong, "imports across layers:\n" + "\n".join(wrong)


def test_the_walk_sees_the_edges_it_judges():
    """The walk itself: it finds relative, absolute, lazy and package imports."""
    modules, edges = graph()
    targets = {b for b, _ in edges["sparseserve.server.ops.gather"]}
    assert {"sparseserve.kernels.gather", "sparseserve.server.registry", "sparseserve.core.tensor"} <= targets
    assert "sparseserve.kernels" in {b for b, _ in edges["sparseserve.server.service"]}  # lazy, a package
    assert "sparseserve.core.codec" in {b for b, _ in edges["sparseserve.core.frames"]}
    assert cycles({"a": [("b", 1)], "b": [("a", 2)], "c": [("a", 3)]}) == [["a", "b"]]
    assert cycles({"a": [("a", 1)]}) == [["a"]]
