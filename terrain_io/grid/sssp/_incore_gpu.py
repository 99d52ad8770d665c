"""CuPy side of the in-core SSSP engine (terrain_io/kernels/sssp_incore.cu): rounds of tile
relaxation over a work list of active tiles, for the distances (in near-far order:
:class:`~terrain_io.worklist.KeyedWorkLists`) and then the plateau levels, and one pass for the
parent codes. The same bytes as :mod:`._incore_cpu` (see :mod:`.incore`)."""
from __future__ import annotations

import functools

import numpy as np

from ...backend import EXACT_OPTIONS, kernel_source
from ...worklist import TILE, KeyedWorkLists
from .result import NO_PRED


@functools.cache
def _module(value_type: str, kind: int):
    import cupy as cp

    return cp.RawModule(code=kernel_source("sssp_incore.cu"),
                        options=EXACT_OPTIONS + (f"-DVAL={value_type}", f"-DKIND={kind}"))


def solve_block_gpu(vals, kind: int, steps, flat_src, dist, level, warm: bool = False, limit: float = np.inf,
                    pred=None, changed=None, parallel=None):
    """:func:`.incore.solve_block` on the GPU: ``vals``/``dist``/``level`` NumPy or CuPy arrays of
    the ringed block's shape; returns CuPy (dist, level, pred) (CuPy ``dist``/``level`` of the
    right types are solved in place). ``pred``, ``changed``, ``parallel``: the CPU's options (its
    partial warm re-solve, its threads), not used here. ``warm``: the interior of ``dist`` holds the solution for
    an earlier ring that has only fallen since -- an upper bound on the new fixpoint, so the
    rounds start from the tiles next to the ring only and follow where it improves."""
    import cupy as cp

    vals = cp.asarray(vals)
    if vals.dtype not in (cp.float32, cp.float64):
        vals = vals.astype(cp.float64)
    H2, W2 = vals.shape
    h, w = H2 - 2, W2 - 2
    mod = _module("float" if vals.dtype == cp.float32 else "double", int(kind))
    d = cp.asarray(dist, dtype=cp.float64)
    if not warm:
        d[1:-1, 1:-1] = cp.inf
    lv = cp.asarray(level, dtype=cp.int32)
    src = cp.asarray(np.asarray(flat_src, np.int64))
    d.reshape(-1)[src] = 0.0
    st = cp.asarray(np.asarray(steps, np.float64))
    ntr, ntc = -(-h // TILE), -(-w // TILE)
    lists = KeyedWorkLists(ntr * ntc)
    if warm:  # the tiles of the block's edge: only a ring cell's fall starts a change
        t = cp.arange(ntr * ntc, dtype=cp.int32)
        tr, tc = t // ntc, t % ntc
        first = t[(tr == 0) | (tr == ntr - 1) | (tc == 0) | (tc == ntc - 1)]
    elif bool(cp.isfinite(d[0]).any() or cp.isfinite(d[-1]).any() or cp.isfinite(d[:, 0]).any()
              or cp.isfinite(d[:, -1]).any()):  # seeded by the ring
        first = cp.arange(ntr * ntc, dtype=cp.int32)
    else:
        rows, cols = src // W2 - 1, src % W2 - 1
        first = cp.unique((rows // TILE) * ntc + cols // TILE).astype(cp.int32)
    args = (vals, d, np.int32(h), np.int32(w), st, np.float64(limit))
    rounds = lists.run_near_far(mod.get_function("relax_distances"), args, first)
    solve_block_gpu.visits, solve_block_gpu.passed = lists.visits, lists.passed
    threads = 256
    blocks = min(-(-h * w // threads), 65536)
    mod.get_function("initial_levels")((blocks,), (threads,), (vals, d, lv, np.int32(h), np.int32(w), st))
    lv.reshape(-1)[src] = 0
    lists.run(mod.get_function("relax_levels"), (vals, d, lv, np.int32(h), np.int32(w), st),
              cp.arange(ntr * ntc, dtype=cp.int32))
    pred = cp.empty((h, w), cp.uint8)
    mod.get_function("parent_codes")((blocks,), (threads,), (vals, d, lv, pred, np.int32(h), np.int32(w), st))
    rr, cc = src // W2 - 1, src % W2 - 1
    pred[rr, cc] = NO_PRED
    solve_block_gpu.rounds = rounds
    return d, lv, pred
