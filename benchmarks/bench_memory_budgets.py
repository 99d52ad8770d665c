"""What ``--memory`` bounds (README "Memory budgets"): the fixed cost of a process, stated apart --
the interpreter with the tool imported, the numba kernels loaded, the CUDA context made -- and a
pipeline's peak RSS growth above that baseline on a store, with the method ``auto`` chose.

    python benchmarks/bench_memory_budgets.py fixed --device gpu
    python benchmarks/bench_memory_budgets.py run STORE --pipeline sssp --device gpu --memory 128MB
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

FIXED = r"""
import json, sys, numpy as np, tempfile, os
from terrain_io.memory import current_rss
out = {"python": current_rss()}
import cli, terrain_io.grid.sssp, terrain_io.grid.fill, terrain_io.grid.mst
out["imported"] = current_rss()
from terrain_io.store import TerrainStore
from terrain_io.grid.sssp import sssp
from terrain_io.grid.fill import fill
from terrain_io.grid.mst import mst
d = tempfile.mkdtemp()
st = TerrainStore.from_array(os.path.join(d, "a.zarr"), np.random.default_rng(0).random((96, 96), np.float32), tile=32)
device = sys.argv[1]
if device == "gpu":
    import cupy
    cupy.zeros(1).sum()
    out["cuda_context"] = current_rss()
for method in ("incore", "shards"):
    sssp(st, (5, 5), cell=True, progress=False, device=device, method=method, name=method)
fill(st, device=device, progress=False)
mst(st, device=device, progress=False)
out["kernels_loaded"] = current_rss()
print(json.dumps(out))
"""

RUN = r"""
import json, sys, time, resource
from terrain_io.memory import current_rss, peak_rss, reset_peak_rss
from terrain_io.store import TerrainStore
store, pipeline, device, memory, warm = sys.argv[1:6]
st = TerrainStore.open(store)
n, m = st.shape

def run(path, memory, name):
    s = TerrainStore.open(path)
    if pipeline == "sssp":
        from terrain_io.grid.sssp import sssp
        r = sssp(s, (s.shape[0] // 3, s.shape[1] // 2), cell=True, progress=False, device=device, memory=memory,
                 name=name)
        return {"method": r.method, "device": r.device, "timings": r.timings, "stats": r.merge_stats}
    if pipeline == "fill":
        from terrain_io.grid.fill import fill
        r = fill(s, device=device, memory=memory, progress=False)
        return {"method": r.method, "device": r.device}
    from terrain_io.grid.mst import mst
    r = mst(s, device=device, memory=memory, progress=False)
    return {"method": f"batch {r.batch_tiles}", "device": r.device}

run(warm, None, "warm")  # the kernels loaded, the CUDA context made
reset_peak_rss()
base = current_rss()
c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
out = run(store, memory, "bench")
c1 = resource.getrusage(resource.RUSAGE_SELF)
out.update({"baseline": base, "grown": peak_rss() - base, "wall": time.perf_counter() - t0,
            "cpu": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime})
print(json.dumps(out))
"""


def _python(script, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                      os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["fixed", "run"])
    ap.add_argument("store", nargs="?")
    ap.add_argument("--pipeline", default="sssp", choices=["sssp", "fill", "mst"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--memory", default="128MB")
    args = ap.parse_args()
    mib = 2**20
    if args.what == "fixed":
        r = _python(FIXED, args.device)
        print(f"fixed cost ({args.device}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}): "
              + ", ".join(f"{k} {v / mib:.0f} MiB" for k, v in r.items()), flush=True)
        return
    from terrain_io.synth import synthesize

    warm = Path(args.store).parent / "bench-warm.zarr"
    synthesize(warm, 300, seed=2, tile=64, shard=2, overwrite=True, progress=False)
    r = _python(RUN, args.store, args.pipeline, args.device, args.memory, warm)
    print(f"{args.pipeline} --device {args.device} --memory {args.memory} on {args.store}: {r['method']} on the "
          f"{r['device']}, {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU, peak RSS +{r['grown'] / mib:.0f} MiB above "
          f"the baseline {r['baseline'] / mib:.0f} MiB; {json.dumps({k: r.get(k) for k in ('timings', 'stats')})}",
          flush=True)


if __name__ == "__main__":
    main()
