"""Stable LSD radix sorts (8-bit digits, counting passes) for the grid kernels: one home.

The grid kernels sort with these instead of numba's ``np.sort`` / ``np.argsort``: those are generic
quick- and mergesorts whose compilation costs seconds, paid again in every kernel that inlines them
(the first run of a command compiles everything it calls, see :mod:`terrain_io.jit`). A radix sort
is a few loops, and on the keys the kernels sort (cell ids, edge codes, small levels, order-preserving
images of floats) it is also fast: a digit that is equal for every key is skipped.
"""
from __future__ import annotations

import numba
import numpy as np

from .._weights_cpu import float64_bits


@numba.njit(inline="always", cache=True)
def exclusive_scan(count):
    """count[d] <- the sum of count[:d] (a radix pass's start of each digit's run), in place."""
    total = 0
    for d in range(count.shape[0]):
        c = count[d]
        count[d] = total
        total += c


@numba.njit(inline="always", cache=True)
def _one_digit(count, m):
    """Whether all ``m`` keys have the same digit (a pass that would move nothing)."""
    for d in range(count.shape[0]):
        if count[d] == m:
            return True
    return False


@numba.njit(cache=True)
def radix_sort32_in(keys, vals, k2, v2):
    """Stable sort of uint32 ``keys`` carrying ``vals`` along, with scratch arrays ``k2``, ``v2`` of
    the inputs' sizes (callers that sort tile after tile reuse them instead of faulting in fresh
    pages); returns the sorted (keys, vals): views of either pair. (No wrapper that allocates the
    scratch: each caller's ``np.empty_like`` is cheaper than one more kernel to compile.)"""
    m = keys.shape[0]
    count = np.empty(256, dtype=np.int64)
    for shift in range(0, 32, 8):
        count[:] = 0
        for x in range(m):
            count[(keys[x] >> shift) & 0xFF] += 1
        if _one_digit(count, m):
            continue
        exclusive_scan(count)
        for x in range(m):
            d = (keys[x] >> shift) & 0xFF
            k2[count[d]] = keys[x]
            v2[count[d]] = vals[x]
            count[d] += 1
        keys, k2 = k2, keys
        vals, v2 = v2, vals
    return keys, vals


@numba.njit(cache=True)
def radix_argsort(keys, idx, tmp):
    """Stable sort of the indices ``idx`` (int64) by ``keys[idx]`` (uint64), ``tmp`` scratch of
    ``idx``'s size. Returns (sorted indices, scratch): either array may be ``idx``."""
    m = idx.shape[0]
    count = np.empty(256, dtype=np.int64)
    for shift in range(0, 64, 8):
        count[:] = 0
        for x in range(m):
            count[(keys[idx[x]] >> np.uint64(shift)) & np.uint64(0xFF)] += 1
        if _one_digit(count, m):
            continue
        exclusive_scan(count)
        for x in range(m):
            d = (keys[idx[x]] >> np.uint64(shift)) & np.uint64(0xFF)
            tmp[count[d]] = idx[x]
            count[d] += 1
        idx, tmp = tmp, idx
    return idx, tmp


@numba.njit(cache=True, nogil=True)
def argsort_int(a):
    """``np.argsort(a, kind="stable")`` of an int64 array (keys shifted by 2**63 to unsigned order)."""
    m = a.shape[0]
    keys = np.empty(m, dtype=np.uint64)
    idx = np.empty(m, dtype=np.int64)
    for x in range(m):
        keys[x] = np.uint64(a[x]) ^ (np.uint64(1) << np.uint64(63))
        idx[x] = x
    idx, _ = radix_argsort(keys, idx, np.empty(m, dtype=np.int64))
    return idx


@numba.njit(cache=True)
def argsort_float(a):
    """``np.argsort(a, kind="stable")`` of a float array without NaN: the IEEE bits mapped to
    unsigned order (negative: all bits flipped; else the sign bit set), -0.0 taken as +0.0."""
    m = a.shape[0]
    keys = np.empty(m, dtype=np.uint64)
    idx = np.empty(m, dtype=np.int64)
    for x in range(m):
        bits = np.uint64(float64_bits(np.float64(a[x]) + 0.0))
        keys[x] = ~bits if bits >> np.uint64(63) else bits | (np.uint64(1) << np.uint64(63))
        idx[x] = x
    idx, _ = radix_argsort(keys, idx, np.empty(m, dtype=np.int64))
    return idx
