"""CuPy side of the grid SSSP pipeline: phases 1 and 3 on the GPU (terrain_io/kernels/sssp_pipeline.cu).

Phase 1 (the boundary index G') runs one thread block per cluster and one thread per boundary
cell; its output has the layout of :func:`terrain_io.grid.sssp._pipeline_cpu.boundary_phase`, bit for bit,
so the merge does not care which device built the index. Phase 3 runs one thread per cluster, the
exact port of :func:`terrain_io.grid.sssp._pipeline_cpu.final_phase` (same heap, same order): the same
distances and predecessor codes as the CPU.
"""
from __future__ import annotations

import functools

import numpy as np

from ...backend import EXACT_OPTIONS, kernel_source

MAX_CLUSTER = 16  # phase 1: done flags of 256 cells per thread; phase 3: arrays of 256 cells per thread


@functools.cache
def _kernel():
    import cupy as cp

    return cp.RawKernel(kernel_source("sssp_pipeline.cu"), "sssp_boundary_phase", options=EXACT_OPTIONS)


@functools.cache
def _final_kernel(c: int):
    """Phase 3's kernel for clusters of at most c x c cells (its arrays are sized at compile time)."""
    import cupy as cp

    return cp.RawModule(code=kernel_source("sssp_pipeline.cu"), options=EXACT_OPTIONS + (f"-DFINAL_CLUSTER={c}",)).get_function(
        "sssp_final_phase")


def final_phase_gpu(vals: np.ndarray, c: int, kind: int, steps: np.ndarray, m_dist, m_rank, m_how, m_set,
                    src_r, src_c):
    """Distances (float32) and predecessor codes (uint8) of every cell of ``vals`` (a shard, origin
    on the cluster grid) from the merge's results ``m_*`` (cluster rows, cluster cols, B) and the
    sources (shard coordinates): :func:`terrain_io.grid.sssp._pipeline_cpu.final_phase` on the GPU."""
    import cupy as cp

    if c > MAX_CLUSTER:
        raise ValueError(f"the GPU final phase takes clusters up to {MAX_CLUSTER}, got {c}")
    H, W = vals.shape
    nclusters = -(-H // c) * -(-W // c)
    out_d = cp.empty((H, W), cp.float32)
    out_p = cp.empty((H, W), cp.uint8)
    args = [cp.asarray(np.ascontiguousarray(vals, dtype=np.float64)), np.int32(H), np.int32(W), np.int32(c),
            np.int32(kind), cp.asarray(steps, dtype=cp.float64)]
    args += [cp.asarray(np.ascontiguousarray(a)) for a in (m_dist, m_rank, m_how, m_set)]
    args += [np.int32(m_dist.shape[1]), np.int32(m_dist.shape[2]), cp.asarray(np.asarray(src_r, np.int64)),
             cp.asarray(np.asarray(src_c, np.int64)), np.int32(len(src_r)), out_d, out_p]
    threads = 64  # the heap (~12 KB a thread for 8 x 8 clusters) lives in local memory
    _final_kernel(c)((-(-nclusters // threads),), (threads,), tuple(args))
    return out_d.get(), out_p.get()


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


def boundary_shard_gpu(vals, win, t: int, c: int, kind: int, steps, sink, bar=None) -> None:
    """Phase 1 for one shard in one launch; its blocks of clusters go to ``sink`` as in
    :func:`.index._boundary_shard`."""
    out_d, out_v = boundary_phase_gpu(vals, c, kind, steps)
    out_d, out_v = out_d.get(), out_v.get()
    m = t // c  # one row of index chunks at a time: the sink's writer threads share the shard
    for i in range(0, out_d.shape[0], m):
        sink(win.r0 // c + i, win.c0 // c, out_d[i : i + m], out_v[i : i + m])
    if bar is not None:
        bar.update(-(-win.shape[0] // t) * -(-win.shape[1] // t))
