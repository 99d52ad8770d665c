"""numba kernels of the allocation (:mod:`.allocation`, which holds the algorithm and its sources):
following predecessor chains inside a block, and resolving the frames' chains between blocks. A
module of their own so that the GPU's route (pointer jumping in CuPy) imports no numba."""
from __future__ import annotations

import numba
import numpy as np

from ...weights import DC, DR
from .result import NO_PRED


@numba.njit(cache=True)
def chase(pred, src_label, r0, c0, H, W, out):
    """Root of every cell's chain inside a block: ``out[i, j]`` = -1 - label at a source (label 0:
    unreached), else the global id (row * W + col) of the first cell outside the block that the
    chain steps to. ``pred``: the block's codes; ``src_label``: the block's source labels (0 none)."""
    h, w = pred.shape
    done = np.zeros((h, w), np.bool_)
    stack = np.empty(h * w, np.int64)
    for i0 in range(h):
        for j0 in range(w):
            if done[i0, j0]:
                continue
            m = 0
            i, j = i0, j0
            root = np.int64(-1)
            while True:
                if done[i, j]:
                    root = out[i, j]
                    break
                stack[m] = i * w + j
                m += 1
                p = pred[i, j]
                if p == NO_PRED:
                    root = -1 - np.int64(src_label[i, j])
                    break
                ii, jj = i + DR[p], j + DC[p]
                if ii < 0 or ii >= h or jj < 0 or jj >= w:
                    root = (r0 + ii) * np.int64(W) + c0 + jj
                    break
                i, j = ii, jj
            for t in range(m):
                q = stack[t]
                out[q // w, q - (q // w) * w] = root
                done[q // w, q - (q // w) * w] = True


@numba.njit(cache=True)
def resolve_frames(ids, values):
    """Labels of the frame cells (sorted global ``ids``) whose chain roots are ``values``: a label
    (negative, as :func:`chase` encodes it) or the id of another frame cell, followed to its label."""
    n = ids.size
    out = np.full(n, -1, np.int64)  # -1: not resolved yet
    stack = np.empty(n, np.int64)
    for s in range(n):
        m = 0
        q = s
        while out[q] < 0:
            v = values[q]
            if v < 0:
                out[q] = -1 - v
                break
            stack[m] = q
            m += 1
            q = np.searchsorted(ids, v)
        lab = out[q]
        for t in range(m):
            out[stack[t]] = lab
    return out.astype(np.uint32)
