"""Where the in-core GPU SSSP solve spends its time (issue 31): rounds, work-list sizes per round,
kernel time per round (CUDA events), tile visits per tile, relaxation sweeps per visit, for the
distances and the plateau levels, on the synthetic terrain of ``terrain synth --seed 1`` (10 m
cells, the source at the centre, as the RESULTS rows). Instrumented copies of the kernels count the
sweeps (a counter added to ``relax_tile`` of worklist.cuh); the plain solve is timed first.

    python benchmarks/profile_sssp_incore.py --sizes 16384 32768 --weights absdiff --out DIR
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

SWEEPS = """__device__ unsigned long long prof_sweeps;
__device__ unsigned long long prof_hist[16];
"""


def instrumented(source: str) -> str:
    """``source`` with relax_tile counting its sweeps (total and a log2 histogram of sweeps a visit)."""
    a = source.replace("    bool changed;\n    do {", "    bool changed;\n    unsigned prof_n = 0;\n    do {\n        ++prof_n;", 1)
    b = a.replace("    } while (__syncthreads_or(changed));\n",
                  "    } while (__syncthreads_or(changed));\n    if (threadIdx.x == 0 && threadIdx.y == 0) {\n"
                  "        atomicAdd(&prof_sweeps, (unsigned long long)prof_n);\n"
                  "        atomicAdd(&prof_hist[min(31 - __clz(prof_n), 15)], 1ULL);\n    }\n", 1)
    assert b != a != source, "relax_tile's loop not found"
    return b.replace("#define TS 32", SWEEPS + "#define TS 32", 1)


class Recorder:
    """Wraps ``WorkLists.run``: per round the list size and the kernel's time; visits per tile."""

    def __init__(self, module_of):
        self.module_of = module_of
        self.phases = []

    def run(self, lists, kernel, args, first):
        import cupy as cp

        from terrain_io.worklist import ROWS_PER_PASS, TILE

        mod = self.module_of()
        ntiles = lists.flags[0].size
        visits = cp.zeros(ntiles, cp.int32)
        zero = np.zeros(16, np.uint64)
        sweeps = cp.ndarray((1,), cp.uint64, mod.get_global("prof_sweeps"))
        hist = cp.ndarray((16,), cp.uint64, mod.get_global("prof_hist"))
        sweeps[...] = 0
        hist[:] = cp.asarray(zero)
        n = int(first.size)
        cur = 0
        lists.lists[0][:n] = first
        lists.flags[0][first] = 1
        sizes, times = [], []
        t0 = time.perf_counter()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        while n:
            nxt = 1 - cur
            visits += cp.bincount(lists.lists[cur][:n], minlength=ntiles).astype(cp.int32)
            lists.count.fill(0)
            e0.record()
            kernel((n,), (TILE, ROWS_PER_PASS), args + (lists.lists[cur], lists.flags[cur], lists.flags[nxt],
                                                        lists.lists[nxt], lists.count))
            e1.record()
            e1.synchronize()
            sizes.append(n)
            times.append(cp.cuda.get_elapsed_time(e0, e1))
            n = int(lists.count.get()[0])
            cur = nxt
        wall = time.perf_counter() - t0
        v = visits.get()
        touched = v[v > 0]
        self.phases.append({
            "kernel": getattr(kernel, "name", str(kernel)), "rounds": len(sizes),
            "wall_s": round(wall, 3), "kernel_s": round(sum(times) / 1e3, 3), "visits": int(sum(sizes)),
            "tiles": int(ntiles), "tiles_touched": int(touched.size),
            "visits_per_tile": [round(float(x), 1) for x in np.percentile(touched, [50, 90, 99, 100])] if touched.size else [],
            "mean_visits": round(float(touched.mean()), 2) if touched.size else 0,
            "sweeps": int(sweeps.get()[0]),
            "sweeps_hist_log2": [int(x) for x in hist.get()],
            "sizes": sizes, "ms": [round(t, 3) for t in times]})
        return len(sizes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[16384])
    ap.add_argument("--weights", nargs="+", default=["absdiff"])
    ap.add_argument("--out", default=".")
    ap.add_argument("--no-profile", action="store_true", help="time the plain solve only")
    args = ap.parse_args()
    import cupy as cp

    from terrain_io import worklist
    from terrain_io.grid.sssp import _incore_gpu
    from terrain_io.grid.sssp._pipeline_cpu import steps_of
    from terrain_io.grid.sssp.incore import solve_block
    from terrain_io.synth import synth_array
    from terrain_io.weights import get as weight_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), time.strftime("%Y-%m-%d %H:%M"), flush=True)
    steps = steps_of(10.0, 10.0)
    for n in args.sizes:
        t = time.perf_counter()
        v = synth_array(n, n, seed=1)
        vals = cp.full((n + 2, n + 2), cp.nan, cp.float32)
        vals[1:-1, 1:-1] = cp.asarray(v)
        del v
        print(f"{n}^2: terrain {time.perf_counter() - t:.1f} s", flush=True)
        src = [(n // 2, n // 2)]
        for weight in args.weights:
            kind = weight_model(weight).kind
            small = vals[: 258, : 258].copy()
            solve_block(small, kind, steps, [(100, 100)], device="gpu")  # compile
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            d, lv, p = solve_block(vals, kind, steps, src, device="gpu")
            cp.cuda.Device().synchronize()
            plain = time.perf_counter() - t
            row = {"size": n, "weight": weight, "solve_s": round(plain, 3), "rounds": _incore_gpu.solve_block_gpu.rounds}
            print(json.dumps(row), flush=True)
            ref = (d.view(cp.uint64), lv, p)
            del d, lv, p
            if args.no_profile:
                continue
            base_source = _incore_gpu.kernel_source
            _incore_gpu.kernel_source = lambda name: instrumented(base_source(name))
            _incore_gpu._module.cache_clear()
            value_type = "float"
            rec = Recorder(lambda: _incore_gpu._module(value_type, int(kind)))
            orig_run = worklist.WorkLists.run
            worklist.WorkLists.run = lambda self, kernel, a, first: rec.run(self, kernel, a, first)
            try:
                solve_block(small, kind, steps, [(100, 100)], device="gpu")
                rec.phases.clear()
                t = time.perf_counter()
                d, lv, p = solve_block(vals, kind, steps, src, device="gpu")
                cp.cuda.Device().synchronize()
                prof = time.perf_counter() - t
            finally:
                worklist.WorkLists.run = orig_run
                _incore_gpu.kernel_source = base_source
                _incore_gpu._module.cache_clear()
            same = all(bool((a == b).all()) for a, b in zip(ref, (d.view(cp.uint64), lv, p)))
            del d, lv, p, ref
            for ph in rec.phases:
                summary = {k: x for k, x in ph.items() if k not in ("sizes", "ms")}
                sizes, ms = np.array(ph["sizes"]), np.array(ph["ms"])
                bins = [0, 64, 256, 1024, 4096, 16384, 1 << 40]
                summary["ms_per_round_by_size"] = {f"{a}-{b}": [int(((sizes >= a) & (sizes < b)).sum()),
                                                                round(float(ms[(sizes >= a) & (sizes < b)].mean()), 3)]
                                                   for a, b in zip(bins, bins[1:]) if ((sizes >= a) & (sizes < b)).any()}
                summary["sweeps_per_visit"] = round(ph["sweeps"] / max(ph["visits"], 1), 1)
                print(json.dumps(summary), flush=True)
            print(json.dumps({"profiled_s": round(prof, 3), "same_bytes_as_plain": same}), flush=True)
            (out / f"rounds_{n}_{weight}.json").write_text(json.dumps(
                [{"kernel": ph["kernel"], "sizes": ph["sizes"], "ms": ph["ms"]} for ph in rec.phases]))
        del vals
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
