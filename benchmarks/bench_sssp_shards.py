"""The shard method (out of core) against the in-core method on the same store, each in a fresh
process: time, unit solves per unit (warm ones: from memory or from the scratch on disk), bytes
read and written per cell, scratch on disk, peak RSS growth; the store is a multiple of the budget
given to the shard method (8x its raw cells from 8192^2 on the CPU: the smallest budget is one unit
solve and the units' edges; units of whole shards need ``--shard 1`` at small budgets).

    python benchmarks/bench_sssp_shards.py --size 4096 --memory 10MB --device cpu --shard 1
    python benchmarks/bench_sssp_shards.py --size 8192 --memory 32MB --device cpu --shard 1
    python benchmarks/bench_sssp_shards.py --size 16384 --memory 512MB --device gpu
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


SCRIPT = r"""
import sys, time, json, resource
from terrain_io.grid.sssp import sssp
from terrain_io.memory import peak_rss
from terrain_io.store import TerrainStore
st = TerrainStore.open(sys.argv[1]); method, weight, device, memory = sys.argv[2:6]
n = st.shape[0]
warm = TerrainStore.open(sys.argv[6])
sssp(warm, (5, 5), weight=weight, cell=True, progress=False, method=method, device=device, name="w",
     **({"unit": warm.tile_size} if method == "shards" else {}))
base = peak_rss()
t = time.perf_counter()
c = resource.getrusage(resource.RUSAGE_SELF)
r = sssp(st, (n // 3, n // 2), weight=weight, cell=True, progress=False, method=method, device=device,
         memory=None if memory == "-" else memory, name=method)
c1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = c1.ru_utime + c1.ru_stime - c.ru_utime - c.ru_stime
print(json.dumps({"seconds": time.perf_counter() - t, "cpu": cpu, "grown": peak_rss() - base, "stats": r.merge_stats,
                  "timings": r.timings}))
"""


def run(store, warm, method, weight, device, memory):
    import json

    out = subprocess.run([sys.executable, "-c", SCRIPT, str(store), method, weight, device, memory, str(warm)],
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                             str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))})
    if out.returncode:
        raise SystemExit(f"{method}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--memory", default="8MB")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--shard", type=int, default=2)
    ap.add_argument("--weights", nargs="+", default=["absdiff", "surface"])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--store", default=None, help="an existing store of --size cells (no synthesis)")
    ap.add_argument("--incore-seconds", type=float, default=None, help="skip the in-core run: its time")
    args = ap.parse_args()
    from terrain_io.memory import format_bytes, parse_size
    from terrain_io.store import TerrainStore
    from terrain_io.synth import synthesize

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-shards-"))
    n = args.size
    t = time.perf_counter()
    if args.store:
        st = TerrainStore.open(args.store)
        args.tile, args.shard = st.tile_size, st.shard_size
    else:
        st = synthesize(work / f"dem{n}.zarr", n, seed=1, cell_size=10.0, tile=args.tile, shard=args.shard,
                        overwrite=True, progress=False)
    warm = synthesize(work / "warm.zarr", 2 * args.tile, seed=2, tile=args.tile, shard=1, overwrite=True,
                      progress=False)
    disk = int(subprocess.check_output(["du", "-sb", str(st.path / "elevation")]).split()[0])
    budget = parse_size(args.memory)
    print(f"{n}^2 ({n * n / 1e6:.0f}M cells), tile {args.tile}, shard {args.shard}, {args.device}, "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; store made in {time.perf_counter() - t:.1f} s: "
          f"{format_bytes(n * n * 4)} of cells, {format_bytes(disk)} on disk = {disk / budget:.1f}x the shard "
          f"method's budget {format_bytes(budget)} ({n * n * 4 / budget:.1f}x raw)", flush=True)
    for weight in args.weights:
        if args.incore_seconds is None:
            a = run(st.path, warm.path, "incore", weight, args.device, "-")
            print(f"  {weight:8s} in-core {a['seconds']:7.2f} s wall {a['cpu']:7.2f} s CPU", flush=True)
        else:  # measured in an earlier call (wall = CPU given)
            a = {"seconds": args.incore_seconds, "cpu": args.incore_seconds, "grown": 0}
        b = run(st.path, warm.path, "shards", weight, args.device, args.memory)
        s = b["stats"]
        print(f"  {weight:8s} in-core {a['seconds']:7.2f} s wall {a['cpu']:7.2f} s CPU "
              f"(peak +{format_bytes(a['grown'])})"
              f" | shards {b['seconds']:7.2f} s wall {b['cpu']:7.2f} s CPU (peak +{format_bytes(b['grown'])}): "
              f"{b['seconds'] / a['seconds']:.2f}x the in-core wall time, {b['cpu'] / a['cpu']:.2f}x its CPU time; "
              f"{s['units']} units of {s['unit']}^2, {s['solves_per_unit']:.2f} solves a unit "
              f"(max {s['max_solves']}; {s['warm_solves']} of {s['solves']} warm, {s['kept_solves']} of them kept in "
              f"memory), read {s['read_bytes_per_cell']:.2f} B/cell, written {s['written_bytes_per_cell']:.2f} B/cell, "
              f"scratch {format_bytes(s['scratch_bytes'])} = {s['scratch_bytes'] / disk:.2f}x the store on disk",
              flush=True)


if __name__ == "__main__":
    main()
