"""A 4-ary min-heap of (key, item) pairs in two arrays, for the grid kernels (SSSP Dijkstra, fill's
Priority-Flood): shallower than a binary heap, and the four children of a node share a cache line.
Lazy deletion is the caller's: a stale entry is skipped when popped."""
from __future__ import annotations

import numba


@numba.njit(inline="always", cache=True)
def heap_push(hk, hv, n, key, v):
    """Add (key, v) to a heap of n entries (the arrays hold at least n + 1)."""
    i = n
    while i > 0:
        p = (i - 1) >> 2
        if hk[p] <= key:
            break
        hk[i] = hk[p]
        hv[i] = hv[p]
        i = p
    hk[i] = key
    hv[i] = v


@numba.njit(inline="always", cache=True)
def heap_pop(hk, hv, n):
    """Remove the top of a heap of n entries (read it first)."""
    n -= 1
    key = hk[n]
    v = hv[n]
    i = 0
    while True:
        c = 4 * i + 1
        if c >= n:
            break
        m = c
        mk = hk[c]
        for j in range(c + 1, min(c + 4, n)):
            if hk[j] < mk:
                mk = hk[j]
                m = j
        if key <= mk:
            break
        hk[i] = mk
        hv[i] = hv[m]
        i = m
    if n > 0:
        hk[i] = key
        hv[i] = v
