"""APSP benchmark: terrain_io.graph.apsp against scipy.sparse.csgraph.floyd_warshall (CPU) and the
Tesla M2090 table of Padamata & Raveendran 2013 (blocked FW 33.2 ms, 227 ms, 1757 ms at n = 1024,
2048, 4096; CPU single core 434 s at 4096).

    python benchmarks/bench_apsp.py --device cpu --sizes 1024 2048            # vs scipy, side by side
    python benchmarks/bench_apsp.py --device gpu --sizes 1024 2048 4096 8192 16384

GPU times: CUDA events, one warm-up, median of --repeat runs, fresh random matrices (uniform
weights, density 1). Min-plus operations: n^3 relaxations for (blocked) Floyd-Warshall. The GPU's
min-plus peak is measured here too: a register-only kernel of independent (add, min) pairs, and
DPX __viaddmin_s32 for int32; "% peak" is the APSP rate over that ceiling.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from common import gpu_median, print_table  # benchmarks/ is on sys.path when run as a script

SEED_M2090_MS = {512: 6.558, 1024: 33.225, 2048: 227.238, 3072: 736.571, 4096: 1756.861}

PEAK_SRC = r"""
extern "C" __global__ void peak_f32(float* out, int iters, float b) {
    float acc[8], a[8];
    for (int u = 0; u < 8; ++u) { acc[u] = 1e30f; a[u] = threadIdx.x * 0.001f + u; }
    for (int i = 0; i < iters; ++i) {
        float bb = b + i * 1e-7f;  // one shared op per 8 (add, min) pairs; keeps the loop from folding
#pragma unroll
        for (int u = 0; u < 8; ++u) acc[u] = fminf(acc[u], a[u] + bb);
    }
    float s = 0; for (int u = 0; u < 8; ++u) s += acc[u];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void peak_i32(int* out, int iters, int b) {
    int acc[8], a[8];
    for (int u = 0; u < 8; ++u) { acc[u] = 1 << 30; a[u] = threadIdx.x + u; }
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int u = 0; u < 8; ++u) acc[u] = __viaddmin_s32(a[u], b + i, acc[u]);
    }
    int s = 0; for (int u = 0; u < 8; ++u) s += acc[u];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def gpu_peak(kind: str) -> float:
    """Measured (add, min) pairs per second of a register-only kernel."""
    import cupy

    mod = cupy.RawModule(code=PEAK_SRC, options=("-std=c++17",))
    f = mod.get_function(f"peak_{kind}")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    blocks, threads, iters = sms * 8, 256, 20000
    out = cupy.empty(blocks * threads, dtype=np.float32 if kind == "f32" else np.int32)
    b = np.float32(0.5) if kind == "f32" else np.int32(3)
    t = gpu_median(lambda: f((blocks,), (threads,), (out, np.int32(iters), b)), 5) / 1e3
    return blocks * threads * iters * 8 / t


def random_weights(rng, n, dtype, density=1.0):
    W = rng.uniform(1, 1000, (n, n))
    if density < 1:
        W[rng.random((n, n)) >= density] = np.inf
    if np.dtype(dtype).kind == "i":
        return np.where(np.isinf(W), np.iinfo(np.int32).max, np.round(W)).astype(np.int32)
    return W.astype(dtype)


KEYS = [("n", ">6", "n"), ("dtype", ">8", "dtype"), ("method", ">20", "method")]  # the table's first columns


def main():
    from terrain_io.graph.apsp import apsp
    from terrain_io.memory import peak_rss, format_bytes

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--methods", nargs="+", default=["blocked"])
    ap.add_argument("--dtypes", nargs="+", default=["float32"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scipy-max", type=int, default=2048, help="largest n timed with scipy (CPU)")
    ap.add_argument("--pred", action="store_true", help="also time with predecessors")
    ap.add_argument("--check-max", type=int, default=2048, help="largest n checked against scipy")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    peaks = {}
    if args.device == "gpu":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        print(f"device: {props['name'].decode()}, {props['multiProcessorCount']} SMs, clock {props.get('clockRate', 0) / 1e6:.2f} GHz")
        peaks = {"float32": gpu_peak("f32"), "int32": gpu_peak("i32")}
        for k, v in peaks.items():
            print(f"measured min-plus peak {k}: {v / 1e12:.2f} T(add,min)/s")
    for n in args.sizes:
        for dtype in args.dtypes:
            W = random_weights(rng, n, dtype)
            ref = None
            for method in args.methods:
                for pred in ([False, True] if args.pred else [False]):
                    if args.device == "gpu":
                        import cupy

                        Wd = cupy.asarray(W)
                        t = gpu_median(lambda: apsp(Wd, method=method, return_predecessors=pred), args.repeat) / 1e3
                        D = apsp(Wd, method=method)
                        D = D.get()
                    else:
                        apsp(W[:64, :64], method=method, return_predecessors=pred)  # compile
                        t0 = time.perf_counter()
                        D = apsp(W, method=method, return_predecessors=pred)
                        t = time.perf_counter() - t0
                        D = D[0] if pred else D
                    ok = ""
                    if n <= args.check_max:
                        if ref is None:
                            from scipy.sparse.csgraph import floyd_warshall
                            Wf = np.where(W == np.iinfo(np.int32).max, np.inf, W.astype(np.float64)) if W.dtype.kind == "i" else W.astype(np.float64)
                            t0 = time.perf_counter()
                            ref = floyd_warshall(Wf) if n <= args.scipy_max else None
                            tref = time.perf_counter() - t0
                        if ref is not None:
                            Df = np.where(D == np.iinfo(np.int32).max, np.inf, D.astype(np.float64)) if D.dtype.kind == "i" else D
                            ok = "ok" if np.allclose(Df, ref, rtol=1e-5) else "MISMATCH"
                    ops = float(n) ** 3
                    rate = ops / t
                    row = dict(n=n, dtype=dtype, method=method + ("+pred" if pred else ""), time_s=t, rate=rate,
                               check=ok)
                    if args.device == "gpu":
                        row["peak"] = rate / peaks["int32" if dtype == "int32" else "float32"]
                        row["m2090"] = SEED_M2090_MS.get(n, float("nan")) / 1e3 / t
                    elif ref is not None:
                        row["scipy_s"] = tref
                        row["ratio"] = tref / t
                    rows.append(row)
                    print(row, flush=True)
    print(f"\npeak RSS {format_bytes(peak_rss())}")
    if args.device == "gpu":
        print_table(rows, [*KEYS, ("time ms", ">10.2f", lambda r: r["time_s"] * 1e3),
                           ("Gop/s", ">9.0f", lambda r: r["rate"] / 1e9),
                           ("% peak", ">7", lambda r: f"{100 * r['peak']:.1f}%"), ("x M2090", ">8.1f", "m2090"),
                           ("check", "", "check")])
    else:
        print_table(rows, [*KEYS, ("time s", ">9.3f", "time_s"), ("scipy s", ">9.3f", "scipy_s"),
                           ("ratio", ">6.1f", "ratio"), ("check", "", "check")])


if __name__ == "__main__":
    main()
