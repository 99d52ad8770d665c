"""The in-core MST on the GPU (``mst --method incore``, issue 31): one data-parallel Boruvka over the
whole grid graph in GPU memory (``grid/mst/_gpu.GpuGridForest``) against scipy's minimum spanning tree
with the strict order made explicit (``references.scipy_msf``) and against the CPU's tiled pipeline: the
same ``mst/edges`` bits and the same result attributes. Cases: ties (integer elevations, flats, signed
zeros), nodata islands (thousands beside large ones: speckle), extreme values, odd and thin shapes, a
ramp (hooking chains as long as the grid), both weight models, every key layout (one packed 64-bit key,
or weight then code). And, on the CPU, the choice of the route (``pipeline.choose_method``).
"""
from __future__ import annotations

from fractions import Fraction

import os

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import ndimage

from references import islands, scipy_msf, terrain
from test_first_run_compile import _mst_cases
from terrain_io import weights as weight_models
from terrain_io.errors import InputError
from terrain_io.grid.mst import edge_list, mst, pipeline as mst_pipeline, read_edges
from terrain_io.grid.mst._gpu import GpuGridForest
from terrain_io.store import TerrainStore, valid_mask

ATTRS = ("weight_model", "cells", "valid_cells", "edge_count", "trees", "total_weight", "total_weight_exact",
         "edges_encoding")


def _big_cases():
    rng = np.random.default_rng(31)
    blobs = terrain(700, 900, seed=21, levels=60)
    blobs[ndimage.gaussian_filter(rng.standard_normal(blobs.shape), 4) > 0.05] = np.nan
    ints = terrain(333, 517, seed=4, levels=40).astype(np.int16)  # flats: ties everywhere
    ints[100:110, :] = -32768
    ramp = np.add.outer(np.arange(257), np.arange(1031)).astype(np.float32)  # chains across the grid
    speckle = terrain(300, 400, seed=9, levels=30)  # ~2000 islands (~850 single cells), done in the first
    speckle[rng.random(speckle.shape) < 0.6] = np.nan  # rounds, beside large ones (the root lists drop them)
    return [("blobs", blobs, "max", None), ("blobs-absdiff", blobs.astype(np.float64), "absdiff", None),
            ("int16-flats", ints, "max", -32768), ("int16-flats-absdiff", ints, "absdiff", -32768),
            ("ramp", ramp, "max", None), ("ramp-absdiff", ramp, "absdiff", None),
            ("speckle", speckle, "max", None), ("speckle-absdiff", speckle.astype(np.float64), "absdiff", None),
            ("zeros", np.zeros((300, 301), np.float32), "max", None),
            ("column", rng.random((3001, 1)).astype(np.float32), "absdiff", None),
            ("one-cell", np.ones((1, 1), np.float32), "max", None),
            ("two-cells", np.array([[2.0], [1.0]], np.float32), "max", None)]


def _cases():
    return [(n, v, w, None) for n, v, w in _mst_cases()] + _big_cases()


def _terrain(*args):
    """``terrain ARGS`` in this process (click's runner)."""
    from cli.main import _register, cli

    _register()
    return CliRunner().invoke(cli, [str(a) for a in args])


def _run(tmp_path, vals, weight, nodata, tile, shard, **kw):
    store = TerrainStore.from_array(tmp_path / f"{len(list(tmp_path.iterdir()))}.zarr", vals, tile=tile, shard=shard,
                                    nodata=nodata)
    res = mst(store, weight=weight, progress=False, **kw)
    return res, read_edges(store), store.results()["mst"]


@pytest.mark.gpu
@pytest.mark.parametrize("name,vals,weight,nodata", _cases(), ids=[c[0] for c in _cases()])
def test_incore_gpu_equals_the_cpu_tiled_pipeline_and_scipy(tmp_path, name, vals, weight, nodata):
    tile, shard = (8, 2) if vals.size < 10_000 else (64, 4)
    res, bits, attrs = _run(tmp_path, vals, weight, nodata, tile, shard, device="gpu")  # auto: in core
    assert res.device == "gpu" and res.batch_tiles == 0 and "gpu_rounds" in res.timings, res
    packed = weight_models.get(weight).fits_float32(vals.dtype)
    ref, ref_bits, ref_attrs = _run(tmp_path, vals, weight, nodata, tile, shard, device="cpu", method="tiled")
    assert ref.batch_tiles > 0
    np.testing.assert_array_equal(bits, ref_bits)
    assert {k: attrs[k] for k in ATTRS} == {k: ref_attrs[k] for k in ATTRS}, packed
    valid = valid_mask(vals, nodata)
    want, total = scipy_msf(vals, valid, weight)
    u, v = edge_list(bits)
    assert set(zip(u.tolist(), v.tolist())) == want
    assert Fraction(res.total_weight_exact) == total and res.total_weight == float(total)
    assert res.trees == islands(valid) and res.edges == len(want)


