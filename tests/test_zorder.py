"""Morton encoding: checked against a bit-by-bit interleaving written independently here."""
import numpy as np
from hypothesis import given, strategies as st

from terrain_io.zorder import morton_decode, morton_encode, morton_order


def interleave(row: int, col: int) -> int:
    key = 0
    for bit in range(32):
        key |= ((row >> bit) & 1) << (2 * bit)
        key |= ((col >> bit) & 1) << (2 * bit + 1)
    return key


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_encode_matches_bit_interleaving_and_decodes(row, col):
    key = morton_encode(row, col)
    assert int(key) == interleave(row, col)
    assert morton_decode(key) == (row, col)


def test_vectorised_round_trip():
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 2**31, 10_000)
    cols = rng.integers(0, 2**31, 10_000)
    r, c = morton_decode(morton_encode(rows, cols))
    assert np.array_equal(r, rows) and np.array_equal(c, cols)


def test_order_is_quadtree_depth_first():
    # 4x4: each 2x2 quadrant is finished before the next (NW, SW, NE, SE: the row bit is the low bit, as in zarr)
    order = [tuple(rc) for rc in morton_order(4, 4)]
    quadrants = [(r // 2, c // 2) for r, c in order]
    assert quadrants == sorted(quadrants, key=lambda q: interleave(*q))
    assert order[:4] == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_order_of_non_square_grid_covers_every_cell_once():
    order = morton_order(5, 3)
    assert len(order) == 15
    assert len({tuple(x) for x in order}) == 15
    keys = [interleave(r, c) for r, c in order]
    assert keys == sorted(keys)
