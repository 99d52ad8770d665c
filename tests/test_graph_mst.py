"""Minimum spanning forests (Kruskal, Filter-Kruskal, Borůvka) against scipy and networkx."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components, minimum_spanning_tree

from terrain_io.errors import InputError
from terrain_io.graph import minimum_spanning_forest
from terrain_io.graph.io import EdgeList, check_forest, read_edge_list, write_edge_list
from terrain_io.graph.mst import forest_edges

METHODS = ["kruskal", "filter_kruskal", "boruvka"]


def simple_graph(rng, n, m, integer=False):
    """Random simple graph (no loops, no parallel edges) so that scipy's matrix form sees the same graph."""
    u, v = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = u != v
    lo, hi = np.minimum(u, v)[keep], np.maximum(u, v)[keep]
    _, first = np.unique(lo * n + hi, return_index=True)
    lo, hi = lo[first], hi[first]
    flip = rng.random(len(lo)) < 0.5
    u, v = np.where(flip, hi, lo), np.where(flip, lo, hi)
    w = rng.integers(1, 20, len(u)) if integer else rng.uniform(0.5, 100.0, len(u))
    return u, v, w


def scipy_forest(u, v, w, n):
    T = minimum_spanning_tree(sp.csr_matrix((w.astype(np.float64), (u, v)), shape=(n, n)))
    trees = connected_components(sp.csr_matrix((np.ones(len(u)), (u, v)), shape=(n, n)), directed=False)[0]
    T = T.tocoo()
    return float(T.data.sum()), T.nnz, trees, set(zip(np.minimum(T.row, T.col).tolist(), np.maximum(T.row, T.col).tolist()))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n,m", [(2, 1), (50, 40), (300, 2000), (1000, 3000), (200, 15000)])
def test_distinct_weights_match_scipy(method, n, m):
    rng = np.random.default_rng(n + m)
    u, v, w = simple_graph(rng, n, m)
    assert len(np.unique(w)) == len(w)
    weight, size, trees, pairs = scipy_forest(u, v, w, n)
    f = minimum_spanning_forest((u, v, w), n, method=method)
    assert f.weight == pytest.approx(weight, rel=1e-12)
    assert len(f.edges) == size and f.trees == trees
    got = set(zip(np.minimum(u, v)[f.edges].tolist(), np.maximum(u, v)[f.edges].tolist()))
    assert got == pairs


@pytest.mark.parametrize("seed", range(6))
def test_multigraph_ties_against_networkx(seed):
    """Self-loops, parallel edges and many equal weights: weight and forest size as networkx; every
    method returns the same edge ids, and those form a spanning forest (acyclic, same components)."""
    nx = pytest.importorskip("networkx")  # the reference
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(5, 80)), int(rng.integers(0, 300))
    u, v = rng.integers(0, n, m), rng.integers(0, n, m)
    w = rng.integers(1, 4, m)
    G = nx.MultiGraph()
    G.add_nodes_from(range(n))
    G.add_weighted_edges_from(zip(u.tolist(), v.tolist(), w.tolist()))
    T = nx.minimum_spanning_tree(G)
    results = [minimum_spanning_forest((u, v, w), n, method=meth) for meth in METHODS]
    for f in results:
        assert f.weight == T.size(weight="weight")
        assert f.trees == nx.number_connected_components(G)
        np.testing.assert_array_equal(f.edges, results[0].edges)
    F = nx.Graph()
    F.add_nodes_from(range(n))
    F.add_edges_from(zip(u[results[0].edges].tolist(), v[results[0].edges].tolist()))
    assert nx.is_forest(F) and nx.number_connected_components(F) == results[0].trees


def test_disconnected_and_isolated():
    u = np.array([0, 1, 3, 4, 4])
    v = np.array([1, 2, 4, 5, 3])
    w = np.array([1.0, 2.0, 3.0, 4.0, 0.5])
    for meth in METHODS:
        f = minimum_spanning_forest((u, v, w), 8, method=meth)
        assert f.trees == 8 - 4  # {0,1,2}, {3,4,5}, 6, 7
        assert f.weight == pytest.approx(1 + 2 + 0.5 + 4)
    f = minimum_spanning_forest((np.array([], int), np.array([], int), np.array([])), 3)
    assert len(f.edges) == 0 and f.trees == 3 and f.weight == 0