@pytest.mark.gpu
@pytest.mark.parametrize("name,vals,weight", _mst_cases(), ids=[c[0] for c in _mst_cases()])
def test_tiled_gpu_on_the_same_cases(tmp_path, name, vals, weight):
    """The tiled route's GPU tile phase on the cases above (subnormal float32 elevations among them: CuPy
    compiles with -ftz=true, which flushed them to zero in the conversions, ties that were not)."""
    res, bits, attrs = _run(tmp_path, vals, weight, None, 8, 2, device="gpu", method="tiled")
    ref, ref_bits, ref_attrs = _run(tmp_path, vals, weight, None, 8, 2, device="cpu", method="tiled")
    assert res.batch_tiles > 0 and res.device == "gpu"
    np.testing.assert_array_equal(bits, ref_bits)
    assert {k: attrs[k] for k in ATTRS} == {k: ref_attrs[k] for k in ATTRS}


def _both_methods(tmp_path, vals, device, tile):
    """``terrain mst --method incore`` and ``--method tiled`` on one DEM: method -> (bits, attributes);
    the same bits and result attributes, the route each took as asked."""
    got = {}
    for method in ("incore", "tiled"):
        store = TerrainStore.from_array(tmp_path / f"{method}.zarr", vals, tile=tile, shard=2)
        out = _terrain("mst", store.path, "--device", device, "--method", method, "-q")
        assert out.exit_code == 0, out.output
        got[method] = read_edges(store), TerrainStore.open(store.path).results()["mst"]
    np.testing.assert_array_equal(got["incore"][0], got["tiled"][0])
    assert got["incore"][1]["batch_tiles"] == 0 and got["tiled"][1]["batch_tiles"] > 0
    assert {k: got["incore"][1][k] for k in ATTRS} == {k: got["tiled"][1][k] for k in ATTRS}
    assert got["incore"][1]["device"] == got["tiled"][1]["device"] == device
    return got


@pytest.mark.gpu
def test_incore_gpu_from_the_command_line(tmp_path):
    vals = terrain(200, 300, seed=8, levels=20)
    vals[50:60, 40:200] = np.nan
    _both_methods(tmp_path, vals, "gpu", 32)


# -- the choice of the route (host side, no GPU) ---------------------------------------------------------------

def test_the_route_is_chosen_by_what_fits(tmp_path, monkeypatch):
    store = TerrainStore.from_array(tmp_path / "d.zarr", terrain(64, 96, seed=1), tile=8, shard=2)
    model, n = weight_models.get("max"), 64 * 96
    need = GpuGridForest.device_bytes(n, model, np.float32)
    assert need == n * 4 + 22 * n  # float32 elevations, one packed key: no codes
    assert GpuGridForest.device_bytes(n, weight_models.get("absdiff"), np.float32) == need + 4 * n

    def choose(method="auto", device="gpu", budget=1 << 30, scheduler="local", batch=None, free=1e12):
        return mst_pipeline.choose_method(store, model, method, device, budget, scheduler, batch, lambda: free)

    assert choose() == "incore" and choose("incore") == "incore"
    assert choose(free=need - 1) == "tiled" and choose(free=need) == "incore"
    with pytest.raises(InputError, match="GPU memory"):
        choose("incore", free=need - 1)
    assert choose("tiled") == "tiled"
    assert choose(scheduler="threads") == "tiled" and choose(batch=2) == "tiled"
    with pytest.raises(InputError, match="scheduler"):
        choose("incore", scheduler="threads")
    assert choose(budget=1 << 10) == "tiled"  # the host's bands and shards over the budget
    with pytest.raises(InputError, match="host memory"):
        choose("incore", budget=1 << 10)
    with pytest.raises(InputError, match="unknown MST method"):
        choose("fast")
    monkeypatch.setattr(GpuGridForest, "MAX_CELLS", n - 1)  # more cells than the edge codes number
    assert choose() == "tiled"
    with pytest.raises(InputError, match="edge codes"):
        choose("incore")
    # the CPU: in memory when small (auto) or asked for within the budget
    assert choose(device="cpu") == "incore" and choose("tiled", device="cpu") == "tiled"
    assert choose(device="cpu", budget=mst_pipeline.IN_MEMORY_BYTES * n - 1) == "tiled"
    with pytest.raises(InputError, match="budget"):
        choose("incore", device="cpu", budget=mst_pipeline.IN_MEMORY_BYTES * n - 1)
    monkeypatch.setattr(mst_pipeline, "IN_MEMORY_BELOW", n)
    assert choose(device="cpu") == "tiled" and choose("incore", device="cpu") == "incore"
    # the host's shards counted per reader thread (one a shard at most), not per core: a many-core host
    one_shard = TerrainStore.from_array(tmp_path / "o.zarr", terrain(64, 64, seed=1), tile=32, shard=2)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    shard_bytes = 64 * 64 * 4
    assert mst_pipeline._gpu_incore_misfit(one_shard, model, 4 * shard_bytes, 1e12) is None


def test_method_on_the_cpu_gives_the_same_forest(tmp_path):
    vals = terrain(90, 70, seed=2, levels=10)
    vals[20:30, :] = np.nan
    _both_methods(tmp_path, vals, "cpu", 16)
    out = _terrain("mst", tmp_path / "tiled.zarr", "--method", "incore", "--memory", "10KB", "--device", "cpu", "-q")
    assert out.exit_code != 0 and out.output.strip().splitlines()[-1].startswith("terrain: error: mst --method incore")
    assert "Traceback" not in out.output
