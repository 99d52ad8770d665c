"""nvCOMP's zstd on the GPU (:mod:`terrain_io.nvzstd`): the encode's throughput by the number of chunks
given to one batched call -- :func:`terrain_io.pinned.write_bands` gives it one band of shard rows of one
array (1024 chunks of 256^2 at 32768^2) -- on arrays of a store as stored (their first four bands decoded
onto the GPU, so that the data compress as the pipelines' do). Needs a GPU and nvCOMP.

    python benchmarks/probe_gpu_encode.py STORE ARRAY [ARRAY ...]
"""
from __future__ import annotations

import sys
import time

import cupy as cp
import numpy as np

from terrain_io import nvzstd
from terrain_io.pinned import read_device
from terrain_io.store import TerrainStore, shard_layout


def main(path: str, names: list[str]) -> None:
    store = TerrainStore.open(path, mode="r")
    enc = nvzstd.encoder()
    for name in names:
        arr = store.group[name]
        (t0, t1), _, _ = shard_layout(arr)
        rows = min(arr.shards[0] * 4, arr.shape[0]) // t0 * t0
        got = []
        read_device(store, name, 16, each=lambda r0, r1, cells: got.append(cells.copy()) if r0 < rows else None)
        band = cp.concatenate(got)[:rows]
        cols = band.shape[1] // t1 * t1
        chunks = cp.ascontiguousarray(band[:, :cols].reshape(rows // t0, t0, cols // t1, t1).transpose(0, 2, 1, 3))
        chunks = chunks.reshape(-1, t0, t1)
        n, nbytes = chunks.shape[0], t0 * t1 * band.dtype.itemsize
        got.clear()
        del band
        for per in (n // 8, n // 4, n // 2, n):
            best, stored = float("inf"), 0
            for _ in range(2):
                cp.cuda.Device().synchronize()
                t = time.perf_counter()
                stored = sum(int(enc._compress([chunks], [np.arange(a, min(a + per, n))])[0].sum())
                             for a in range(0, n, per))
                cp.cuda.Device().synchronize()
                best = min(best, time.perf_counter() - t)
            print(f"{name} ({arr.dtype}): {per} chunks a call: {n * nbytes / best / 1e9:.2f} GB/s of raw cells, "
                  f"ratio {n * nbytes / stored:.2f}, {best:.3f} s for {n} chunks", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
