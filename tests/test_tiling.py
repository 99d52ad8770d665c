"""The tiled plan and its budget planner (terrain_io/grid/tiling.py), against brute force."""
from __future__ import annotations

import numpy as np
import pytest

from terrain_io.errors import InputError
from terrain_io.grid.tiling import check_side, plan, plan_batches, whole_side
from terrain_io.store import TerrainStore


def _morton(r: int, c: int) -> int:
    """Bit interleaving by its definition: row bits at even positions, column bits at odd ones."""
    return sum(((r >> b) & 1) << (2 * b) | ((c >> b) & 1) << (2 * b + 1) for b in range(32))


@pytest.mark.parametrize("shape", [(100, 70), (64, 64), (9, 130)])
@pytest.mark.parametrize("side", [1, 2, 4])
def test_batches_cover_every_tile_once_in_morton_order(tmp_path, shape, side):
    st = TerrainStore.from_array(tmp_path / "a.zarr", np.zeros(shape, np.float32), tile=8, shard=4)
    ntr, ntc = -(-shape[0] // 8), -(-shape[1] // 8)
    want = sorted(((r, c) for r in range(ntr) for c in range(ntc)), key=lambda t: _morton(*t))
    got = []
    for b in plan_batches(st, side):
        assert b.window.r1 - b.window.r0 <= side * 8 and b.window.c1 - b.window.c0 <= side * 8
        for code, (i0, j0, h, w) in zip(b.codes, b.tiles):
            r, c = (b.window.r0 + i0) // 8, (b.window.c0 + j0) // 8
            assert code == _morton(r, c) and (b.window.r0 + i0) % 8 == 0 and (b.window.c0 + j0) % 8 == 0
            assert h == min(8, shape[0] - r * 8) and w == min(8, shape[1] - c * 8)
            assert b.window.r0 + i0 + h <= b.window.r1 and b.window.c0 + j0 + w <= b.window.c1
            got.append((r, c))
        assert len({_morton(r, c) >> (2 * int(np.log2(side))) for r, c in got[-len(b.codes):]}) == 1
    assert got == want
    assert len(plan_batches(st, whole_side(st))) == 1


def test_planner_takes_the_largest_side_that_fits(tmp_path):
    st = TerrainStore.from_array(tmp_path / "a.zarr", np.zeros((100, 70), np.float32), tile=8, shard=4)
    need = lambda k: 1000 + 10 * k * k
    for budget in (1010, 1039, 1040, 1159, 1160, 10**6):
        got = plan(st, budget, "x", need)
        assert got.side == max(k for k in (1, 2, 4) if need(k) <= budget) and got.bytes == need(got.side)
        assert not got.held
    assert plan(st, 5000, "x", need, held_need=5000).held and plan(st, 4999, "x", need, held_need=5000).side == 4
    with pytest.raises(InputError, match=r"memory budget .* too small for this store: x needs at least 1010 B"):
        plan(st, 1009, "x", need)
    with pytest.raises(InputError, match="power of two"):
        check_side(st, 3)
