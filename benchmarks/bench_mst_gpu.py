"""Grid MST at scale, end to end from the store: phase times, Mcells/s, ratio to one read pass, peak RSS.

For each size: a synthetic DEM store (``terrain_io.synth``, tile 256, shard 8; made if missing), one
pass that reads and decodes every shard (one thread, and all cores in parallel threads: the floor for
any pipeline that reads the DEM), then ``terrain_io.grid.mst`` per device, each in a fresh process
(peak RSS = VmHWM; JIT/kernel compilation done first on a small store and excluded), and a check
that all devices wrote the identical ``mst/edges`` (blake2b) with the same exact weight. ``--kernels``
adds the tile kernel time per 256^2 tile (GPU Boruvka on a batch of 64 tiles, CUDA events; CPU
Kruskal + contraction on one core; Gerritsen 2012, Table 3.7: 81 ms GPU, 184 ms CPU) and the
contraction of one batch (GPU kernel vs numba on all cores).

    python benchmarks/bench_mst_gpu.py --sizes 16384 32768 [--devices gpu cpu] [--memory 8GB]
    python benchmarks/bench_mst_gpu.py --sizes 65536 --devices gpu --memory 8GB
    python benchmarks/bench_mst_gpu.py --sizes 4096 8192 --devices cpu        (no GPU)
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
from common import warm_side  # benchmarks/ is on sys.path when run as a script

from terrain_io.grid.mst import _cpu as K
from terrain_io.grid.mst.shared import FOREST_GIVEN, N_EXP
from terrain_io.store import TerrainStore, Window
from terrain_io.synth import synthesize
from terrain_io.weights import get as weight_model


def read_pass(store: TerrainStore, threads: int = 1) -> float:
    """Seconds to read and decode every shard of ``elevation`` once (``threads`` shards at a time)."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(lambda win: store.read(win).shape, store.shards()):
            pass
    return time.perf_counter() - t0


def edges_digest(store: TerrainStore) -> str:
    h = hashlib.blake2b(digest_size=16)
    for win in store.shards():
        h.update(np.ascontiguousarray(store.read(win, "mst/edges")).tobytes())
    return h.hexdigest()


def tile_kernel_times(store: TerrainStore, tile: int = 256, repeats: int = 5) -> dict:
    """ms per tile: GPU Boruvka over a 2048^2 batch (64 tiles); CPU Kruskal with its contraction, 1 core."""
    from terrain_io.grid.mst._gpu import GpuTileForest

    win = Window(0, min(8 * tile, store.shape[0]), 0, min(8 * tile, store.shape[1]))
    values = store.read(win)
    valid = store.valid(values)
    ntiles = (win.r1 // tile) * (win.c1 // tile)
    gpu = GpuTileForest(tile, weight_model("max"), values.dtype)
    gpu.forest(values, valid)  # compile, allocate
    times = []
    for _ in range(repeats):
        before = gpu.kernel_seconds
        gpu.forest(values, valid)
        times.append(gpu.kernel_seconds - before)
    gpu_ms = float(np.median(times)) / ntiles * 1e3
    v, ok = values[:tile, :tile], valid[:tile, :tile]
    hk, float_bits = K.key_source(v)
    cap = 8 * tile + 8
    rows, cols = store.shape

    def cpu_once():  # the fused Kruskal + contraction of the max model
        t0 = time.perf_counter()
        K.tile_forest_max(v, hk, float_bits, ok, 0, 0, tile, tile, tile, tile, 0, 0, rows, cols,
                          np.zeros((tile, tile), np.uint8), np.empty(cap, np.int64), np.empty(cap),
                          np.empty(cap, np.uint8), np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap),
                          np.empty(cap, np.int64), np.zeros((2, N_EXP), np.int64), work)
        return time.perf_counter() - t0

    work = tuple(a[0] for a in K.max_tile_work(1, tile))

    cpu_once()
    runs = [cpu_once() for _ in range(repeats)]
    return {"gpu_ms_per_tile": gpu_ms, "gpu_batch_tiles": ntiles,
            "cpu_forest_and_contract_ms_per_tile": float(np.median(runs)) * 1e3}


def contract_times(store: TerrainStore, tile: int = 256, repeats: int = 5) -> dict:
    """One 2048^2 batch (64 tiles), forests given: GPU contraction kernel (CUDA events) vs the numba
    contraction (``tile_phase_batch`` with the forests given) on all cores, wall time; medians."""
    from terrain_io.grid.mst._gpu import GpuTileForest

    win = Window(0, min(8 * tile, store.shape[0]), 0, min(8 * tile, store.shape[1]))
    values = store.read(win)
    valid = store.valid(values)
    rows, cols = store.shape
    tiles = np.array([(i, j, min(tile, win.r1 - i), min(tile, win.c1 - j)) for i in range(0, win.r1, tile)
                      for j in range(0, win.c1, tile)], dtype=np.int64)
    cap = 8 * tile + 8
    gpu = GpuTileForest(tile, weight_model("max"), values.dtype)
    bits = gpu.forest(values, valid)
    gpu.contract(values, valid, bits, tiles, 0, 0, rows, cols, cap)  # compile, allocate
    times = []
    for _ in range(repeats):
        before = gpu.contract_seconds
        out_g = gpu.contract(values, valid, bits, tiles, 0, 0, rows, cols, cap)
        times.append(gpu.contract_seconds - before)
    hk, float_bits = K.key_source(values)
    cpu_times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        out_c = K.tile_phase_batch(values, valid, hk, float_bits, bits, tiles, 0, 0, rows, cols, 0, cap,
                                   FOREST_GIVEN)
        cpu_times.append(time.perf_counter() - t0)
    same = all(np.array_equal(a, b) for a, b in zip(out_g[:1] + out_g[4:5], out_c[:1] + out_c[4:5])) and all(
        np.array_equal(out_g[x][t, :out_c[0 if x < 4 else 4][t]], out_c[x][t, :out_c[0 if x < 4 else 4][t]])
        for x in (1, 2, 3, 5, 6, 7, 8) for t in range(len(tiles))) and np.array_equal(out_g[9], out_c[9])
    return {"tiles": len(tiles), "gpu_ms_per_batch": float(np.median(times)) * 1e3,
            "cpu_all_cores_ms_per_batch": float(np.median(cpu_times[1:])) * 1e3, "identical": bool(same),
            "vertices": int(out_c[0].sum()), "super_edges": int(out_c[4].sum())}


