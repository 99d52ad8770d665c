"""The in-core GPU fill (CuPy, terrain_io/kernels/fill.cu) against the CPU pipeline, byte for byte
(filled elevation, depth, depression ids and the whole depression table), and against the
Priority-Flood and lake references of test_grid_fill.py; run on a GPU machine with
``pytest -m gpu``."""
from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

from terrain_io.grid.fill import fill, read_fill
from terrain_io.store import TerrainStore
from references import check_against_references, convert_dem, fill_test_dem, gpu_equals_cpu, REAL

pytestmark = pytest.mark.gpu

@pytest.mark.parametrize("kind", ["random", "terraced", "flat-bottomed", "nodata-holed"])
@pytest.mark.parametrize("outlets", ["edge+nodata", "edge"])
@pytest.mark.parametrize("shape,tile", [((53, 71), 8), ((53, 71), 64), ((300, 257), 16), ((517, 611), 128)])
def test_gpu_equals_cpu_synthetic(tmp_path, kind, outlets, shape, tile):
    h = fill_test_dem(kind, *shape, seed=len(kind) + shape[0])
    gpu_equals_cpu(TerrainStore.from_array(tmp_path / "g.zarr", h, tile=tile, shard=2),
                   TerrainStore.from_array(tmp_path / "c.zarr", h, tile=tile, shard=2), outlets)


def test_gpu_against_references(tmp_path):
    """The GPU result against the independent references directly (pyflwdir, Priority-Flood, lakes by
    scipy.ndimage.label): check_against_references runs the CPU, so compare its outputs to the GPU's."""
    h = fill_test_dem("nodata-holed", 97, 130, seed=3)
    st = TerrainStore.from_array(tmp_path / "a.zarr", h, tile=32, shard=2)
    check_against_references(st, "edge")
    ref = read_fill(st)
    res = fill(st, outlets="edge", device="gpu", progress=False)
    got = read_fill(st)
    assert res.device == "gpu"
    for k in got:
        assert got[k].tobytes() == ref[k].tobytes(), k


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (2, 2), (17, 3), (33, 65)])
def test_gpu_small_and_empty(tmp_path, shape):
    rng = np.random.default_rng(sum(shape))
    h = rng.integers(0, 5, shape).astype(np.float32)
    gpu_equals_cpu(TerrainStore.from_array(tmp_path / "g.zarr", h, tile=8, shard=2),
                   TerrainStore.from_array(tmp_path / "c.zarr", h, tile=8, shard=2))
    e = np.full(shape, np.nan, np.float32)
    res = fill(TerrainStore.from_array(tmp_path / "e.zarr", e, tile=8, shard=2), device="gpu", progress=False)
    assert res.depressions == 0 and np.isnan(read_fill(tmp_path / "e.zarr")["elevation"]).all()


@pytest.mark.parametrize("dtype,nodata", [(np.int16, -9999), (np.uint8, 255), (np.int32, -32768),
                                          (np.float64, None)])
def test_gpu_dtypes(tmp_path, dtype, nodata):
    rng = np.random.default_rng(7)
    h = rng.integers(0, 60, (140, 150)).astype(dtype)
    if nodata is not None:
        h[rng.random(h.shape) < 0.05] = nodata
    else:
        h = h + rng.random(h.shape)
        h[rng.random(h.shape) < 0.05] = np.nan
    for outlets in ("edge+nodata", "edge"):
        gpu_equals_cpu(TerrainStore.from_array(tmp_path / f"g{outlets}.zarr", h, tile=16, shard=2, nodata=nodata),
                       TerrainStore.from_array(tmp_path / f"c{outlets}.zarr", h, tile=16, shard=2, nodata=nodata),
                       outlets)


def test_gpu_islands_walled_by_nodata(tmp_path):
    h = np.full((70, 70), 10.0, np.float32)
    h[5:65, 5:65] = np.nan
    h[8:62, 8:62] = 3.0
    h[30:40, 30:40] = 1.0
    for outlets in ("edge", "edge+nodata"):
        gpu_equals_cpu(TerrainStore.from_array(tmp_path / f"g{outlets}.zarr", h, tile=16, shard=2),
                       TerrainStore.from_array(tmp_path / f"c{outlets}.zarr", h, tile=16, shard=2), outlets)


def test_gpu_large_synthetic_many_rounds(tmp_path):
    """A synthetic terrain of 1.4 M cells (1,936 GPU tiles, large lakes): many rounds of tiles."""
    from terrain_io.synth import synthesize

    for name in ("g", "c"):
        synthesize(tmp_path / f"{name}.zarr", 1408, seed=3, nodata_fraction=0.01, tile=64, shard=4)
    res = gpu_equals_cpu(TerrainStore.open(tmp_path / "g.zarr"), TerrainStore.open(tmp_path / "c.zarr"))
    assert res.timings["rounds"] > 1 and res.depressions > 10


@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
@pytest.mark.parametrize("outlets", ["edge+nodata", "edge"])
def test_gpu_real_dems(tmp_path, path, outlets):
    gpu_equals_cpu(TerrainStore.open(convert_dem(path, tmp_path / "g.zarr", 64)),
                   TerrainStore.open(convert_dem(path, tmp_path / "c.zarr", 128)), outlets)


def test_gpu_auto_and_fallback(tmp_path):
    h = fill_test_dem("random", 40, 40, seed=1)
    st = TerrainStore.from_array(tmp_path / "a.zarr", h, tile=8, shard=2)
    assert fill(st, progress=False).device == "gpu"  # auto: the GPU when it fits
    h64 = (h * 10).astype(np.int64)
    st64 = TerrainStore.from_array(tmp_path / "b.zarr", h64, tile=8, shard=2)
    assert fill(st64, progress=False).device == "cpu"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fill(st64, device="gpu", progress=False)
    assert res.device == "cpu" and any("filled on the CPU" in str(w.message) for w in caught)
    assert fill(st, progress=False, held=True).device == "cpu"  # a CPU pipeline option: auto takes the CPU
    proc = subprocess.run([sys.executable, "-m", "cli", "-q", "fill", str(st64.path), "--device", "gpu"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("terrain: note: fill: ") and "filled on the CPU" in lines[0]
