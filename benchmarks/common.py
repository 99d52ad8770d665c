"""Helpers shared by the benchmark scripts: timing on the GPU (CUDA events) and the CPU, warm-up sizes,
the SSSP benchmarks' cost raster, saving the rows."""
from __future__ import annotations

import json
import math
import statistics
import time


def warm_side(n: int) -> int:
    """Side of a warm-up DEM that makes numba compile (or load) the builds an n x n run uses: the
    serial twins below ``jit.SERIAL_BELOW`` cells, the parallel builds from there on. Warming on a
    small DEM only and timing a large one had put the parallel builds' compilation in the timings."""
    from terrain_io.jit import SERIAL_BELOW

    return 300 if n * n < SERIAL_BELOW else math.isqrt(SERIAL_BELOW)


def parse_count(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * mult[text[-1]]) if text[-1] in mult else int(text)


def gpu_median(fn, reps: int = 5) -> float:
    """Median milliseconds of ``fn()`` timed with CUDA events after one warm-up call."""
    import cupy

    fn()
    cupy.cuda.Device().synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def cpu_median(fn, reps: int = 3) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def save_rows(rows: list, path: str | None) -> list:
    """Write the benchmark's rows as JSON to ``path`` (nothing without one); returns them."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def with_cost_raster(st):
    """``st`` with the cell model's cost raster ``cost/c``: 1 + |dh| to the east neighbour / 10, per shard."""
    import numpy as np

    from terrain_io.store import TerrainStore

    with st.write_result("cost", attrs={"what": "1 + |dh east| / 10"}) as w:
        arr = w.create_array("c", "float32", float("nan"))
        for win in st.shards():
            z = st.read(win, halo=1).astype(np.float64)
            c = 1.0 + np.abs(z[1:-1, 2:] - z[1:-1, 1:-1]) / 10.0
            c[~np.isfinite(c)] = 1.0
            arr[win.slices] = c.astype(np.float32)
    return TerrainStore.open(st.path)


class PeakGpu:
    """Peak bytes held in CuPy's memory pool while installed (a CuPy memory hook)."""

    def __init__(self):
        import cupy

        class Hook(cupy.cuda.MemoryHook):
            name = "peak"

            def __init__(self):
                self.now = self.peak = 0

            def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
                self.now += mem_size
                self.peak = max(self.peak, self.now)

            def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
                self.now -= mem_size

        self.hook = Hook()

    def __enter__(self):
        self.hook.__enter__()
        return self.hook

    def __exit__(self, *exc):
        self.hook.__exit__(*exc)
