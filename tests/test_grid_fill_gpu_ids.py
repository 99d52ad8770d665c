"""The GPU fill at 2^32 cells and beyond (terrain_io/grid/fill/_gpu.py, kernels/fill.cu): the lakes'
union-find works on uint32 cell ids up to 2^32 cells (65536^2) and on uint64 ids beyond. The 64-bit
path is forced on small DEMs and checked byte for byte against the CPU pipeline and the
Priority-Flood of the definition (``pytest -m gpu``); the host side checks that a 65536^2 DEM is
given to the GPU, not sent to the CPU for its cell ids."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from terrain_io.grid.fill import _gpu, pipeline
from terrain_io.store import TerrainStore
from references import fill_test_dem, gpu_equals_cpu

H100_FREE = 79 * 2**30  # GPU memory an idle H100 80GB leaves free


def big_store(rows: int, cols: int) -> SimpleNamespace:
    """What the fill's device choice reads of a float32 store made by ``terrain synth`` (tile 256, shard 8)."""
    return SimpleNamespace(shape=(rows, cols), dtype=np.dtype(np.float32), tile_size=256, shard_size=8,
                           shard_grid=(-(-rows // 2048), -(-cols // 2048)))


def test_65536_squared_fills_on_the_gpu(monkeypatch):
    """2^32 cells fit the H100 (the ringed values and levels, a 32-bit id and a flag a cell: 54 GiB)
    within a 16 GB host budget; before, 2^31 cells or more went to the CPU for the 32-bit ids."""
    monkeypatch.setattr(pipeline, "gpu_free_bytes", lambda: H100_FREE)
    assert pipeline._gpu_misfit(big_store(65536, 65536), 16 * 2**30) is None
    assert pipeline._gpu_misfit(big_store(46341, 46341), 8 * 2**30) is None  # just past 2^31 cells
    # one column more: 64-bit ids, beyond the card -- refused for its memory, not its ids
    why = pipeline._gpu_misfit(big_store(65536, 65537), 16 * 2**30)
    assert why is not None and "GPU memory" in why


@pytest.mark.gpu
@pytest.mark.parametrize("kind,shape,tile,outlets", [("flat-bottomed", (300, 257), 16, "edge+nodata"),
                                                     ("nodata-holed", (517, 611), 128, "edge"),
                                                     ("terraced", (53, 71), 8, "edge+nodata")])
def test_wide_cell_ids_give_the_cpu_bytes(tmp_path, monkeypatch, kind, shape, tile, outlets):
    """The uint64 union-find (forced on small DEMs) writes the CPU's bytes: rasters and table."""
    built = []
    module = _gpu._module
    monkeypatch.setattr(_gpu, "NARROW_CELLS", 0)
    monkeypatch.setattr(_gpu, "_module", lambda vtype, ctype: built.append(ctype) or module(vtype, ctype))
    h = fill_test_dem(kind, *shape, seed=len(kind))
    res = gpu_equals_cpu(TerrainStore.from_array(tmp_path / "g.zarr", h, tile=tile, shard=2),
                         TerrainStore.from_array(tmp_path / "c.zarr", h, tile=tile, shard=2), outlets)
    assert built == ["unsigned long long"] and res.depressions > 0


@pytest.mark.gpu
def test_wide_cell_ids_float64_dem(tmp_path, monkeypatch):
    """64-bit ids with the float64 value type (an int32 DEM with nodata)."""
    monkeypatch.setattr(_gpu, "NARROW_CELLS", 0)
    rng = np.random.default_rng(11)
    h = rng.integers(0, 60, (140, 150)).astype(np.int32)
    h[rng.random(h.shape) < 0.05] = -32768
    res = gpu_equals_cpu(TerrainStore.from_array(tmp_path / "g.zarr", h, tile=16, shard=2, nodata=-32768),
                         TerrainStore.from_array(tmp_path / "c.zarr", h, tile=16, shard=2, nodata=-32768))
    assert res.depressions > 0
