"""APSP (min-plus squaring, Floyd-Warshall, blocked FW) against scipy.sparse.csgraph and brute force."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import NegativeCycleError as ScipyNegativeCycle
from scipy.sparse.csgraph import floyd_warshall, johnson

from terrain_io.errors import InputError
from terrain_io.graph import NegativeCycleError, apsp, minplus, reconstruct_path

METHODS = ["minplus", "floyd_warshall", "blocked"]


def random_matrix(rng, n, density, low=1.0, high=10.0, dtype=np.float64):
    """Dense weights with inf for missing edges (no self-loops), and the same graph as scipy CSR."""
    W = rng.uniform(low, high, (n, n))
    if np.dtype(dtype).kind == "i":
        W = np.round(W)
    W[rng.random((n, n)) >= density] = np.inf
    np.fill_diagonal(W, np.inf)
    mask = np.isfinite(W)
    csr = sp.csr_matrix((W[mask], np.nonzero(mask)), shape=(n, n))
    if np.dtype(dtype).kind == "i":
        Wi = np.where(mask, W, np.iinfo(np.int32).max).astype(np.int32)
        return Wi, csr
    return W.astype(dtype), csr


def no_negative_cycles(rng, n, density):
    """Negative edges without negative cycles: w(u, v) = c(u, v) + p(u) - p(v) with c >= 1 (potentials)."""
    W, _ = random_matrix(rng, n, density)
    p = rng.uniform(0, 5, n)
    W = W + p[:, None] - p[None, :]
    W = np.round(W, 6)
    mask = np.isfinite(W)
    return W, sp.csr_matrix((W[mask], np.nonzero(mask)), shape=(n, n))


def as_float(D):
    return np.where(D == np.iinfo(np.int32).max, np.inf, D.astype(np.float64)) if D.dtype.kind == "i" else D


def path_length(W, path):
    return sum(float(W[a, b]) for a, b in zip(path, path[1:]))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n,density", [(1, 1.0), (7, 0.5), (45, 0.3), (130, 0.05), (97, 0.9)])
def test_random_graphs_match_scipy(method, n, density):
    rng = np.random.default_rng(n * 31 + int(density * 100))
    W, csr = random_matrix(rng, n, density)
    ref = floyd_warshall(csr, directed=True)
    D, P = apsp(W, method=method, return_predecessors=True, tile=32 if method == "blocked" else None)
    np.testing.assert_allclose(D, ref, rtol=1e-12)
    for i in rng.choice(n, min(n, 4), replace=False):
        for j in range(n):
            path = reconstruct_path(P, int(i), j)
            if np.isinf(ref[i, j]):
                assert path == []
            else:
                assert path[0] == i and path[-1] == j
                assert path_length(W, path) == pytest.approx(ref[i, j])


@pytest.mark.parametrize("method", METHODS)
def test_negative_edges_match_johnson(method):
    rng = np.random.default_rng(5)
    W, csr = no_negative_cycles(rng, 80, 0.15)
    assert (W[np.isfinite(W)] < 0).any()
    ref = johnson(csr, directed=True)
    D = apsp(W, method=method, tile=32)
    np.testing.assert_allclose(D, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_dtypes(method, dtype):
    rng = np.random.default_rng(11)
    W, csr = random_matrix(rng, 70, 0.2, dtype=dtype)
    ref = floyd_warshall(csr, directed=True)
    D = apsp(W, method=method, tile=32)
    assert D.dtype == dtype
    np.testing.assert_allclose(as_float(D), ref, rtol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_negative_cycle_detected(method):
    rng = np.random.default_rng(3)
    W, csr = random_matrix(rng, 40, 0.2)
    W[3, 17], W[17, 29], W[29, 3] = 1.0, -5.0, 2.0
    csr = sp.csr_matrix(np.where(np.isfinite(W), W, 0))
    with pytest.raises(ScipyNegativeCycle):
        floyd_warshall(csr, directed=True)
    with pytest.raises(NegativeCycleError) as info:
        apsp(W, method=method, tile=32)
    assert set(info.value.vertices) & {3, 17, 29}


def test_negative_self_loop_is_a_cycle():
    W = np.full((3, 3), np.inf)
    W[1, 1] = -1
    with pytest.raises(NegativeCycleError):
        apsp(W)


def test_methods_agree_unreachable_blocks():
    """Two disconnected halves: every method leaves the cross pairs at inf."""
    rng = np.random.default_rng(8)
    A, _ = random_matrix(rng, 30, 0.3)
    W = np.full((60, 60), np.inf)
    W[:30, :30] = A
    W[30:, 30:] = A
    results = [apsp(W, method=m, tile=32) for m in METHODS]
    for D in results:
        assert np.isinf(D[:30, 30:]).all() and np.isinf(D[30:, :30]).all()
        np.testing.assert_allclose(D, results[0], rtol=1e-12)


def test_minplus_brute_force():
    rng = np.random.default_rng(2)
    A = rng.uniform(-3, 9, (23, 17))
    B = rng.uniform(-3, 9, (17, 31))
    A[rng.random(A.shape) < 0.3] = np.inf
    B[rng.random(B.shape) < 0.3] = np.inf
    ref = np.min(A[:, :, None] + B[None, :, :], axis=1)
    np.testing.assert_array_equal(minplus(A, B), ref)
    Ai = np.where(np.isinf(A), np.iinfo(np.int32).max, np.round(A)).astype(np.int32)
    Bi = np.where(np.isinf(B), np.iinfo(np.int32).max, np.round(B)).astype(np.int32)
    refi = np.min(np.where(np.isinf(A), np.inf, np.round(A))[:, :, None] + np.where(np.isinf(B), np.inf, np.round(B))[None], axis=1)
    np.testing.assert_array_equal(as_float(minplus(Ai, Bi)), refi)


def test_bad_inputs():
    with pytest.raises(InputError, match="square"):
        apsp(np.zeros((2, 3)))
    with pytest.raises(InputError, match="NaN"):
        apsp(np.array([[0, np.nan], [1, 0]]))
    with pytest.raises(InputError, match="method"):
        apsp(np.zeros((2, 2)), method="dijkstra")
    with pytest.raises(InputError, match="inner"):
        minplus(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(InputError, match="too large"):
        apsp(np.full((4, 4), 2**27, dtype=np.int32))


# ---------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("n", [1, 77, 300])
def test_gpu_matches_scipy(method, dtype, n):
    import cupy

    rng = np.random.default_rng(n + 1)
    W, csr = random_matrix(rng, n, 0.1 if n > 100 else 0.4, dtype=dtype)
    ref = floyd_warshall(csr, directed=True)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    D = apsp(cupy.asarray(W), method=method)
    assert isinstance(D, cupy.ndarray) and D.dtype == dtype
    np.testing.assert_allclose(as_float(D.get()), ref, rtol=rtol)
    D, P = apsp(cupy.asarray(W), method=method, return_predecessors=True)
    np.testing.assert_allclose(as_float(D.get()), ref, rtol=rtol)
    for j in range(n):
        path = reconstruct_path(P, 0, j)
        assert (path == []) == bool(np.isinf(ref[0, j]))
        if path:
            assert path_length(W.astype(np.float64), path) == pytest.approx(ref[0, j], rel=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [64, 128])
def test_gpu_blocked_large_negative(tile):
    import cupy

    rng = np.random.default_rng(tile)
    W, csr = no_negative_cycles(rng, 700, 0.02)
    ref = johnson(csr, directed=True)
    D = apsp(cupy.asarray(W.astype(np.float32)), method="blocked", tile=tile)
    np.testing.assert_allclose(D.get(), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_gpu_negative_cycle_and_minplus():
    import cupy

    rng = np.random.default_rng(4)
    W, _ = random_matrix(rng, 150, 0.1)
    W[10, 140], W[140, 77], W[77, 10] = 1.0, -4.0, 1.0
    for method in METHODS:
        with pytest.raises(NegativeCycleError):
            apsp(cupy.asarray(W), method=method)
    A = rng.uniform(-3, 9, (130, 70))
    B = rng.uniform(-3, 9, (70, 200))
    A[rng.random(A.shape) < 0.3] = np.inf
    ref = np.min(A[:, :, None] + B[None, :, :], axis=1)
    np.testing.assert_array_equal(minplus(cupy.asarray(A), cupy.asarray(B)).get(), ref)
    Ai = np.where(np.isinf(A), np.iinfo(np.int32).max, np.round(A)).astype(np.int32)
    Bi = np.round(B).astype(np.int32)
    refi = np.min(np.where(np.isinf(A), np.inf, np.round(A))[:, :, None] + Bi[None], axis=1)
    np.testing.assert_array_equal(as_float(minplus(cupy.asarray(Ai), cupy.asarray(Bi)).get()), refi)
