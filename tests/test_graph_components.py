"""Connected components against scipy.sparse.csgraph and networkx (independent references)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components as scipy_cc

from terrain_io.backend import to_device, to_host
from terrain_io.errors import InputError
from terrain_io.graph import _csr, generate
from terrain_io.graph.components import connected_components
from terrain_io.graph.io import EdgeList

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
METHODS = ["auto", "union_find", "sv"]


def min_id_labels(n, u, v):
    """scipy's partition, relabelled to the smallest vertex id of each component."""
    mat = sp.coo_matrix((np.ones(len(u)), (u, v)), shape=(n, n))
    k, lab = scipy_cc(mat, directed=True, connection="weak")
    smallest = np.full(k, n, dtype=np.int64)
    np.minimum.at(smallest, lab, np.arange(n))
    return k, smallest[lab]


def on(edges: EdgeList, device):
    return EdgeList(to_device(edges.u, device), to_device(edges.v, device), None, edges.n)


GRAPHS = {
    "lists": lambda: generate.list_graph(20_000, n_lists=37, seed=1),
    "tree3": lambda: generate.kary_tree(20_000, k=3, n_trees=5, seed=2),
    "random_sparse": lambda: generate.random_graph(30_000, m=16_000, seed=3),
    "random_dense": lambda: generate.random_graph(3_000, density=0.001, seed=4),
    "rmat": lambda: generate.rmat(12, edge_factor=4, seed=5),
    "grid": lambda: generate.grid_2d(60, 70),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(GRAPHS))
def test_matches_scipy(device, method, name):
    g = GRAPHS[name]()
    k_ref, lab_ref = min_id_labels(g.n, g.u, g.v)
    k, labels = connected_components(on(g, device), method=method)
    assert k == k_ref
    assert type(labels) is type(to_device(g.u, device))
    np.testing.assert_array_equal(to_host(labels), lab_ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_matches_networkx_with_loops_duplicates_isolated(device, method):
    nx = pytest.importorskip("networkx")  # the reference
    rng = np.random.default_rng(7)
    n = 400
    u = rng.integers(0, 300, 250)
    v = rng.integers(0, 300, 250)
    u = np.concatenate([u, u[:20], [5, 5, 399]])     # duplicates, self-loops; 300..398 isolated
    v = np.concatenate([v, v[:20], [5, 5, 399]])
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(zip(u.tolist(), v.tolist()))
    expected = np.empty(n, np.int64)
    for comp in nx.connected_components(g):
        expected[list(comp)] = min(comp)
    k, labels = connected_components(on(EdgeList(u, v, None, n), device), method=method)
    assert k == nx.number_connected_components(g)
    np.testing.assert_array_equal(to_host(labels), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_matrix_and_csr_inputs(device):
    g = generate.random_graph(5_000, m=4_000, seed=9)
    mat = sp.csr_matrix((np.ones(g.m), (g.u, g.v)), shape=(g.n, g.n))
    k_ref, lab_ref = min_id_labels(g.n, g.u, g.v)
    if device == "gpu":
        import cupyx.scipy.sparse as csp
        mat = csp.csr_matrix(mat)
    for graph in (mat, (to_device(mat.indptr, device), to_device(mat.indices, device)),
                  _csr.to_csr(on(g, device))):
        k, labels = connected_components(graph)
        assert k == k_ref
        np.testing.assert_array_equal(to_host(labels), lab_ref)


def test_device_override_and_int64(monkeypatch):
    monkeypatch.setattr(_csr, "INT32_LIMIT", 100)
    g = generate.kary_tree(5_000, k=2, n_trees=40, seed=1)
    assert g.u.dtype == np.int64
    k_ref, lab_ref = min_id_labels(g.n, g.u, g.v)
    for method in METHODS:
        k, labels = connected_components(g, method=method, device="cpu")
        assert labels.dtype == np.int64 and k == k_ref == 40
        np.testing.assert_array_equal(labels, lab_ref)


def test_empty_and_errors():
    k, labels = connected_components(EdgeList(np.empty(0, np.int64), np.empty(0, np.int64), None, 0))
    assert k == 0 and len(labels) == 0
    k, labels = connected_components(EdgeList(np.empty(0, np.int64), np.empty(0, np.int64), None, 5))
    assert k == 5 and labels.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(InputError, match="out of range"):
        connected_components(EdgeList(np.array([0, 9]), np.array([1, 2]), None, 5))
    with pytest.raises(InputError, match="negative"):
        connected_components(EdgeList(np.array([0, -1]), np.array([1, 2]), None, 5))
    with pytest.raises(InputError, match="method"):
        connected_components(EdgeList(np.array([0]), np.array([1]), None, 2), method="bogus")
