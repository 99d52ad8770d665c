"""BFS: the BFS project's graphs (density 25 %, degree cap 100 %) and R-MAT; GTEPS.

Padamata & Raveendran 2013, "Experiments": 10240 / 40960 vertices, optimised GPU BFS on a Tesla
M2090 45.4 / 574.8 ms, one CPU core 197.1 / 1892.4 ms. R-MAT: Graph500 parameters, edge factor
16, undirected; TEPS = input edges inside the traversed component / time, harmonic mean over
sources (Graph500 convention). Depths are checked against scipy's breadth_first_order tree.

    python benchmarks/bench_bfs.py [--project 10240,40960] [--rmat 24] [--sources 8] [--device gpu|cpu|both]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import numpy as np
from numba import njit
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import cpu_median, gpu_median, save_rows  # noqa: E402

from terrain_io.backend import gpu_available, to_host  # noqa: E402
from terrain_io.graph import generate  # noqa: E402
from terrain_io.graph._csr import csr_from_edges  # noqa: E402
from terrain_io.graph.bfs import bfs  # noqa: E402
from terrain_io.memory import format_bytes, peak_rss  # noqa: E402

PROJECT = {10240: {"m2090_ms": 45.412, "cpu_ms": 197.114}, 40960: {"m2090_ms": 574.792, "cpu_ms": 1892.354}}


@njit(cache=True)
def _tree_depths(order, pred, depth):
    for k in range(1, order.shape[0]):     # BFS order: every parent comes before its children
        depth[order[k]] = depth[pred[order[k]]] + 1


def scipy_depth(mat, source):
    """Depths from scipy's BFS tree, and the milliseconds breadth_first_order took."""
    t = time.perf_counter()
    order, pred = breadth_first_order(mat, source, directed=True, return_predecessors=True)
    ms = (time.perf_counter() - t) * 1e3
    depth = np.full(mat.shape[0], -1, np.int64)
    depth[source] = 0
    _tree_depths(order, pred, depth)
    return depth, ms


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", default="10240,40960")
    ap.add_argument("--rmat", type=int, default=24)
    ap.add_argument("--sources", type=int, default=8)
    ap.add_argument("--device", default="both", choices=["gpu", "cpu", "both"])
    ap.add_argument("--gpu-only", action="store_true", help="skip scipy and our CPU runs (GPU checked by CPU BFS)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    use_gpu = args.device in ("gpu", "both") and gpu_available()
    dev = "gpu" if use_gpu else "cpu"
    rows = []
    for n in [int(x) for x in args.project.split(",") if x]:
        el = generate.bfs_project_graph(n, density=0.25, max_degree=1.0, seed=1, device=dev)
        g = csr_from_edges(el.u, el.v, n, device=dev)
        hg = g.to("cpu")
        row = dict(graph=f"BFS project n={n} density 25%", n=n, m=g.m, date=date)
        mat = None
        if args.gpu_only:
            ref, _ = bfs(hg, 0)
        else:
            mat = sp.csr_matrix((np.ones(g.m, np.int8), hg.indices, hg.indptr), shape=(n, n))
            ref, ms = scipy_depth(mat, 0)
            row["scipy_ms"] = round(ms, 1)
            d_cpu, _ = bfs(hg, 0)
            assert np.array_equal(d_cpu, ref)
            row["cpu_frontier_1core_ms"] = round(cpu_median(lambda: bfs(hg, 0), reps=1), 1)
            row["cpu_peak_rss"] = format_bytes(peak_rss())
        if use_gpu:
            import cupy

            row["device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
            for method in ("auto", "naive"):
                d, _ = bfs(g, 0, method=method)
                assert np.array_equal(to_host(d), ref), method
                ms = gpu_median(lambda: bfs(g, 0, method=method), reps=3)
                row[f"gpu_{method}_ms"] = round(ms, 3)
                row[f"gpu_{method}_gteps"] = round(g.m / ms / 1e6, 2)
            paper = PROJECT.get(n)
            if paper:
                row["vs_m2090"] = round(paper["m2090_ms"] / row["gpu_auto_ms"], 1)
                if not args.gpu_only:
                    row["cpu_vs_paper_cpu"] = round(paper["cpu_ms"] / row["cpu_frontier_1core_ms"], 2)
            cupy.get_default_memory_pool().free_all_blocks()
        rows.append(row)
        print(json.dumps(row), flush=True)
        del el, g, hg, mat
    if args.rmat:
        el = generate.rmat(args.rmat, 16, seed=5, device=dev)
        g = csr_from_edges(el.u, el.v, el.n, symmetric=True, device=dev)
        hu, hv = to_host(el.u), to_host(el.v)
        rng = np.random.default_rng(0)
        deg = to_host(g.indptr[1:] - g.indptr[:-1])
        sources = rng.choice(np.flatnonzero(deg > 0), args.sources, replace=False)
        row = dict(graph=f"R-MAT scale {args.rmat} (undirected)", n=el.n, m_input=el.m, m_stored=g.m, date=date)
        hg = g.to("cpu")
        if args.gpu_only:
            ref, _ = bfs(hg, int(sources[0]))
        else:
            mat = sp.csr_matrix((np.ones(g.m, np.int8), hg.indices, hg.indptr), shape=(el.n, el.n))
            ref, ms = scipy_depth(mat, int(sources[0]))
            row["scipy_ms_1src"] = round(ms, 1)
            d_cpu, _ = bfs(hg, int(sources[0]))
            assert np.array_equal(d_cpu, ref)
            row["cpu_auto_1core_ms_1src"] = round(cpu_median(lambda: bfs(hg, int(sources[0])), reps=1), 1)
        if use_gpu:
            import cupy

            row["device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
            for method in ("auto", "frontier"):
                d, _ = bfs(g, int(sources[0]), method=method)
                assert np.array_equal(to_host(d), ref), method
                teps, times = [], []
                for s in sources:
                    ms = gpu_median(lambda: bfs(g, int(s), method=method), reps=3)
                    d, _ = bfs(g, int(s), method=method)
                    hd = to_host(d)
                    m_comp = int(np.count_nonzero(hd[hu] >= 0))
                    teps.append(m_comp / ms / 1e6)
                    times.append(ms)
                row[f"gpu_{method}_ms_median"] = round(statistics.median(times), 3)
                row[f"gpu_{method}_gteps_hmean"] = round(statistics.harmonic_mean(teps), 2)
            _, _, info = bfs(g, int(sources[0]), return_info=True)
            row["levels"], row["bottom_up_levels"] = info["levels"], info["bottom_up_levels"]
            if not args.gpu_only:
                row["vs_scipy_1src"] = round(row["scipy_ms_1src"] / row["gpu_auto_ms_median"], 1)
            row["gpu_pool_peak"] = format_bytes(cupy.get_default_memory_pool().total_bytes())
        rows.append(row)
        print(json.dumps(row), flush=True)
    return save_rows(rows, args.json)


if __name__ == "__main__":
    main()
