"""The import structure of ``terrain_io``, read from the source (ast): no import cycles and no
private name taken from another module.

Every ``import`` and ``from ... import`` of a module counts, at module level and inside functions
alike (a deferred import is still a dependency, it only hides the cycle until a function runs),
and so does every ``"package.module:name"`` entry of a :class:`terrain_io.backend.Dispatch` table
(imported on first use: a deferred import).
Not counted: imports under ``if TYPE_CHECKING:`` (never executed), and a *deferred* import of one
of the module's own parent packages (Python has run the parent's ``__init__`` before any of its
submodules, so by the time a function runs the parent is complete: ``jit`` asks ``terrain_io`` for
``__version__`` this way). A module-level import of a parent package does count.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "terrain_io"

def _modules(package: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package below ``package``."""
    root = package.parent
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """(import node, at module level) for every import the module may execute, in any function."""
    def walk(node, top):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, top
            elif isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    yield from walk(ast.Module([other], []), top)
            else:
                yield from walk(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                      ast.Lambda)))

    yield from walk(tree, True)


def _dispatch_entries(tree: ast.Module):
    """The modules named by ``Dispatch(..., gpu="package.module:name")`` entries (imported on first use)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Dispatch":
            for kw in node.keywords:
                if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    yield kw.value.value.partition(":")[0]


def import_graph(package: Path = PACKAGE):
    """({module: {(imported module, at module level)}}, [(module, from module, private name)])."""
    modules = _modules(package)
    edges, private = {}, []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets = edges.setdefault(name, set())
        tree = ast.parse(path.read_text(), str(path))
        targets |= {(module, False) for module in _dispatch_entries(tree)}
        for node, top in _imports(tree):
            if isinstance(node, ast.Import):
                targets |= {(a.name, top) for a in node.names if a.name in modules}
                continue
            if node.level:
                base = name.split(".")[: len(name.split(".")) - (node.level - 1) - (0 if is_package else 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source not in modules:
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in modules:  # ``from pkg import submodule``
                    targets.add((full, top))
                    continue
                targets.add((source, top))
                if alias.name.startswith("_") and not alias.name.startswith("__") and source != name:
                    private.append((name, source, alias.name))
    return edges, private


def find_cycles(edges: dict, module_level_only: bool) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module, or a module that
    imports itself) of ``edges``."""
    graph = {}
    for m, targets in edges.items():
        graph[m] = set()
        for t, top in targets:
            if t == m or (module_level_only and not top):
                continue
            if not top and m.startswith(t + "."):
                continue  # a deferred import of a parent package (module docstring)
            graph[m].add(t)
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components, iteratively
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            u, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[u] = min(low[u], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[u])
                if low[u] == index[u]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == u:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_no_cycle_of_module_level_imports(graph):
    edges, _ = graph
    assert find_cycles(edges, module_level_only=True) == []


def test_no_cycle_through_deferred_imports(graph):
    edges, _ = graph
    assert find_cycles(edges, module_level_only=False) == []


def test_no_private_name_across_modules(graph):
    _, private = graph
    assert sorted(set(private)) == []


def test_walk_sees_what_it_checks(tmp_path):
    """The walk itself, on a made-up package: a deferred cycle, a module-level one, a private name."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from .b import g\n\ndef f():\n    from .c import h\n")
    (pkg / "b.py").write_text("from . import a\n")  # module level: a <-> b
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import x\n"
                              "def h():\n    from .a import _private\n    from . import f\n")
    (pkg / "d.py").write_text("from .c import h\nT = Dispatch('table', gpu='pkg.sub.e:f')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "e.py").write_text("from ..c import h\n")
    edges, private = import_graph(pkg)
    assert find_cycles(edges, module_level_only=True) == [["pkg.a", "pkg.b"]]
    assert find_cycles(edges, module_level_only=False) == [["pkg.a", "pkg.b", "pkg.c"]]  # c -> pkg: parent
    assert private == [("pkg.c", "pkg.a", "_private")]
    assert ("pkg.c", True) in edges["pkg.sub.e"]
    assert ("pkg.d", True) not in edges["pkg.c"]  # under TYPE_CHECKING
    assert ("pkg.sub.e", False) in edges["pkg.d"]  # a Dispatch entry


def test_dispatch_entries_name_what_exists():
    """Every ``"module:name"`` entry of a Dispatch table names a function its module defines (the GPU
    entries are imported only on a GPU run, so a typo would otherwise pass every CPU test)."""
    modules = _modules(PACKAGE)
    entries = []
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Dispatch":
                entries += [kw.value.value for kw in node.keywords
                            if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)]
    assert entries  # the walk finds the tables
    for entry in entries:
        module, _, name = entry.partition(":")
        assert module in modules, entry
        defined = {n.name for n in ast.parse(modules[module].read_text()).body
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert name in defined, entry


def test_no_undefined_name_in_the_package():
    """pyflakes finds no name used but never defined or imported in terrain_io or cli: a code path
    that runs only on a GPU (a fallback, an error branch) is otherwise never executed by the default
    run, and a class deleted under it went unnoticed until a GPU failed."""
    from pyflakes import api, reporter

    found = []

    class Undefined(reporter.Reporter):
        def __init__(self):
            pass

        def flake(self, message):
            if "undefined name" in str(message):
                found.append(str(message))

        def syntaxError(self, *args):
            found.append(f"syntax error: {args}")

        def unexpectedError(self, filename, msg):
            found.append(f"{filename}: {msg}")

    api.checkRecursive([str(PACKAGE), str(PACKAGE.parent / "cli")], Undefined())
    assert found == []
