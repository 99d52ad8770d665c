"""Shapes and defining properties of every generator, checked with numpy / networkx."""
from __future__ import annotations

import numpy as np
import pytest

from terrain_io.backend import to_host
from terrain_io.errors import InputError
from terrain_io.graph import generate

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def as_nx(g, directed=False):
    nx = pytest.importorskip("networkx")  # the reference
    G = nx.DiGraph() if directed else nx.MultiGraph()
    G.add_nodes_from(range(g.n))
    G.add_edges_from(zip(to_host(g.u).tolist(), to_host(g.v).tolist()))
    return G


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ordered", [False, True])
def test_lists(device, ordered):
    nx = pytest.importorskip("networkx")  # the reference
    succ = to_host(generate.random_list(1000, n_lists=7, seed=3, ordered=ordered, device=device))
    assert succ.shape == (1000,) and succ.dtype == np.int32
    assert np.count_nonzero(succ == -1) == 7
    targets = succ[succ >= 0]
    assert len(np.unique(targets)) == len(targets) == 993         # in-degree <= 1
    G = nx.DiGraph()
    G.add_nodes_from(range(1000))
    G.add_edges_from((i, int(s)) for i, s in enumerate(succ) if s >= 0)
    assert nx.is_directed_acyclic_graph(G) and nx.number_weakly_connected_components(G) == 7
    if ordered:
        nz = succ >= 0
        assert np.all(succ[nz] == np.flatnonzero(nz) + 1)
    again = to_host(generate.random_list(1000, n_lists=7, seed=3, ordered=ordered, device=device))
    np.testing.assert_array_equal(succ, again)                     # seeded


@pytest.mark.parametrize("device", DEVICES)
def test_list_graph_and_trees(device):
    nx = pytest.importorskip("networkx")  # the reference
    g = generate.list_graph(500, n_lists=4, seed=1, device=device)
    G = as_nx(g)
    assert g.m == 496 and nx.is_forest(G) and nx.number_connected_components(G) == 4
    assert max(d for _, d in G.degree()) == 2
    t = generate.kary_tree(1000, k=3, n_trees=2, seed=1, device=device)
    T = as_nx(t)
    assert t.m == 998 and nx.is_forest(T) and nx.number_connected_components(T) == 2
    assert max(d for _, d in T.degree()) <= 4                      # 3 children + 1 parent


@pytest.mark.parametrize("device", DEVICES)
def test_random_rmat_grid(device):
    nx = pytest.importorskip("networkx")  # the reference
    g = generate.random_graph(2000, m=5000, seed=1, device=device)
    assert g.m == 5000 and to_host(g.u).max() < 2000 and to_host(g.v).min() >= 0
    d = generate.random_graph(100, density=0.01, seed=1, device=device)
    assert d.m == 200                                              # m = 2 delta n^2 (Yogaratnam 2010, sec. 6.2)
    assert generate.thesis_graph_vertices(8_000_000, 0.001) == 63246
    r = generate.rmat(10, edge_factor=16, seed=2, device=device)
    u, v = to_host(r.u), to_host(r.v)
    assert r.n == 1024 and r.m == 16 * 1024 and u.max() < 1024 and v.max() < 1024
    deg = np.bincount(np.concatenate([u, v]), minlength=1024)
    assert deg.max() > 8 * deg.mean()                              # skewed, unlike a uniform graph
    grid = generate.grid_2d(5, 7, device=device)
    G = as_nx(grid)
    assert nx.is_isomorphic(nx.Graph(G), nx.grid_2d_graph(5, 7))
    assert generate.grid_2d(5, 7, diagonals=True, device=device).m == 4 * 6 * 2 + 4 * 7 + 5 * 6


@pytest.mark.parametrize("device", DEVICES)
def test_bfs_project_graph(device):
    nx = pytest.importorskip("networkx")  # the reference
    n = 400
    g = generate.bfs_project_graph(n, density=0.25, max_degree=0.2, seed=5, device=device)
    u, v = to_host(g.u), to_host(g.v)
    assert np.all(np.diff(u) >= 0)                                 # CSR order
    out_deg = np.bincount(u, minlength=n)
    assert out_deg.max() <= 0.2 * n + 2
    assert np.all(np.isin(np.arange(n), v[u == v]))               # self-edges everywhere
    assert nx.is_strongly_connected(as_nx(g, directed=True))
    full = generate.bfs_project_graph(n, density=0.25, seed=5, device=device)
    assert abs(full.m / (n * n) - 0.25) < 0.02


def test_generator_errors():
    with pytest.raises(InputError):
        generate.random_list(5, n_lists=6)
    with pytest.raises(InputError):
        generate.random_graph(10)
    with pytest.raises(InputError):
        generate.rmat(3, a=0.9, b=0.2, c=0.1)
    with pytest.raises(InputError):
        generate.kary_tree(10, k=0)