_RUN = textwrap.dedent("""
    import json, sys, time
    from terrain_io.grid.mst import mst
    from terrain_io.store import TerrainStore

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    path, warm, device, memory = sys.argv[1:5]
    memory = None if memory == "-" else memory
    for k in (None, 2):  # JIT / kernel compilation (2 x 2 batches: the warm store has no full shard)
        mst(TerrainStore.open(warm), device=device, progress=False, batch_tiles=k)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status("VmRSS")
    res = mst(TerrainStore.open(path), device=device, memory=memory, progress=False)
    print(json.dumps({"seconds": res.seconds, "timings": res.timings, "edges": res.edges, "trees": res.trees,
                      "weight": res.total_weight_exact, "batch_tiles": res.batch_tiles,
                      "merge_decisions": res.merge_decisions, "peak": status("VmHWM"),
                      "grown": status("VmHWM") - base}))
""")


def run_mst(path: Path, warm: Path, device: str, memory: str | None) -> dict:
    """``mst`` in a fresh process (so peak RSS is its own), after compiling on a small store."""
    out = subprocess.run([sys.executable, "-c", _RUN, str(path), str(warm), device, memory or "-"],
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16384])
    ap.add_argument("--devices", nargs="+", default=["gpu", "cpu"], choices=["gpu", "cpu"])
    ap.add_argument("--memory", default=None, help="the --memory budget of the runs (default: half the free RAM)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench_mst_gpu"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--kernels", action="store_true",
                    help="also time the tile kernels and the contraction of one batch (needs a GPU)")
    ap.add_argument("--keep", action="store_true", help="keep the stores (default: remove their mst/ result)")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    report = {"date": str(datetime.date.today()), "host": platform.node(), "cores": os.cpu_count(),
              "memory": args.memory, "runs": []}
    try:
        import cupy

        report["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception as exc:  # noqa: BLE001
        report["gpu"] = f"none ({type(exc).__name__})"
        if "gpu" in args.devices:
            raise SystemExit("no usable GPU: run with --devices cpu")
    warm = args.workdir / f"warm{warm_side(max(args.sizes))}.zarr"
    if not warm.exists():
        synthesize(warm, warm_side(max(args.sizes)), tile=256, shard=8)
    for n in args.sizes:
        path = args.workdir / f"synth{n}.zarr"
        row = {"size": n, "cells": n * n}
        if not path.exists():
            t0 = time.perf_counter()
            synthesize(path, n, tile=256, shard=8)
            row["synth_seconds"] = time.perf_counter() - t0
            print(f"synth {n}^2: {row['synth_seconds']:.1f} s", flush=True)
        store = TerrainStore.open(path)
        row["store_bytes"] = sum(f.stat().st_size for f in (path / "elevation").rglob("*") if f.is_file())
        row["read_pass_seconds"] = read_pass(store, 1)
        row["read_pass_parallel_seconds"] = read_pass(store, os.cpu_count() or 1)
        print(json.dumps(row), flush=True)
        digests = {}
        for device in args.devices:
            res = run_mst(path, warm, device, args.memory)
            digests[device] = (edges_digest(TerrainStore.open(path)), res["weight"])
            res["mcells_per_s"] = n * n / res["seconds"] / 1e6
            res["ratio_to_read_pass"] = res["seconds"] / row["read_pass_parallel_seconds"]
            row[device] = res
            print(device, json.dumps(res), flush=True)
        row["identical"] = len(set(digests.values())) == 1
        report["runs"].append(row)
        if not args.keep:
            shutil.rmtree(path / "mst", ignore_errors=True)
    if args.kernels:
        store = TerrainStore.open(args.workdir / f"synth{args.sizes[0]}.zarr")
        report["tile_kernel"] = tile_kernel_times(store)
        report["contraction"] = contract_times(store)
        print(json.dumps({k: report[k] for k in ("tile_kernel", "contraction")}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(f"\n{report['host']}, {report['gpu']}, {report['cores']} cores, {report['date']}, tile 256, shard 8, "
          f"memory {args.memory or 'default'}; in-process seconds, each run in a fresh process (JIT excluded)")
    print("| size | store GiB | read pass 1 thread / all cores (s) | device | seconds | Mcells/s "
          "| / read pass | tile phase | merge (thread) | merge wait | expand | peak RSS (MiB) | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in report["runs"]:
        for device in args.devices:
            x, t = r[device], r[device]["timings"]
            print(f"| {r['size']}^2 | {r['store_bytes'] / 2**30:.2f} | {r['read_pass_seconds']:.2f} / "
                  f"{r['read_pass_parallel_seconds']:.2f} | {device} | {x['seconds']:.2f} | {x['mcells_per_s']:.0f} "
                  f"| {x['ratio_to_read_pass']:.2f}x | {t['tile_phase']:.2f} | {t['merge']:.2f} | {t['merge_wait']:.2f} "
                  f"| {t['expand']:.2f} | {x['peak'] / 2**20:.0f} | {r['identical']} |")


if __name__ == "__main__":
    main()
