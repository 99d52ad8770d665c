"""Connected components on the graph types of Yogaratnam 2010 and R-MAT, vs scipy (CPU) and cupyx (GPU).

Yogaratnam 2010, sec. 6.2 (docs/ARCHITECTURE.md#references): list, tree and random graphs
with m = 8M edges (random: n = sqrt(m / (2 delta)), delta = 0.001 and 0.01); plus R-MAT scale 24,
edge factor 16 (Graph500). Every GPU labelling is compared with our CPU labelling (same min-id
labels) and its component count with scipy's.

    python benchmarks/bench_components.py [--m 8M] [--rmat 24] [--device gpu|cpu|both]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components as scipy_cc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import cpu_median, gpu_median, parse_count, save_rows  # noqa: E402

from terrain_io.backend import gpu_available, to_host  # noqa: E402
from terrain_io.graph import generate  # noqa: E402
from terrain_io.graph.components import connected_components  # noqa: E402
from terrain_io.graph.io import EdgeList  # noqa: E402
from terrain_io.memory import format_bytes, peak_rss  # noqa: E402


def graphs(m: int, rmat_scale: int, device: str):
    yield "list", generate.list_graph(m + 1, seed=1, device=device)
    yield "tree (k=3)", generate.kary_tree(m + 1, k=3, seed=2, device=device)
    for delta in (0.001, 0.01):
        n = generate.thesis_graph_vertices(m, delta)
        yield f"random delta={delta} (n={n})", generate.random_graph(n, m=m, seed=3, device=device)
    if rmat_scale:
        yield f"R-MAT scale {rmat_scale}", generate.rmat(rmat_scale, 16, seed=4, device=device)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="8M")
    ap.add_argument("--rmat", type=int, default=24)
    ap.add_argument("--device", default="both", choices=["gpu", "cpu", "both"])
    ap.add_argument("--cpu-threads", type=int, default=2)
    ap.add_argument("--cpu-max-m", type=int, default=16 << 20, help="skip our CPU runs above this edge count")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import numba

    numba.set_num_threads(min(args.cpu_threads, numba.config.NUMBA_NUM_THREADS))
    m = parse_count(args.m)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    use_gpu = args.device in ("gpu", "both") and gpu_available()
    rows = []
    for name, g in graphs(m, args.rmat, "gpu" if use_gpu else "cpu"):
        host = EdgeList(to_host(g.u), to_host(g.v), None, g.n)
        row = dict(graph=name, n=g.n, m=g.m, date=date)
        # scipy (peer, CPU): matrix construction not timed
        mat = sp.csr_matrix((np.ones(g.m, dtype=np.int8), (host.u, host.v)), shape=(g.n, g.n))
        t = time.perf_counter()
        k_ref, _ = scipy_cc(mat, directed=False)
        row["scipy_ms"] = round((time.perf_counter() - t) * 1e3, 1)
        row["components"] = int(k_ref)
        # ours, CPU
        if use_gpu and g.m > args.cpu_max_m:      # too slow for a CPU check: compare partitions with scipy's
            lab_cpu = None
        else:
            k_cpu, lab_cpu = connected_components(host)
            assert k_cpu == k_ref
        if g.m <= args.cpu_max_m:
            row["cpu_union_find_ms"] = round(cpu_median(lambda: connected_components(host), reps=1), 1)
            row["cpu_sv_ms"] = round(cpu_median(lambda: connected_components(host, method="sv"), reps=1), 1)
        row["cpu_peak_rss"] = format_bytes(peak_rss())
        if use_gpu:
            import cupy

            pool = cupy.get_default_memory_pool()
            row["device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
            for method in ("union_find", "sv"):
                k, lab = connected_components(g, method=method)
                assert k == k_ref, f"{method}: {k} components on {name}, scipy {k_ref}"
                if lab_cpu is None:
                    lab_cpu = to_host(lab)
                    assert np.all(lab_cpu <= np.arange(g.n)) and np.all(lab_cpu[lab_cpu] == lab_cpu)
                    assert np.all(lab_cpu[host.u] == lab_cpu[host.v])       # every edge inside one label
                assert np.array_equal(to_host(lab), lab_cpu), f"{method} differs on {name}"
                row[f"gpu_{method}_ms"] = round(gpu_median(lambda: connected_components(g, method=method)), 3)
                del lab
            _, _, info = connected_components(g, method="sv", return_info=True)
            row["sv_rounds"] = info["rounds"]
            try:
                import cupyx.scipy.sparse as csp
                from cupyx.scipy.sparse.csgraph import connected_components as cupyx_cc

                cmat = csp.csr_matrix(mat.astype(np.float32))   # cupyx takes no int8 data
                k2, _ = cupyx_cc(cmat, directed=False)
                assert int(k2) == k_ref
                row["cupyx_ms"] = round(gpu_median(lambda: cupyx_cc(cmat, directed=False), reps=3), 3)
                del cmat
            except Exception as exc:              # cupyx csgraph needs pylibcugraph
                row["cupyx_ms"] = f"n/a ({exc.__class__.__name__}: {str(exc)[:60]})"
            row["vs_scipy"] = round(row["scipy_ms"] / row["gpu_union_find_ms"], 1)
            if isinstance(row.get("cupyx_ms"), float):
                row["vs_cupyx"] = round(row["cupyx_ms"] / row["gpu_union_find_ms"], 1)
            pool.free_all_blocks()
            row["gpu_pool_peak"] = format_bytes(pool.total_bytes())
        rows.append(row)
        print(json.dumps(row), flush=True)
        del g, host, mat
    return save_rows(rows, args.json)


if __name__ == "__main__":
    main()
