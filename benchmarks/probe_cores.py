"""How the SSSP phase-1 kernel alone scales over processes on this host: no Dask, no store, no I/O.

P processes (P = 1, 2, 4, 8, 16; numba on one thread each) compute the G' blocks of the same random
256^2 tile over and over; prints the time per tile and T1 / TP. It is the ceiling for the parallel
efficiency of the index tasks in ``bench_scaling.py``: what the cores themselves give (clock, caches,
memory) when more of them run this SIMD-heavy kernel at once.

    python benchmarks/probe_cores.py
"""
import os

os.environ["NUMBA_NUM_THREADS"] = "1"

import multiprocessing as mp  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402

import numpy as np  # noqa: E402

from terrain_io.grid.sssp import _pipeline_cpu as K  # noqa: E402
from terrain_io.weights import steps_of  # noqa: E402

TILE, CLUSTER, TILES = 256, 8, 16


def _tile(vals, steps):
    m, B = TILE // CLUSTER, 4 * CLUSTER - 4
    d = np.full((m, m, B, B), np.inf, np.float32)
    v = np.full((m, m, B), np.nan)
    K.boundary_phase(vals, CLUSTER, 1, steps, d, v)


def _work(n: int) -> float:
    """Seconds for n tiles after one untimed (compile / cache load)."""
    rng = np.random.default_rng(1)
    vals = np.cumsum(np.cumsum(rng.standard_normal((TILE, TILE)), 0), 1)
    steps = steps_of(1.0, 1.0)
    _tile(vals, steps)
    t = time.perf_counter()
    for _ in range(n):
        _tile(vals, steps)
    return time.perf_counter() - t


def main():
    print(f"# {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}: SSSP phase-1 kernel, {TILE}^2 tile, "
          f"clusters {CLUSTER}^2, {TILES} tiles per process")
    base = None
    for p in (1, 2, 4, 8, 16):
        with ProcessPoolExecutor(p, mp_context=mp.get_context("spawn")) as ex:
            per = max(ex.map(_work, [TILES] * p)) / TILES
        base = base or per
        print(f"{p:>3} processes: {per * 1e3:6.1f} ms a tile, efficiency {base / per:.0%}", flush=True)


if __name__ == "__main__":
    main()
