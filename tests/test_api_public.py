"""The public API (README "API"): entry points exported by ``terrain_io``, options keyword-only after
the data arguments, numpydoc sections, and Examples that run as written (doctest)."""
from __future__ import annotations

import doctest
import importlib
import inspect
import subprocess
import sys

import numpy as np
import pytest

from references import ROOT

# name -> (module, the data arguments that stay positional)
ENTRY_POINTS = {
    "sssp": ("terrain_io.grid.sssp.engine", ["store", "sources"]),
    "cost_distance": ("terrain_io.grid.sssp.array", ["dem", "sources"]),
    "mst": ("terrain_io.grid.mst", ["store"]),
    "fill": ("terrain_io.grid.fill", ["store"]),
    "depressions": ("terrain_io.grid.depressions", ["store"]),
    "list_rank": ("terrain_io.graph.listrank", ["succ"]),
    "list_scan": ("terrain_io.graph.listrank", ["succ", "values", "op"]),
    "connected_components": ("terrain_io.graph.components", ["graph"]),
    "bfs": ("terrain_io.graph.bfs", ["graph", "source"]),
    "apsp": ("terrain_io.graph.apsp", ["W"]),
    "minplus": ("terrain_io.graph.apsp", ["A", "B"]),
    "minimum_spanning_forest": ("terrain_io.graph.mst", ["edges", "n"]),
    "random_list": ("terrain_io.graph.generate", ["n", "n_lists"]),
    "kary_tree": ("terrain_io.graph.generate", ["n", "k", "n_trees"]),
    "random_graph": ("terrain_io.graph.generate", ["n", "m"]),
    "rmat": ("terrain_io.graph.generate", ["scale", "edge_factor"]),
    "grid_2d": ("terrain_io.graph.generate", ["rows", "cols"]),
    "bfs_project_graph": ("terrain_io.graph.generate", ["n"]),
}
DOCUMENTED = ["sssp", "cost_distance", "mst", "fill", "depressions", "list_rank", "list_scan", "connected_components",
              "bfs", "apsp", "minplus", "minimum_spanning_forest"]


def entry(name):
    module, _ = ENTRY_POINTS[name]
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_options_are_keyword_only(name):
    params = inspect.signature(entry(name)).parameters.values()
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == ENTRY_POINTS[name][1]
    assert all(p.kind is p.KEYWORD_ONLY for p in params if p.name not in positional)


def test_terrain_io_exports_the_grid_entry_points_lazily():
    code = ("import sys, terrain_io; assert 'numba' not in sys.modules and 'zarr' not in sys.modules; "
            "from terrain_io import cost_distance, depressions, fill, mst, sssp, TerrainStore; "
            "import terrain_io.grid.fill as m; assert fill is m.fill and sssp.__name__ == 'sssp'")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    import terrain_io

    with pytest.raises(AttributeError):
        terrain_io.no_such_function  # noqa: B018


@pytest.mark.parametrize("name", DOCUMENTED)
def test_numpydoc_sections(name):
    doc = inspect.getdoc(entry(name))
    for section in ("Parameters", "Returns", "Examples"):
        assert f"\n{section}\n{'-' * len(section)}\n" in doc, section
    documented = {line.split(" : ")[0].strip() for line in doc.split("Parameters\n")[1].split("Returns\n")[0]
                  .splitlines() if line and not line.startswith(" ")}
    names = {n.strip() for d in documented for n in d.split(",")}
    assert set(inspect.signature(entry(name)).parameters) <= names


# The examples that compile kernels no other default test builds (numba specialises on the
# example's dtypes) run with the slow tests; the others keep every docstring honest in CI.
SLOW_EXAMPLES = {"depressions", "apsp"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_EXAMPLES else n
                                  for n in DOCUMENTED])
def test_examples_run(name):
    """Each Examples section gives what its lines say (the values checked by hand: see each docstring's
    small input)."""
    func = entry(name)
    tests = doctest.DocTestFinder(recurse=False).find(func, name, globs={name: func, "np": np})  # numpydoc: np given
    assert tests and tests[0].examples
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0
