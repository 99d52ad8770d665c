"""GPU tile phase of the grid MST (CuPy Boruvka): bit for bit the CPU backend's forest, and scipy's."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from terrain_io.grid.mst import mst, read_edges
from terrain_io.store import TerrainStore, valid_mask

from test_grid_mst import edge_list, islands, scipy_msf, terrain

pytestmark = pytest.mark.gpu


def both(tmp_path, vals, weight="max", nodata=None, tile=64, shard=4, name="g"):
    """Run the pipeline on the GPU and on the CPU; their bitmasks must be identical."""
    out = {}
    for device in ("gpu", "cpu"):
        store = TerrainStore.from_array(tmp_path / f"{name}-{device}.zarr", vals, tile=tile, shard=shard,
                                        nodata=nodata)
        res = mst(store, weight=weight, device=device, progress=False)
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
