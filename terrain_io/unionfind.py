"""Disjoint-set forests (union-find) for the numba kernels: one home for both layouts in use.

- :func:`find`: roots point to themselves (``parent[x] == x``); the caller decides how roots
  join (components and fill hang the larger id under the smaller, so the root of a set is its
  least member; graph Kruskal by size in an array of its own).
- :func:`find_sized` / :func:`union_sized`: roots hold ``-(their set's size)``, union by size
  (the grid MST's tile forests: one array for parents and sizes).

Both compress by path halving (every node on the walk to the root is pointed at its grandparent):
R. E. Tarjan, J. van Leeuwen, "Worst-case analysis of set union algorithms", J. ACM 31(2):245-281,
1984, doi:10.1145/62.2160.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(inline="always", cache=True)
def find(parent, x):
    """The root of ``x`` (``parent[root] == root``), halving the path on the way."""
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


@numba.njit(cache=True)
def find_sized(parent, x):
    """The root of ``x`` in a union-find whose roots hold -(their size); path halving."""
    while parent[x] >= 0:
        p = np.int64(parent[x])
        gp = parent[p]
        if gp < 0:
            return p
        parent[x] = gp
        x = np.int64(gp)
    return x


@numba.njit(cache=True)
def union_sized(parent, ra, rb):
    """Join roots ``ra`` != ``rb`` of a :func:`find_sized` forest, the smaller tree under the larger
    (which hangs under which decides no edge); returns (the new root, the other)."""
    if parent[ra] > parent[rb]:
        ra, rb = rb, ra
    parent[ra] += parent[rb]
    parent[rb] = ra
    return ra, rb
