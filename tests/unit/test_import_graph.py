"""No import cycles in rackserve/ or services/: read every module's imports with `ast` (nothing is
imported) and look for strongly connected components of the module graph.

`from pkg import name` counts as an import of pkg.name when that is a module, else of pkg. The
implicit import of a parent package when a submodule loads is not an edge (every re-exporting
__init__ would be a cycle). Imports under `if TYPE_CHECKING:` count: a cycle hidden from the
interpreter is still one a reader has to untangle. A second test adds the imports made inside
functions, so a lazy import is not a way to keep a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rackserve", "services")


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Python modules, and the C extensions setup.py builds (rackserve/**/_*.c: leaves that import no
    project module), so importing an extension is not an import of its package."""
    mods = {}
    for pkg in packages:
        for path in (root / pkg).rglob("_*.c"):
            mods[".".join(path.relative_to(root).with_suffix("").parts)] = path
        for path in (root / pkg).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, mods: dict[str, Path], deferred: bool) -> set[str]:
    """Project modules `module` imports: at module level (and in class bodies), plus inside
    functions when `deferred`."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in _walk(ast.parse(path.read_text()).body, deferred):
        if isinstance(node, ast.Import):
            targets = [_known(a.name, mods) for a in node.names]
        else:
            base = _absolute(module, is_package, node)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else _known(base, mods)
                       for a in node.names]
        found.update(t for t in targets if t and t != module)
    return found


def _walk(body: list[ast.stmt], deferred: bool):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if deferred:
                yield from (n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                yield from _walk(getattr(node, field, None) or [], deferred)


def cycles(root: Path, packages: tuple[str, ...], deferred: bool) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), sorted."""
    mods = module_files(root, packages)
    graph = {m: ([] if p.suffix == ".c" else sorted(imports_of(m, p, mods, deferred))) for m, p in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_module_level_import_cycles():
    assert cycles(ROOT, PACKAGES, deferred=False) == []


def test_no_import_cycles_through_imports_inside_functions():
    assert cycles(ROOT, PACKAGES, deferred=True) == []


def test_the_check_finds_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nA = 1\nif TYPE_CHECKING:\n    from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import A\n    return A\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    assert cycles(tmp_path, ("pkg",), deferred=False) == []
    assert cycles(tmp_path, ("pkg",), deferred=True) == [["pkg.a", "pkg.sub.b"]]
