"""List ranking of random lists: our GPU (CuPy) and CPU (numba) kernels vs the paper's table.

Rehman, Kothapalli, Narayanan, "Fast and Scalable List Ranking on the GPU" (ICS'09), table 2:
random lists of 32M / 64M elements, GTX 280 recursive Helman-JaJa 1093 / 2555 ms, CPU sequential
(Core 2 Q6600) 4442 / 9572 ms. Every result is checked (rank[succ[i]] == rank[i] + 1, head = 0).

    python benchmarks/bench_listrank.py [--sizes 32M,64M] [--device gpu|cpu|both] [--cpu-threads 2]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import cpu_median, gpu_median, parse_count, save_rows  # noqa: E402  (benchmarks/ is on the path)
from terrain_io.backend import gpu_available, to_host  # noqa: E402
from terrain_io.graph import generate  # noqa: E402
from terrain_io.graph.listrank import auto_stride, list_rank  # noqa: E402
from terrain_io.memory import format_bytes, peak_rss  # noqa: E402

PAPER = {32 << 20: {"gtx280_rhj_ms": 1093, "cpu_seq_ms": 4442}, 64 << 20: {"gtx280_rhj_ms": 2555, "cpu_seq_ms": 9572}}


def check_ranks(succ, ranks) -> None:
    succ, ranks = to_host(succ), to_host(ranks)
    has = succ >= 0
    assert np.all(ranks[succ[has]] == ranks[has] + 1), "rank check failed"
    assert np.count_nonzero(ranks == 0) == np.count_nonzero(succ < 0), "head count check failed"


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="32M,64M")
    ap.add_argument("--device", default="both", choices=["gpu", "cpu", "both"])
    ap.add_argument("--cpu-threads", type=int, default=2)
    ap.add_argument("--strides", default="8,16,32,64", help="splitter strides swept on the GPU")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = []
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    for n in (parse_count(s) for s in args.sizes.split(",")):
        paper = PAPER.get(n, {})
        if args.device in ("gpu", "both") and gpu_available():
            import cupy

            pool = cupy.get_default_memory_pool()
            succ = generate.random_list(n, seed=1, device="gpu")
            dev = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
            variants = [("recursive_hj (auto)", dict(method="auto"))]
            variants += [(f"recursive_hj stride {s}", dict(method="recursive_hj", stride=int(s)))
                         for s in args.strides.split(",")]
            variants += [("recursive_hj, check=False", dict(method="auto", check=False)),
                         ("helman_jaja (host ranks splitters)", dict(method="helman_jaja")),
                         ("wyllie", dict(method="wyllie"))]
            for name, kw in variants:
                pool.free_all_blocks()
                base = pool.total_bytes()
                ms = gpu_median(lambda: list_rank(succ, **kw))
                ranks = list_rank(succ, **kw)
                check_ranks(succ, ranks)
                peak = pool.total_bytes() - base
                row = dict(device=dev, date=date, n=n, method=name, ms=round(ms, 3),
                           stride=kw.get("stride", auto_stride(n)), gpu_pool_bytes=int(peak),
                           speedup_vs_gtx280=round(paper["gtx280_rhj_ms"] / ms, 1) if paper else None)
                rows.append(row)
                print(json.dumps(row), flush=True)
                del ranks
            del succ
            pool.free_all_blocks()
        if args.device in ("cpu", "both"):
            import numba

            numba.set_num_threads(min(args.cpu_threads, numba.config.NUMBA_NUM_THREADS))
            succ = generate.random_list(n, seed=1)
            for name, kw in [("recursive_hj (auto)", dict(method="auto")), ("sequential walk", dict(method="sequential"))]:
                ms = cpu_median(lambda: list_rank(succ, **kw), reps=1 if n > (16 << 20) else 3)
                check_ranks(succ, list_rank(succ, **kw))
                row = dict(device=f"CPU numba, {numba.get_num_threads()} threads", date=date, n=n, method=name,
                           ms=round(ms, 1), peak_rss=format_bytes(peak_rss()),
                           speedup_vs_paper_cpu=round(paper["cpu_seq_ms"] / ms, 2) if paper else None)
                rows.append(row)
                print(json.dumps(row), flush=True)
            del succ
    print("\n| device | n | method | ms | vs paper |")
    print("|---|---|---|---|---|")
    for r in rows:
        ratio = r.get("speedup_vs_gtx280") or r.get("speedup_vs_paper_cpu")
        print(f"| {r['device']} | {r['n'] >> 20}M | {r['method']} | {r['ms']} | {ratio}x |")
    return save_rows(rows, args.json)


if __name__ == "__main__":
    main()
