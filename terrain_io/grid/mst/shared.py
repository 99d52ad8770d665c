"""What the grid MST's backends (numba kernels in :mod:`._cpu`, CUDA in :mod:`._gpu`) and its pipeline
share: the exact weight sums' buckets, the tile phase's graphs, and how a tile's forest is found. Apart
from the numba kernels so that the GPU's route imports no numba (~0.3-0.6 s of a command's start)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Exact sums: w = mant * 2**(e - 53) with |mant| < 2**53, split into two int64 buckets per e.
EXP_OFFSET = 1100
N_EXP = 2200
LO_BITS = 26


def exact_total(buckets: np.ndarray):
    """The exact sum held by ``buckets`` as a ``fractions.Fraction``."""
    from fractions import Fraction

    total = Fraction(0)
    for idx in np.flatnonzero(buckets[0] | buckets[1]):
        mant = (int(buckets[0, idx]) << LO_BITS) + int(buckets[1, idx])
        total += Fraction(mant) * Fraction(2) ** (int(idx) - EXP_OFFSET - 53)
    return total


class TileGraphs(NamedTuple):
    """The tile phase's result for a batch of n tiles, as the merges read it: per tile a row of ``cap``
    entries of its contracted graph, ``nv`` vertices (cell id ``vid``, value ``vh``, boundary mask
    ``vmask``) and ``ne`` super-edges (``eu`` -> ``ev``, weight ``ew``, edge code ``ecode``), and
    ``buckets`` (2, N_EXP), the exact weight sum of the batch's forests."""

    nv: np.ndarray
    vid: np.ndarray
    vh: np.ndarray
    vmask: np.ndarray
    ne: np.ndarray
    eu: np.ndarray
    ev: np.ndarray
    ew: np.ndarray
    ecode: np.ndarray
    buckets: np.ndarray


FOREST_GIVEN = 0  # the GPU computed the forests into ``bits``
FOREST_EDGES = 1  # Kruskal sorting edges (any weight model)
FOREST_CELLS = 2  # Kruskal sorting cells (model ``max``, elevations of at most 32 bits)


def cells_sortable(dtype) -> bool:
    """Elevations that the CPU's order keys (``_cpu._order_key``) map to uint32 in order (FOREST_CELLS possible)."""
    dtype = np.dtype(dtype)
    return dtype == np.float32 or (dtype.kind == "i" and dtype.itemsize <= 4) or (
        dtype.kind == "u" and dtype.itemsize <= 2)
