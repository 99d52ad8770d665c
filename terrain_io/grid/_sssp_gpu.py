"""CuPy side of the grid SSSP pipeline: phase 1 (the boundary index G') on the GPU.

The kernel (terrain_io/kernels/sssp.cu) runs one thread block per cluster and one thread per
boundary cell; its output has the layout of :func:`terrain_io.grid._sssp_cpu.boundary_phase`, so
the merge and final phases do not care which device built the index.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

MAX_CLUSTER = 16  # done flags of 256 cells per thread


@functools.cache
def _kernel():
    import cupy as cp

    src = (Path(__file__).resolve().parents[1] / "kernels" / "sssp.cu").read_text()
    return cp.RawKernel(src, "sssp_boundary_phase", options=("--std=c++17", "--fmad=false"))  # no FMA: the CPU's rounding


def boundary_phase_gpu(vals: np.ndarray, c: int, kind: int, steps: np.ndarray):
    """G' blocks (float32, (mr, mc, B, B)) and boundary values ((mr, mc, B)) of every cluster of ``vals``."""
    import cupy as cp

    if c > MAX_CLUSTER:
        raise ValueError(f"the GPU boundary kernel takes clusters up to {MAX_CLUSTER}, got {c}")
    H, W = vals.shape
    mr, mc = -(-H // c), -(-W // c)
    B = 4 * c - 4
    threads = 32 * -(-B // 32)
    shared = (c * c + c * c * threads) * 8
    k = _kernel()
    if shared > 48 * 1024:
        k.max_dynamic_shared_size_bytes = shared
    d_vals = cp.asarray(np.ascontiguousarray(vals, dtype=np.float64))
    out_d = cp.full((mr, mc, B, B), np.inf, dtype=cp.float32)
    out_v = cp.full((mr, mc, B), np.nan, dtype=cp.float64)
    k((mr * mc,), (threads,), (d_vals, np.int32(H), np.int32(W), np.int32(c), np.int32(kind),
                               cp.asarray(steps, dtype=cp.float64), out_d, out_v, np.int32(mc)),
      shared_mem=shared)
    return out_d, out_v
