"""Grid MST on the GPU machine: a synthetic 16384^2 DEM (268M cells) end to end from the store.

Reports, in one run: the store's size and the time of one pass that reads and decodes all of its
shards (the floor for any pipeline that reads the DEM); ``terrain_io.grid.mst`` with
``device="gpu"`` per phase and end to end, contracting the tile forests on the GPU (default) and,
as before, on the CPU (``gpu_contract=False``); the same with ``device="cpu"`` (all cores; skip
with --skip-cpu) and a check that all wrote the identical ``mst/edges``; the tile kernel time per
256^2 tile (GPU Boruvka on a batch of 64 tiles, CUDA events; CPU Kruskal + contraction on one
core), beside the thesis's Table 3.7 (81 ms GPU, 184 ms CPU per 256^2 tile) and Table 3.8
(Neuse, 221M cells, ~29 min on the GPU); and the contraction of one such batch: GPU kernel vs
the numba contraction on all cores.

    python benchmarks/bench_mst_gpu.py [--size 16384] [--workdir /tmp/bench_mst_gpu] [--json out.json] [--skip-cpu]
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numba
import numpy as np

from terrain_io.grid import _mst_cpu as K
from terrain_io.grid.mst import mst
from terrain_io.store import TerrainStore, Window
from terrain_io.synth import synthesize
from terrain_io.weights import get as weight_model


def read_pass(store: TerrainStore) -> float:
    t0 = time.perf_counter()
    for win in store.shards():
        store.read(win)
    return time.perf_counter() - t0


def edges_digest(store: TerrainStore) -> str:
    h = hashlib.blake2b(digest_size=16)
    for win in store.shards():
        h.update(np.ascontiguousarray(store.read(win, "mst/edges")).tobytes())
    return h.hexdigest()


def tile_kernel_times(store: TerrainStore, tile: int = 256, repeats: int = 5) -> dict:
    """ms per tile: GPU Boruvka over a 2048^2 batch (64 tiles); CPU Kruskal + contraction, 1 core."""
    from terrain_io.grid._mst_gpu import GpuTileForest

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

    def cpu_once():
        bits = np.zeros((tile, tile), np.uint8)
        t0 = time.perf_counter()
        K.tile_forest_max(hk, float_bits, ok, 0, 0, tile, tile, bits)
        t1 = time.perf_counter()
        K.contract_tile(v, ok, bits, 0, 0, tile, tile, tile, tile, 0, 0, rows, cols, 0,
                        np.empty(cap, np.int64), np.empty(cap), np.empty(cap, np.uint8), np.empty(cap, np.int64),
                        np.empty(cap, np.int64), np.empty(cap), np.empty(cap, np.int64),
                        np.zeros((2, K.N_EXP), np.int64))
        return t1 - t0, time.perf_counter() - t1

    cpu_once()
    runs = [cpu_once() for _ in range(repeats)]
    return {"gpu_ms_per_tile": gpu_ms, "gpu_batch_tiles": ntiles,
            "cpu_forest_ms_per_tile": float(np.median([r[0] for r in runs])) * 1e3,
            "cpu_contract_ms_per_tile": float(np.median([r[1] for r in runs])) * 1e3}


def contract_times(store: TerrainStore, tile: int = 256, repeats: int = 5) -> dict:
    """One 2048^2 batch (64 tiles), forests given: GPU contraction kernel (CUDA events) vs the numba
    contraction (``tile_phase_batch`` with the forests given) on all cores, wall time; medians."""
    from terrain_io.grid._mst_gpu import GpuTileForest

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
                                   K.FOREST_GIVEN)
        cpu_times.append(time.perf_counter() - t0)
    same = all(np.array_equal(a, b) for a, b in zip(out_g[:1] + out_g[4:5], out_c[:1] + out_c[4:5])) and all(
        np.array_equal(out_g[x][t, :out_c[0 if x < 4 else 4][t]], out_c[x][t, :out_c[0 if x < 4 else 4][t]])
        for x in (1, 2, 3, 5, 6, 7, 8) for t in range(len(tiles))) and np.array_equal(out_g[9], out_c[9])
    return {"tiles": len(tiles), "gpu_ms_per_batch": float(np.median(times)) * 1e3,
            "cpu_all_cores_ms_per_batch": float(np.median(cpu_times[1:])) * 1e3, "identical": bool(same),
            "vertices": int(out_c[0].sum()), "super_edges": int(out_c[4].sum())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=16384)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench_mst_gpu"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--skip-cpu", action="store_true", help="do not run the CPU backend on the large store")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    report = {"date": str(datetime.date.today()), "size": args.size, "cpu_threads": numba.get_num_threads()}
    try:
        import cupy

        report["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception as exc:  # noqa: BLE001
        report["gpu"] = f"none ({exc})"

    warm = args.workdir / "warm.zarr"
    if not warm.exists():
        synthesize(warm, 700, tile=256, shard=8)
    path = args.workdir / f"synth{args.size}.zarr"
    if not path.exists():
        t0 = time.perf_counter()
        synthesize(path, args.size, tile=256, shard=8)
        report["synth_seconds"] = time.perf_counter() - t0
    store = TerrainStore.open(path)
    report["store_bytes"] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and "mst" not in f.parts)
    report["raw_bytes"] = store.shape[0] * store.shape[1] * store.dtype.itemsize
    report["read_pass_seconds"] = read_pass(store)
    print(json.dumps(report), flush=True)

    for device in ("gpu", "cpu"):
        mst(TerrainStore.open(warm), device=device, progress=False)  # compile / load kernels
    mst(TerrainStore.open(warm), device="gpu", progress=False, gpu_contract=False)
    ntiles = int(np.prod(store.tile_grid))
    for name, contract_on_gpu in (("gpu_run", True), ("gpu_cpu_contract_run", False)):
        res = mst(TerrainStore.open(path), device="gpu", progress=False, gpu_contract=contract_on_gpu)
        report[name] = {"seconds": res.seconds, "timings": res.timings, "edges": res.edges, "trees": res.trees,
                        "weight": res.total_weight_exact, "batch_tiles": res.batch_tiles,
                        "merge_decisions": res.merge_decisions,
                        "kernel_ms_per_tile": res.timings.get("gpu_kernel", 0) / ntiles * 1e3,
                        "digest": edges_digest(TerrainStore.open(path))}
        print(name, json.dumps(report[name]), flush=True)
    report["gpu_digest"] = report["gpu_run"]["digest"]
    report["identical"] = (report["gpu_cpu_contract_run"]["digest"] == report["gpu_digest"]
                           and report["gpu_cpu_contract_run"]["weight"] == report["gpu_run"]["weight"])
    if not args.skip_cpu:
        res_c = mst(TerrainStore.open(path), device="cpu", progress=False)
        report["cpu_run"] = {"seconds": res_c.seconds, "timings": res_c.timings, "weight": res_c.total_weight_exact}
        report["cpu_digest"] = edges_digest(TerrainStore.open(path))
        report["identical"] &= report["cpu_digest"] == report["gpu_digest"] and res_c.total_weight_exact == report["gpu_run"]["weight"]
        print(json.dumps(report["cpu_run"]), flush=True)
    print("identical:", report["identical"], flush=True)
    report["tile_kernel"] = tile_kernel_times(store)
    print(json.dumps(report["tile_kernel"]), flush=True)
    report["contraction"] = contract_times(store)
    print("contraction", json.dumps(report["contraction"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    g = report["gpu_run"]
    print(f"\n{report['gpu']}, {report['cpu_threads']} CPU threads, {report['date']}: {args.size}^2 = "
          f"{args.size**2 / 1e6:.0f}M cells, store {report['store_bytes'] / 2**30:.2f} GiB "
          f"(raw {report['raw_bytes'] / 2**30:.2f} GiB), read+decode pass {report['read_pass_seconds']:.1f} s")
    print(f"GPU end to end {g['seconds']:.1f} s ({args.size**2 / g['seconds'] / 1e6:.0f} Mcells/s); "
          f"tile phase / read pass = {g['timings']['tile_phase'] / report['read_pass_seconds']:.2f}; "
          f"phases {g['timings']}")
    o = report["gpu_cpu_contract_run"]
    print(f"GPU with the contraction on the CPU (before): {o['seconds']:.1f} s, tile phase "
          f"{o['timings']['tile_phase']:.1f} s; phases {o['timings']}")
    if "cpu_run" in report:
        print(f"CPU end to end {report['cpu_run']['seconds']:.1f} s")
    print(f"identical edges and weights: {report['identical']}")
    c = report["contraction"]
    print(f"contraction of a batch of {c['tiles']} tiles of 256^2: GPU {c['gpu_ms_per_batch']:.1f} ms, "
          f"CPU ({report['cpu_threads']} threads) {c['cpu_all_cores_ms_per_batch']:.1f} ms, identical: {c['identical']}")
    print(f"per 256^2 tile: GPU {report['tile_kernel']['gpu_ms_per_tile']:.2f} ms, CPU (1 core) "
          f"{report['tile_kernel']['cpu_forest_ms_per_tile'] + report['tile_kernel']['cpu_contract_ms_per_tile']:.1f} ms"
          " (thesis Table 3.7: 81 ms GPU, 184 ms CPU)")
    if os.environ.get("BENCH_KEEP") != "1":
        shutil.rmtree(args.workdir / f"synth{args.size}.zarr" / "mst", ignore_errors=True)


if __name__ == "__main__":
    main()
