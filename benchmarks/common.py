"""Helpers shared by the benchmark scripts: timing on the GPU (CUDA events) and the CPU, warm-up sizes."""
from __future__ import annotations

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
