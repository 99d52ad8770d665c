"""GPU tile phase of the grid MST (CuPy Boruvka + contraction): bit for bit the CPU backend's, and scipy's.

The contraction kernel (``mst_contract.cu``) is compared with the numba reference
``mst._cpu.contract_tile`` directly, array by array, on whole batches of tiles: random, flat
(ties everywhere, signed zeros), nodata islands, partial tiles at the DEM's edge, batches inside a
larger DEM (neighbours outside the batch), forests of other elevations than the weights (shapes
that no MST of these values has), tile sizes 32 to 1024.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import ndimage

from terrain_io import weights as weight_models
from terrain_io.grid.mst import _cpu as K
from terrain_io.grid.mst import edge_list, mst, read_edges
from terrain_io.grid.mst.shared import FOREST_EDGES, FOREST_GIVEN
from terrain_io.store import TerrainStore, valid_mask
from references import islands, scipy_msf, terrain


pytestmark = pytest.mark.gpu


def both(tmp_path, vals, weight="max", nodata=None, tile=64, shard=4, name="g"):
    """Run the pipeline on the GPU and on the CPU; their bitmasks must be identical."""
    out = {}
    for device in ("gpu", "cpu"):
        store = TerrainStore.from_array(tmp_path / f"{name}-{device}.zarr", vals, tile=tile, shard=shard,
                                        nodata=nodata)
        res = mst(store, weight=weight, device=device, progress=False, method="tiled")
        out[device] = (res, read_edges(store))
    (rg, bg), (rc, bc) = out["gpu"], out["cpu"]
    assert rg.device == "gpu" and rc.device == "cpu"
    np.testing.assert_array_equal(bg, bc)
    assert rg.total_weight_exact == rc.total_weight_exact and rg.trees == rc.trees
    return rg, bg


@pytest.mark.parametrize("weight", ["max", "absdiff"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16"])
def test_gpu_equals_cpu_and_scipy(tmp_path, weight, dtype):
    vals = terrain(211, 347, seed=3, levels=40 if dtype == "int16" else None)  # int16: many ties
    nodata = None
    if dtype == "int16":
        vals = vals.astype(np.int16)
        vals[50:60, :] = -32768
        nodata = -32768
    else:
        vals = vals.astype(dtype)
        vals[np.random.default_rng(0).random(vals.shape) < 0.1] = np.nan
    res, bits = both(tmp_path, vals, weight, nodata, tile=32, shard=4)
    valid = valid_mask(vals, nodata)
    want, total = scipy_msf(vals, valid, weight)
    u, v = edge_list(bits)
    assert set(zip(u.tolist(), v.tolist())) == want
    assert Fraction(res.total_weight_exact) == total
    assert res.trees == islands(valid)


@pytest.mark.parametrize("tile", [32, 64, 128, 256, 512, 1024])
def test_gpu_tile_sizes(tmp_path, tile):
    vals = terrain(1100, 1300, seed=tile, levels=300)
    vals[np.random.default_rng(tile).random(vals.shape) < 0.01] = np.nan
    both(tmp_path, vals, tile=tile, shard=2)


def test_gpu_flat_and_thin(tmp_path):
    both(tmp_path, np.zeros((300, 300), np.float32), tile=128, shard=2, name="flat")
    both(tmp_path, np.random.default_rng(1).random((1, 5000)).astype(np.float32), tile=256, shard=2, name="row")
    both(tmp_path, np.random.default_rng(2).random((3000, 1)).astype(np.float32), tile=32, shard=8, name="col")


# ---------------------------------------------------------------------------------------------
# Contraction on the GPU against contract_tile, array by array
# ---------------------------------------------------------------------------------------------
_GPUS: dict = {}


def gpu_for(tile, weight, dtype):
    from terrain_io.grid.mst._gpu import GpuTileForest

    key = (tile, weight, np.dtype(dtype).str)
    if key not in _GPUS:
        _GPUS[key] = GpuTileForest(tile, weight_models.get(weight), dtype)
    return _GPUS[key]


def batch_tiles(H, W, T):
    """All tiles of an H x W batch, in a scrambled order (the kernel must not assume one)."""
    tiles = np.array([(i, j, min(T, H - i), min(T, W - j)) for i in range(0, H, T) for j in range(0, W, T)],
                     dtype=np.int64)
    return tiles[np.random.default_rng(H * W).permutation(len(tiles))]


def assert_same_contraction(got, want):
    nv, ne = want[0], want[4]
    np.testing.assert_array_equal(got[0], nv)
    np.testing.assert_array_equal(got[4], ne)
    for t in range(len(nv)):
        for x in (1, 2, 3):  # vid, vh, vmask
            np.testing.assert_array_equal(got[x][t, :nv[t]], want[x][t, :nv[t]])
        for x in (5, 6, 7, 8):  # eu, ev, ew, ecode
            np.testing.assert_array_equal(got[x][t, :ne[t]], want[x][t, :ne[t]])
        np.testing.assert_array_equal(np.signbit(got[2][t, :nv[t]]), np.signbit(want[2][t, :nv[t]]))
        np.testing.assert_array_equal(np.signbit(got[7][t, :ne[t]]), np.signbit(want[7][t, :ne[t]]))
    np.testing.assert_array_equal(got[9], want[9])  # the exact sums, bucket for bucket


def check_contraction(vals, T, weight="max", nodata=None, place=(0, 0, 0, 0), forest_vals=None):
    """GPU contraction == contract_tile on the batch ``vals`` of tile size T.

    ``place`` = (gr0, gc0, rows below, cols right): where the batch lies in a larger DEM.
    ``forest_vals``: elevations the forests are computed from (default ``vals``).
    """
    H, W = vals.shape
    gr0, gc0, below, right = place
    rows, cols = gr0 + H + below, gc0 + W + right
    valid = valid_mask(vals, nodata)
    kind = weight_models.get(weight).kind
    tiles = batch_tiles(H, W, T)
    cap = 8 * T + 8
    fv = vals if forest_vals is None else forest_vals
    hkey, float_bits = K.key_source(fv)
    bits = np.zeros((H, W), np.uint8)
    K.tile_phase_batch(fv, valid, hkey, float_bits, bits, tiles, gr0, gc0, rows, cols, kind, cap, FOREST_EDGES)
    want = K.tile_phase_batch(vals, valid, hkey, float_bits, bits, tiles, gr0, gc0, rows, cols, kind, cap,
                              FOREST_GIVEN)
    gpu = gpu_for(T, weight, vals.dtype)
    assert_same_contraction(gpu.contract(vals, valid, bits, tiles, gr0, gc0, rows, cols, cap), want)
    if forest_vals is None and T <= 1024:  # the whole GPU tile phase: Boruvka's forests, then contraction
        gbits, got = gpu.tile_phase(vals, valid, tiles, gr0, gc0, rows, cols, cap)
        np.testing.assert_array_equal(gbits, bits)
        assert_same_contraction(got, want)
    return want


@pytest.mark.parametrize("weight", ["max", "absdiff"])
@pytest.mark.parametrize("place", [(0, 0, 0, 0), (256, 512, 7, 64)])
def test_contract_random(weight, place):
    rng = np.random.default_rng(5)
    check_contraction(rng.random((200, 230)).astype(np.float32), 64, weight, place=place)
    check_contraction(terrain(300, 257, seed=2), 32, weight, place=place)
    check_contraction(rng.normal(size=(150, 170)), 64, weight, place=place)  # float64


def test_contract_flat_and_ties():
    check_contraction(np.zeros((200, 200), np.float32), 64)  # one weight: codes decide everything
    rng = np.random.default_rng(9)
    signed = rng.choice(np.array([-0.0, 0.0], np.float32), size=(130, 140))
    check_contraction(signed, 32, place=(64, 32, 5, 5))  # zero maxima of either sign
    check_contraction(terrain(256, 256, seed=4, levels=4), 64, "absdiff")
    check_contraction(rng.integers(0, 3, size=(160, 96)).astype(np.int16), 32, "absdiff", place=(32, 0, 0, 1))


def test_contract_other_forests():
    """Forests of random elevations, contracted with flat / terraced weights: long tie paths."""
    rng = np.random.default_rng(3)
    fv = rng.random((192, 192)).astype(np.float32)
    check_contraction(np.zeros((192, 192), np.float32), 64, forest_vals=fv, place=(64, 64, 64, 64))
    check_contraction(terrain(192, 192, seed=1, levels=3), 32, forest_vals=fv)


def test_contract_nodata_islands():
    rng = np.random.default_rng(7)
    vals = rng.integers(-20, 20, size=(190, 210)).astype(np.int16)
    vals[ndimage.gaussian_filter(rng.standard_normal(vals.shape), 3) > 0.02] = -9999
    vals[:, 50:53] = -9999
    check_contraction(vals, 32, nodata=-9999, place=(32, 32, 40, 40))
    t = terrain(300, 300, seed=6)
    t[rng.random(t.shape) < 0.3] = np.nan
    check_contraction(t, 64, "absdiff", place=(128, 0, 1, 0))
    check_contraction(np.full((64, 96), np.nan, np.float32), 32)  # nothing valid


@pytest.mark.parametrize("tile", [32, 64, 128, 256, 512, 1024])
def test_contract_tile_sizes(tile):
    """Full and partial tiles of every size (the batch ends inside its last tile row and column)."""
    H, W = tile + tile // 2 + 3, 2 * tile - 5
    vals = terrain(H, W, seed=tile, levels=200)
    vals[np.random.default_rng(tile).random(vals.shape) < 0.01] = np.nan
    check_contraction(vals, tile)
    check_contraction(vals, tile, place=(tile * 4, tile * 2, 0, 3))


@pytest.mark.parametrize("weight", ["max", "absdiff"])
def test_gpu_contract_end_to_end(tmp_path, weight):
    """End to end: GPU contraction on vs off vs the CPU backend, identical bits and exact weight."""
    vals = terrain(700, 900, seed=21, levels=60)
    rng = np.random.default_rng(2)
    vals[ndimage.gaussian_filter(rng.standard_normal(vals.shape), 4) > 0.05] = np.nan
    rg, bits = both(tmp_path, vals, weight, tile=64, shard=4, name=f"e2e{weight}")
    store = TerrainStore.from_array(tmp_path / f"off{weight}.zarr", vals, tile=64, shard=4)
    off = mst(store, weight=weight, device="gpu", progress=False, gpu_contract=False, method="tiled")
    np.testing.assert_array_equal(read_edges(store), bits)
    assert off.total_weight_exact == rg.total_weight_exact
    assert rg.timings["gpu_contract"] > 0 and rg.timings["tile"] == 0