def test_larger_graph_all_methods_agree_with_scipy():
    rng = np.random.default_rng(99)
    n = 20000
    u, v, w = simple_graph(rng, n, 120000, integer=True)
    weight, size, trees, _ = scipy_forest(u, v, w, n)
    ids = [minimum_spanning_forest((u, v, w), n, method=meth, threshold=1000).edges for meth in METHODS]
    for x in ids:
        np.testing.assert_array_equal(x, ids[0])
    assert int(w[ids[0]].sum()) == weight and len(ids[0]) == size and n - size == trees


def test_bad_inputs():
    with pytest.raises(InputError, match="out of range"):
        minimum_spanning_forest((np.array([0, 5]), np.array([1, 2]), np.array([1.0, 2.0])), 4)
    with pytest.raises(InputError, match="negative"):
        minimum_spanning_forest((np.array([0, -1]), np.array([1, 2]), None))
    with pytest.raises(InputError, match="NaN"):
        minimum_spanning_forest((np.array([0, 1]), np.array([1, 2]), np.array([1.0, np.nan])))
    with pytest.raises(InputError, match="method"):
        minimum_spanning_forest((np.array([0]), np.array([1]), None), method="prim")


def test_csv_roundtrip_and_ground_truth(tmp_path):
    rng = np.random.default_rng(1)
    u, v, w = simple_graph(rng, 400, 3000)
    path = tmp_path / "G.csv"
    write_edge_list(path, u, v, w)
    edges = read_edge_list(path)
    np.testing.assert_array_equal(edges.u, u)
    np.testing.assert_array_equal(edges.w, w)
    weight, size, _, pairs = scipy_forest(u, v, w, edges.n)
    truth_u, truth_v = np.array([p[0] for p in sorted(pairs)]), np.array([p[1] for p in sorted(pairs)])
    truth_w = np.array([w[(np.minimum(u, v) == a) & (np.maximum(u, v) == b)][0] for a, b in sorted(pairs)])
    truth = EdgeList(truth_u, truth_v, truth_w, edges.n)
    forest = forest_edges(edges, minimum_spanning_forest(edges))
    assert check_forest(forest, truth, distinct_weights=True) == []
    wrong = EdgeList(truth_u[1:], truth_v[1:], truth_w[1:], edges.n)
    assert check_forest(forest, wrong, distinct_weights=True)


# ---------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("integer", [False, True])
def test_gpu_same_forest_as_cpu_and_scipy(method, integer):
    import cupy

    rng = np.random.default_rng(7)
    n = 30000
    u, v, w = simple_graph(rng, n, 200000, integer=integer)
    u = np.concatenate([u, [5, u[0]]])  # a self-loop and a parallel copy of edge 0
    v = np.concatenate([v, [5, v[0]]])
    w = np.concatenate([w, [w[0], w[0]]])
    weight, size, trees, _ = scipy_forest(u[:-2], v[:-2], w[:-2], n)
    cpu = minimum_spanning_forest((u, v, w), n, method="kruskal")
    gpu = minimum_spanning_forest((cupy.asarray(u), cupy.asarray(v), cupy.asarray(w)), n, method=method,
                                  threshold=20000)
    assert isinstance(gpu.edges, cupy.ndarray)
    np.testing.assert_array_equal(gpu.edges.get(), cpu.edges)
    assert gpu.weight == pytest.approx(weight, rel=1e-12) and gpu.trees == trees


@pytest.mark.gpu
def test_gpu_multigraph_ties():
    import cupy

    rng = np.random.default_rng(3)
    n, m = 5000, 40000
    u, v, w = rng.integers(0, n, m), rng.integers(0, n, m), rng.integers(1, 3, m)
    cpu = minimum_spanning_forest((u, v, w), n, method="filter_kruskal")
    for meth in METHODS:
        gpu = minimum_spanning_forest((cupy.asarray(u), cupy.asarray(v), cupy.asarray(w)), n, method=meth,
                                      threshold=5000)
        np.testing.assert_array_equal(gpu.edges.get(), cpu.edges)
