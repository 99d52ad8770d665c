"""Where the in-core GPU SSSP solve spends its time (issue 31): per phase (distances, plateau
levels) the rounds, tiles relaxed, relaxation sweeps a visit and time, on the synthetic terrain of
``terrain synth --seed 1`` (10 m cells, the source at the centre, as the RESULTS rows); with
``--rounds`` the unkeyed rounds' list sizes and kernel times too. A counter added to a copy of
worklist.cuh's ``relax_tile`` counts the sweeps; the plain solve is timed first, and a checksum of
its distances, levels and codes is printed so that runs of two trees can be compared.

    python benchmarks/profile_sssp_incore.py --sizes 16384 32768 --weights absdiff --reach 1024 4096 --profile 16384
"""
from __future__ import annotations

import argparse
import json
import time

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


def checksum(*arrays) -> str:
    """A position-weighted sum of the arrays' bytes (as uint32 words, in pieces), to compare two runs."""
    import cupy as cp

    out = []
    piece = 1 << 26
    for a in arrays:
        words = cp.ascontiguousarray(a).reshape(-1).view(cp.uint8)
        words = words[: words.size // 4 * 4].view(cp.uint32)
        total = 0
        for s in range(0, words.size, piece):
            w = words[s : s + piece].astype(cp.uint64)
            idx = cp.arange(s, s + w.size, dtype=cp.uint64)
            total += int(((w * (idx * np.uint64(2654435761) + np.uint64(1))) % np.uint64(2**61 - 1)).sum())
        out.append(f"{total % (2**61 - 1):x}")
    return "/".join(out)


class Recorder:
    """Wraps the work lists' runs: per phase rounds, visits, sweeps and time (synchronised);
    ``rounds``: the unkeyed runs round by round (list size, kernel time)."""

    def __init__(self, module_of, rounds: bool):
        self.module_of, self.rounds = module_of, rounds
        self.phases = []

    def counters(self):
        import cupy as cp

        mod = self.module_of()
        return (cp.ndarray((1,), cp.uint64, mod.get_global("prof_sweeps")),
                cp.ndarray((16,), cp.uint64, mod.get_global("prof_hist")))

    def wrap(self, run):
        def wrapped(lists, kernel, args, first):
            import cupy as cp

            sweeps, hist = self.counters()
            sweeps[...] = 0
            hist[...] = 0
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            detail = {}
            if self.rounds and run.__name__ == "run":
                rounds, detail = self.run_rounds(lists, kernel, args, first)
            else:
                rounds = run(lists, kernel, args, first)
            cp.cuda.Device().synchronize()
            ph = {"kernel": getattr(kernel, "name", "?"), "rounds": rounds, "s": round(time.perf_counter() - t, 3)}
            sw = int(sweeps.get()[0])
            hv = [int(x) for x in hist.get()]
            nvis = sum(hv)  # relax_tile's calls: the tiles relaxed
            ph.update({"visits": int(nvis), "visits_per_tile": round(nvis / lists.flags[0].size, 2),
                       "sweeps_per_visit": round(sw / max(sum(hv), 1), 1), "sweeps_hist_log2": hv})
            ph.update({k: x for k, x in detail.items() if k != "visits"})
            self.phases.append(ph)
            return rounds
        return wrapped

    def run_rounds(self, lists, kernel, args, first):
        import cupy as cp

        from terrain_io.worklist import ROWS_PER_PASS, TILE

        n = int(first.size)
        cur = 0
        lists.lists[0][:n] = first
        lists.flags[0][first] = 1
        sizes, times = [], []
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        while n:
            nxt = 1 - cur
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
        sizes, ms = np.array(sizes), np.array(times)
        bins = [0, 64, 256, 1024, 4096, 16384, 1 << 40]
        by = {f"{a}-{b}": [int(((sizes >= a) & (sizes < b)).sum()), round(float(ms[(sizes >= a) & (sizes < b)].mean()), 3)]
              for a, b in zip(bins, bins[1:]) if ((sizes >= a) & (sizes < b)).any()}
        return len(sizes), {"visits": int(sizes.sum()), "kernel_s": round(float(ms.sum()) / 1e3, 3),
                            "rounds_by_list_size_and_ms": by, "largest_list": int(sizes.max())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[16384])
    ap.add_argument("--weights", nargs="+", default=["absdiff"])
    ap.add_argument("--reach", type=int, nargs="*", default=[], help="KeyedWorkLists.reach values to try")
    ap.add_argument("--rounds", action="store_true", help="the unkeyed rounds one by one")
    ap.add_argument("--profile", type=int, nargs="*", default=None,
                    help="sizes to profile (default: all); the profile runs with the last --reach")
    args = ap.parse_args()
    import cupy as cp

    from terrain_io import worklist
    from terrain_io.grid.sssp import _incore_gpu
    from terrain_io.weights import steps_of
    from terrain_io.grid.sssp.incore import solve_block
    from terrain_io.synth import synth_array
    from terrain_io.weights import get as weight_model

    keyed = getattr(worklist, "KeyedWorkLists", None)
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), time.strftime("%Y-%m-%d %H:%M"),
          "keyed" if keyed else "unkeyed", flush=True)
    steps = steps_of(10.0, 10.0)
    for n in args.sizes:
        t = time.perf_counter()
        vals = cp.full((n + 2, n + 2), cp.nan, cp.float32)
        vals[1:-1, 1:-1] = cp.asarray(synth_array(n, n, seed=1))
        print(f"{n}^2: terrain {time.perf_counter() - t:.1f} s", flush=True)
        src = [(n // 2, n // 2)]
        small = vals[:258, :258].copy()
        for weight in args.weights:
            kind = weight_model(weight).kind
            for reach in (args.reach or [None]) if keyed else [None]:
                if reach:
                    keyed.reach = reach
                solve_block(small, kind, steps, [(100, 100)], device="gpu")  # compile
                cp.cuda.Device().synchronize()
                t = time.perf_counter()
                d, lv, p = solve_block(vals, kind, steps, src, device="gpu")
                cp.cuda.Device().synchronize()
                row = {"size": n, "weight": weight, "reach": reach, "solve_s": round(time.perf_counter() - t, 3),
                       "rounds": _incore_gpu.solve_block_gpu.rounds,
                       "visits": getattr(_incore_gpu.solve_block_gpu, "visits", None),
                       "checksum": checksum(d, lv, p)}
                del d, lv, p
                print(json.dumps(row), flush=True)
                if (args.profile is not None and n not in args.profile) or (reach and reach != args.reach[-1]):
                    continue
                base_source = _incore_gpu.kernel_source
                _incore_gpu.kernel_source = lambda name: instrumented(base_source(name))
                _incore_gpu._module.cache_clear()
                rec = Recorder(lambda: _incore_gpu._module("float", int(kind)), args.rounds)
                saved = {(cls, name): getattr(cls, name) for cls, name in
                         [(worklist.WorkLists, "run")] + ([(keyed, "run_near_far")] if keyed else [])}
                for (cls, name), fn in saved.items():
                    setattr(cls, name, rec.wrap(fn))
                try:
                    solve_block(small, kind, steps, [(100, 100)], device="gpu")
                    rec.phases.clear()
                    t = time.perf_counter()
                    d, lv, p = solve_block(vals, kind, steps, src, device="gpu")
                    cp.cuda.Device().synchronize()
                    prof = time.perf_counter() - t
                finally:
                    for (cls, name), fn in saved.items():
                        setattr(cls, name, fn)
                    _incore_gpu.kernel_source = base_source
                    _incore_gpu._module.cache_clear()
                same = checksum(d, lv, p) == row["checksum"]
                del d, lv, p
                for ph in rec.phases:
                    print("   ", json.dumps(ph), flush=True)
                print("   ", json.dumps({"profiled_s": round(prof, 3), "same_bytes": same}), flush=True)
        del vals, small
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
