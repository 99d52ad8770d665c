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
def heap_replace(hk, hv, n, key, v):
    """Put (key, v) in the top slot of a heap of n entries whose top is free (read and done with) and
    sift it down: a pop followed by a push for the price of one sift."""
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
    hk[i] = key
    hv[i] = v


@numba.njit(inline="always", cache=True)
def heap_pop(hk, hv, n):
    """Remove the top of a heap of n entries (read it first)."""
    n -= 1
    if n > 0:
        heap_replace(hk, hv, n, hk[n], hv[n])
