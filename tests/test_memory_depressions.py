"""``terrain depressions`` out of core: its boundary solve up and down fill's quadtree of contracted
blocks (grid/fill/_levels.py's BlockTree, grid/depressions/pipeline.py's ChainTree), so that no
array spans the O(N / T) boundary nodes and a store 8x the budget runs within it.

Checked against the references of tests/test_grid_depressions.py (basins by descent from the
definition with scipy's plateau labels, minimax values by a Kruskal over the whole cell graph), on
DEMs whose plateaus cross many tiles and quadtree blocks; and the peak RSS growth of a fresh process
at 8x (tests/test_memory_budget.py's harness), with the same bytes as a held run with other tiles.
Before, the solve held ~90 bytes a boundary node and a store 8x the budget was refused in one line.
"""
from __future__ import annotations

import numpy as np
import pytest

from references import fill_test_dem
from terrain_io.store import TerrainStore
from test_grid_depressions import _same, check_hierarchy
from test_memory_budget import NEEDS_PROC
from test_memory_outofcore import _smooth, depressions_within


def _flats(rows: int, cols: int) -> np.ndarray:
    """Terraces whose flats span many 8 x 8 tiles and blocks of them: a wide flat minimum with a
    terrace and a pit inside it, flats on the edge, a flat ring walled in by nodata, terraced noise."""
    h = np.full((rows, cols), 9.0, np.float32)
    h[3:rows - 3, 3:cols - 3] = 6.0  # a flat minimum crossing every block
    h[8:rows - 8, 10:cols - 10] = 7.0  # a terrace in it
    h[rows // 2, cols // 2] = 1.0  # a pit in the terrace
    h[0:2, 5:cols - 5] = 4.0  # a flat on the edge: drains out
    h[rows - 12:rows - 4, 4:12] = np.nan  # a nodata hole in the flat minimum
    rng = np.random.default_rng(5)
    noisy = rng.random((rows, cols)) < 0.1
    h[noisy] += (rng.integers(0, 3, noisy.sum()) - 1).astype(np.float32)
    return h


def test_depressions_quadtree_of_one_tile_batches(tmp_path):
    """Batches of one 8 x 8 tile (five quadtree levels above them, blocks spilled and read back):
    basins, pits, spill and merge levels, cells and volumes as the references; the same bytes as
    one block (the whole DEM held) and as 2 x 2 batches of 16 x 16 tiles."""
    from terrain_io.grid.depressions import depressions, read_basins

    cases = ((_flats(96, 136), "edge"), (fill_test_dem("terraced", 91, 131, seed=4), "edge+nodata"),
             (fill_test_dem("nodata-holed", 99, 70, seed=9), "edge+nodata"))
    for i, (h, outlets) in enumerate(cases):
        st = TerrainStore.from_array(tmp_path / f"a{i}.zarr", h, tile=8, shard=8)
        res, got = check_hierarchy(st, outlets, held=False, batch_tiles=1)
        assert res.method == "tiled" and res.batch_tiles == 1
        for tile, kw in ((8, {"held": True}), (16, {"held": False, "batch_tiles": 2})):
            other = TerrainStore.from_array(tmp_path / f"b{i}-{tile}.zarr", h, tile=tile, shard=2)
            again = depressions(other, outlets=outlets, device="cpu", progress=False, **kw)
            assert read_basins(other).tobytes() == got.tobytes()
            _same(again, res)


@NEEDS_PROC
@pytest.mark.slow
def test_depressions_cpu_at_8x_the_budget(tmp_path):
    """2048 x 5120 float32 (40 MiB) under 5 MiB, 64^2 tiles: the tiled pipeline, peak RSS growth
    within the budget (before: refused, the boundary nodes alone ~59 MB), the same bytes as a held
    run with other tiles. (Under 4 MiB, 2048 x 4096 is refused: the quadtree's count, 500 bytes a
    cell of side, was measured as ~730 bytes of everything traced there.) The warm-up: a held run of the big store and a tiled one of a small one
    (the quadtree's kernels)."""
    budget = 5 << 20
    big = _smooth(tmp_path / "big.zarr", 2048, 5120, 64, 4)
    warm = _smooth(tmp_path / "warm.zarr", 300, 300, 64, 4)
    assert big.shape[0] * big.shape[1] * 4 >= 8 * budget
    warm_runs = [{"big": True, "held": True}, {"held": False, "batch_tiles": 1}]
    depressions_within(tmp_path, big, warm, budget, warm_runs)
