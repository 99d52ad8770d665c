"""Helpers shared by the benchmark scripts: timing on the GPU (CUDA events) and the CPU (wall and CPU time), warm-up sizes,
the SSSP benchmarks' cost raster, saving the rows, the options and work folder of the DEM benchmarks,
a measurement in a fresh process, a DEM written as a GeoTIFF for the peers."""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench_parser(*, sizes: list[int] | None = None, memory: bool = False, peers: bool = False,
                 tile: bool = False) -> argparse.ArgumentParser:
    """The options the DEM benchmarks share: ``--workdir`` (default: a fresh temporary folder) and
    ``--json``; ``--sizes`` with these defaults, ``--tile``, ``--memory`` and ``--no-peers`` where asked."""
    ap = argparse.ArgumentParser()
    if sizes is not None:
        ap.add_argument("--sizes", type=int, nargs="+", default=sizes)
    if tile:
        ap.add_argument("--tile", type=int, default=256)
    if memory:
        ap.add_argument("--memory", default=None, help="our budget (default: half the free RAM)")
    if peers:
        ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    return ap


def work_folder(args: argparse.Namespace, name: str) -> Path:
    """``--workdir``, or a fresh temporary folder ``bench-NAME-...``; created."""
    work = Path(args.workdir or tempfile.mkdtemp(prefix=f"bench-{name}-"))
    work.mkdir(parents=True, exist_ok=True)
    return work


def header(what: str) -> None:
    """A benchmark's first line: what runs, on how many cores, and the date."""
    print(f"{what}, {os.cpu_count()} CPU cores, {time.strftime('%Y-%m-%d')}", flush=True)


def synthetic_dem(work: Path, n: int, tile: int = 256):
    """The benchmarks' n x n synthetic DEM (seed 1, 10 m cells) as ``work/demN.zarr``."""
    from terrain_io.synth import synthesize

    return synthesize(work / f"dem{n}.zarr", n, seed=1, cell_size=10.0, tile=tile, overwrite=True)


def child_env() -> dict:
    """The environment of a measured child process: this checkout first on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def run_child(what: str, *args: str) -> dict:
    """``python ARGS`` in a fresh process (one measurement, its own peak RSS); its last line of output
    as JSON. Raises RuntimeError with the end of its stderr when it fails."""
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=child_env(), check=False)
    if p.returncode:
        raise RuntimeError(f"{what} failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def write_geotiff(path, values, cell: float = 10.0) -> None:
    """``values`` (float32, nodata -9999) as a GeoTIFF in UTM 33N with square cells of ``cell`` metres
    and its top-left corner at (0, rows * cell): the synthetic DEMs as the peers read them."""
    import rasterio

    rows, cols = values.shape
    with rasterio.open(path, "w", driver="GTiff", width=cols, height=rows, count=1, dtype="float32",
                       nodata=-9999.0, crs="EPSG:32633",
                       transform=rasterio.transform.from_origin(0, rows * cell, cell, cell)) as ds:
        ds.write(values, 1)


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


def cpu_seconds() -> float:
    """This process's CPU time so far (user + sys), s: less distorted by a busy machine than the wall."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn):
    """(``fn()``, its wall seconds, its CPU seconds in this process)."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    out = fn()
    return out, time.perf_counter() - wall, cpu_seconds() - cpu


def cpu_median(fn, reps: int = 3) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def print_table(rows: list, columns: list) -> None:
    """``rows`` (dicts) under a header line, one column per ``(title, spec, value)``: the value a row's
    key or a function of the row, written with the format ``spec``; the title right-aligned to the
    width the spec begins with (``">9.3f"``: 9)."""
    widths = [int("".join(ch for ch in spec.lstrip("<>^").split(".")[0] if ch.isdigit()) or 0) for _, spec, _ in columns]
    print(" ".join(f"{title:>{w}}" if w else title for (title, _, _), w in zip(columns, widths)))
    for r in rows:
        print(" ".join(format(value(r) if callable(value) else r.get(value, float("nan")), spec)
                       for _, spec, value in columns))


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
