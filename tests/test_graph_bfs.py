"""BFS depths and parents against scipy.sparse.csgraph.breadth_first_order and networkx."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order

from terrain_io.backend import to_device, to_host
from terrain_io.errors import InputError
from terrain_io.graph import _csr, generate
from terrain_io.graph.bfs import bfs
from terrain_io.graph.io import EdgeList

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
METHODS = ["auto", "frontier", "naive"]


def scipy_depths(mat, source, directed):
    order, pred = breadth_first_order(mat, source, directed=directed, return_predecessors=True)
    depth = np.full(mat.shape[0], -1, np.int64)
    depth[source] = 0
    for x in order[1:]:
        depth[x] = depth[pred[x]] + 1
    return depth


def check_parents(mat, depth, parent, source):
    depth, parent = to_host(depth), to_host(parent)
    reached = np.flatnonzero((depth > 0))
    assert parent[source] == -1
    assert np.all(parent[depth == -1] == -1)
    p = parent[reached]
    assert np.all(depth[p] == depth[reached] - 1)
    assert np.all(np.asarray(mat[p, reached]).ravel() != 0)      # the tree edge exists


def on(g: EdgeList, device):
    return EdgeList(to_device(g.u, device), to_device(g.v, device), None, g.n)


GRAPHS = {
    "rmat": lambda: generate.rmat(11, edge_factor=8, seed=1),
    "grid": lambda: generate.grid_2d(40, 55),
    "tree": lambda: generate.kary_tree(5_000, k=4, n_trees=3, seed=2),
    "random_sparse": lambda: generate.random_graph(4_000, m=3_000, seed=3),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("directed", [False, True])
def test_matches_scipy(device, method, name, directed):
    g = GRAPHS[name]()
    mat = sp.csr_matrix((np.ones(g.m), (g.u, g.v)), shape=(g.n, g.n))
    if not directed:
        mat = mat + mat.T
    source = int(g.u[0])
    depth, parent, info = bfs(on(g, device), source, method=method, directed=directed, return_info=True)
    assert depth.dtype == np.int32
    np.testing.assert_array_equal(to_host(depth), scipy_depths(mat, source, True))
    check_parents(mat, depth, parent, source)
    if method == "auto" and not directed and name == "rmat":
        assert info["bottom_up_levels"] > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("density,cap", [(0.05, 0.1), (0.25, 1.0)])   # low and high mean degree
def test_bfs_project_graph_matches_networkx(device, method, density, cap):
    nx = pytest.importorskip("networkx")  # the reference
    g = generate.bfs_project_graph(300, density=density, max_degree=cap, seed=4)
    G = nx.DiGraph()
    G.add_nodes_from(range(g.n))
    G.add_edges_from(zip(g.u.tolist(), g.v.tolist()))
    expected = np.full(g.n, -1)
    for v, d in nx.single_source_shortest_path_length(G, 0).items():
        expected[v] = d
    csr = _csr.to_csr(on(g, device))
    depth, parent = bfs(csr, 0, method=method)
    np.testing.assert_array_equal(to_host(depth), expected)
    mat = sp.csr_matrix((np.ones(g.m), (g.u, g.v)), shape=(g.n, g.n))
    check_parents(mat, depth, parent, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_loops_duplicates_isolated_and_matrix_input(device):
    u = np.array([0, 0, 1, 1, 2, 2, 7, 7])
    v = np.array([1, 1, 1, 2, 3, 3, 8, 7])        # duplicates, self-loops, 4..6 isolated, 7-8 apart
    mat = sp.csr_matrix((np.ones(len(u)), (u, v)), shape=(10, 10))
    if device == "gpu":
        import cupyx.scipy.sparse as csp
        mat_in = csp.csr_matrix(mat)
    else:
        mat_in = mat
    for method in METHODS:
        depth, parent = bfs(mat_in, 0, method=method)
        assert to_host(depth).tolist() == [0, 1, 2, 3, -1, -1, -1, -1, -1, -1]
        assert to_host(parent).tolist() == [-1, 0, 1, 2, -1, -1, -1, -1, -1, -1]
        depth, _ = bfs(mat_in, 3, method=method, directed=False)
        assert to_host(depth).tolist() == [3, 2, 1, 0, -1, -1, -1, -1, -1, -1]


def test_int64_path(monkeypatch):
    monkeypatch.setattr(_csr, "INT32_LIMIT", 100)
    g = generate.grid_2d(30, 30)
    mat = sp.csr_matrix((np.ones(g.m), (g.u, g.v)), shape=(g.n, g.n))
    mat = mat + mat.T
    for method in METHODS:
        depth, parent = bfs(g, 17, method=method, directed=False)
        assert parent.dtype == np.int64
        np.testing.assert_array_equal(depth, scipy_depths(mat, 17, True))


def test_errors():
    g = EdgeList(np.array([0, 1]), np.array([1, 2]), None, 3)
    with pytest.raises(InputError, match="out of range"):
        bfs(g, 3)
    with pytest.raises(InputError, match="out of range"):
        bfs(g, -1)
    with pytest.raises(InputError, match="method"):
        bfs(g, 0, method="dfs")
