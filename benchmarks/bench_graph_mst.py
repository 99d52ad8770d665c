"""Minimum spanning forest benchmark: terrain_io.graph.minimum_spanning_forest against
scipy.sparse.csgraph.minimum_spanning_tree, side by side, on the Kruskal report's graph families
(Hiti et al. 2022, section 8: degree-10 sparse graphs and densities 10/50/90%,
up to 3e7 edges) and on R-MAT graphs.

    python benchmarks/bench_graph_mst.py --device cpu --edges 1e6 1e7 --families deg10 d50
    python benchmarks/bench_graph_mst.py --device gpu --edges 1e7 3e7 --rmat 24

Graphs are simple (self-loops and parallel edges removed, so that scipy's matrix sees the same
graph) with distinct uniform float64 weights; every result is checked against scipy (total weight,
forest size). scipy's time is the MST call on a prepared CSR matrix; ours starts from the edge list.
GPU times: CUDA events, median of --repeat runs after a warm-up.
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

from common import gpu_median, print_table  # benchmarks/ is on sys.path when run as a script


def family_graph(family: str, m: int, xp):
    """(u, v, w, n) of a report family with about m edges: deg10 = 10 neighbours per vertex,
    dXX = XX% of all vertex pairs."""
    if family == "deg10":
        n = max(2, m // 5)
    else:
        density = int(family[1:]) / 100
        n = max(2, int(round(math.sqrt(2 * m / density))))
    rng = xp.random.default_rng(m)
    k = int(m * 1.02) + 16
    u, v = rng.integers(0, n, k, dtype=np.int64), rng.integers(0, n, k, dtype=np.int64)
    return simple(u, v, n, m, xp)


def simple(u, v, n, m, xp):
    """Drop self-loops and parallel edges, keep at most m edges (random ones), distinct weights."""
    keep = u != v
    lo, hi = xp.minimum(u[keep], v[keep]), xp.maximum(u[keep], v[keep])
    key = xp.unique(lo * n + hi)
    rng = xp.random.default_rng(1)
    if len(key) > m:
        key = key[xp.argsort(rng.random(len(key)))[:m]]
    lo, hi = key // n, key % n
    w = rng.random(len(lo))
    return lo.astype(np.int32), hi.astype(np.int32), w, n


def rmat_graph(scale: int, device: str):
    from terrain_io.graph.generate import rmat

    e = rmat(scale, seed=1, device=device)
    xp = np if device == "cpu" else __import__("cupy")
    return simple(e.u.astype(np.int64), e.v.astype(np.int64), e.n, len(e.u), xp)


def scipy_mst(u, v, w, n):
    import scipy.sparse as sp
    from scipy.sparse.csgraph import minimum_spanning_tree

    A = sp.csr_matrix((w, (u, v)), shape=(n, n))
    t0 = time.perf_counter()
    T = minimum_spanning_tree(A)
    return time.perf_counter() - t0, float(T.sum()), T.nnz


def main():
    from terrain_io.graph.mst import minimum_spanning_forest
    from terrain_io.memory import format_bytes, peak_rss

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--edges", type=float, nargs="*", default=[1e6])
    ap.add_argument("--families", nargs="+", default=["deg10", "d10", "d50", "d90"])
    ap.add_argument("--methods", nargs="+", default=None)
    ap.add_argument("--rmat", type=int, nargs="*", default=[])
    ap.add_argument("--scipy-max", type=float, default=4e7, help="largest edge count also run with scipy")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    methods = args.methods or (["boruvka", "filter_kruskal", "kruskal"] if args.device == "gpu"
                               else ["filter_kruskal", "kruskal", "boruvka"])
    xp = np if args.device == "cpu" else __import__("cupy")
    graphs = [(f, int(m)) for m in args.edges for f in args.families] + [(f"rmat{s}", 0) for s in args.rmat]
    rows = []
    for family, m in graphs:
        if family.startswith("rmat"):
            u, v, w, n = rmat_graph(int(family[4:]), args.device)
        else:
            u, v, w, n = family_graph(family, m, xp)
        m = len(u)
        if m <= args.scipy_max:
            host = [x.get() if hasattr(x, "get") else x for x in (u, v, w)]
            ts, ws, size = scipy_mst(*host, n)
            del host
        else:
            ts, ws, size = float("nan"), None, None
        for method in methods:
            if args.device == "gpu":
                t = gpu_median(lambda: minimum_spanning_forest((u, v, w), n, method=method), args.repeat) / 1e3
                f = minimum_spanning_forest((u, v, w), n, method=method)
            else:
                minimum_spanning_forest((u[:5000], v[:5000], w[:5000]), n, method=method, threshold=500)  # compile
                t0 = time.perf_counter()
                f = minimum_spanning_forest((u, v, w), n, method=method)
                t = time.perf_counter() - t0
            ok = "-" if ws is None else ("ok" if (np.isclose(f.weight, ws, rtol=1e-9) and len(f.edges) == size) else "MISMATCH")
            row = dict(family=family, n=n, m=m, method=method, time_s=t, scipy_s=ts, ratio=ts / t, check=ok,
                       trees=f.trees)
            rows.append(row)
            print(row, flush=True)
    print(f"\npeak RSS {format_bytes(peak_rss())}")
    print_table(rows, [("graph", ">7", "family"), ("n", ">10", "n"), ("m", ">10", "m"), ("method", ">15", "method"),
                       ("ours ms", ">9.1f", lambda r: r["time_s"] * 1e3), ("scipy ms", ">9.1f", lambda r: r["scipy_s"] * 1e3),
                       ("ratio", ">6.1f", "ratio"), ("check", "", "check")])


if __name__ == "__main__":
    main()
