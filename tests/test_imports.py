"""No import circles inside a package of fljax.

Every module of every fljax package is parsed with ``ast`` (nothing is imported), and each of
its imports, at module level or inside a function, becomes an edge to the fljax module it names:
``import fljax.x.y``, ``from fljax.x import y`` (module y, or package x's ``__init__`` when y is
a name in it), ``from fljax.x.y import z`` and relative imports alike. A package's graph holds its
own modules, its ``__init__`` included; an edge to a module of a subpackage counts as an edge to
that subpackage's ``__init__`` (which imports the subpackage's modules), so a package's modules
and subpackages must import one another one way only. A circle found is printed, module by module.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import fljax

ROOT = pathlib.Path(fljax.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    """Every fljax module and package (its ``__init__``) by dotted name."""
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))
            if "__pycache__" not in path.parts}


MODULES = _modules()
PACKAGES = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")


def imports_of(source: str, name: str, is_package: bool, modules) -> set[str]:
    """The modules among ``modules`` that module ``name`` (whose text is ``source``; a package's
    ``__init__`` when ``is_package``) imports anywhere, at module level or in a function."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:             # relative: from . import x, from ..y import z
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module
            for alias in node.names:   # a submodule by its name, else a name in the module
                submodule = f"{origin}.{alias.name}"
                found.add(submodule if submodule in modules else origin)
    return {module for module in found if module in modules and module != name}


def imported_modules(name: str) -> set[str]:
    """The fljax modules that fljax module ``name`` imports."""
    path = MODULES[name]
    return imports_of(path.read_text(), name, path.name == "__init__.py", MODULES)


def package_graph(package: str) -> dict[str, set[str]]:
    """The import graph of ``package``: its modules, itself (its ``__init__``) and its
    subpackages, each subpackage one node that imports what any module inside it imports."""
    depth = package.count(".") + 1

    def member(module: str) -> str | None:
        if module == package:
            return package
        if not module.startswith(package + "."):
            return None
        return ".".join(module.split(".")[:depth + 1])

    graph: dict[str, set[str]] = {}
    for name in MODULES:
        node = member(name)
        if node is not None:
            graph.setdefault(node, set()).update(
                {member(target) for target in imported_modules(name)} - {None, node})
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of ``graph`` as [a, b, ..., a], or None: depth-first search, by name order."""
    state: dict[str, int] = {}          # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_every_package_is_found():
    assert {"fljax", "fljax.algorithms", "fljax.data", "fljax.models",
            "fljax.probes"} <= set(PACKAGES)
    assert "fljax.data.loaders" in package_graph("fljax.data")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_in_package(package):
    cycle = find_cycle(package_graph(package))
    if cycle:
        print(f"import circle in {package}: " + " -> ".join(cycle))
    assert cycle is None, f"import circle in {package}: " + " -> ".join(cycle)


def test_finds_imports_of_every_kind():
    """Module-level, function-level, relative and ``from package import module`` imports are all
    edges; a name imported from a package is an edge to its ``__init__``."""
    modules = {"p", "p.a", "p.b", "p.c", "p.d", "p.sub", "p.sub.e", "q"}
    source = """
import q
from p import a
from p.b import thing
from . import c, not_a_module
def f():
    from .sub.e import g
    import p.d as d
"""
    assert imports_of(source, "p.x", False, modules) == {"q", "p.a", "p.b", "p.c", "p", "p.sub.e",
                                                         "p.d"}
    assert imports_of("from .. import a\nfrom . import e", "p.sub", True, modules) == {"p.a",
                                                                                    "p.sub.e"}
    assert {"fljax.data.dataset", "fljax.data.tfds_files"} <= imported_modules("fljax.data.text")
    assert "fljax.data.leaf" in imported_modules("fljax.data.loaders")
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
