"""1 GPU against 2 (or more): ``--scheduler local-cuda`` on one host, side by side.

For each configuration the pipelines run through the library, in this process (the client):

- ``local``: the one-process GPU pipeline (``--scheduler local``, GPU 0);
- ``cuda1``, ``cuda2``, ...: ``--scheduler local-cuda`` with ``CUDA_VISIBLE_DEVICES`` = the first
  1, 2, ... GPUs: a Dask worker per GPU, started for the command and closed after it (its start is
  in the command's time, as in ``terrain CMD --scheduler local-cuda``).

Per command: its wall time, the time inside the Dask task maps (``map_shards`` / ``imap_shards``,
"on workers"; the rest is the client: the MST merges and expand, the SSSP shard method's
scheduling, the index's merge; the cluster's start and close apart), the command's own phase timings, and sampled every 0.2 s: the peak
RSS of each worker process (psutil, the client's children) and of the client, and the peak used
memory of each GPU (NVML: the device's whole use, other processes' contexts included).

    python benchmarks/bench_multigpu.py --size 32768 --configs local,cuda1,cuda2 --steps mst,shards
    python benchmarks/bench_multigpu.py --size 8192 --json out.json --deadline 200
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from terrain_io import parallel  # noqa: E402  (patched below, before the pipelines import it)

ON_WORKERS = [0.0]
CLUSTER_START = [0.0]


def _timed(fn):
    def run(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            ON_WORKERS[0] += time.perf_counter() - t0

    def gen(*a, **k):
        t0 = time.perf_counter()
        try:
            yield from fn(*a, **k)
        finally:
            ON_WORKERS[0] += time.perf_counter() - t0
    return gen if fn is parallel.imap_shards else run


def _start_timed(fn):
    def run(*a, **k):
        t0 = time.perf_counter()
        started = parallel.LOCAL_CUDA not in parallel._clusters
        try:
            return fn(*a, **k)
        finally:
            if started:
                CLUSTER_START[0] += time.perf_counter() - t0
    return run


parallel.local_cuda_address = _start_timed(parallel.local_cuda_address)
parallel.map_shards = _timed(parallel.map_shards)
parallel.imap_shards = _timed(parallel.imap_shards)


class Sampler(threading.Thread):
    """Peak RSS of this process and of each descendant, and peak used memory of each GPU."""

    def __init__(self):
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.rss: dict[int, int] = {}
        self.gpu: dict[int, int] = {}
        self.stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception:
            self.handles, self.nvml = [], None

    def run(self):
        while not self.stop.wait(0.2):
            for p in [self.me, *self.me.children(recursive=True)]:
                try:
                    self.rss[p.pid] = max(self.rss.get(p.pid, 0), p.memory_info().rss)
                except Exception:
                    pass
            for i, h in enumerate(self.handles):
                self.gpu[i] = max(self.gpu.get(i, 0), self.nvml.nvmlDeviceGetMemoryInfo(h).used)

    def result(self) -> dict:
        self.stop.set()
        self.join()
        me = self.me.pid
        others = sorted((v for k, v in self.rss.items() if k != me), reverse=True)
        return {"client_rss_gib": round(self.rss.get(me, 0) / 2**30, 2),
                "worker_rss_gib": [round(v / 2**30, 2) for v in others[:8]],
                "gpu_used_gib": [round(self.gpu[i] / 2**30, 2) for i in sorted(self.gpu)]}


def step(name, st, device, scheduler, memory):
    from terrain_io.grid.fill import fill
    from terrain_io.grid.flow.pipeline import flow
    from terrain_io.grid.mst import mst
    from terrain_io.grid.sssp.engine import sssp

    rows, cols = st.shape
    if name == "mst":
        r = mst(st, device=device, memory=memory, progress=False, scheduler=scheduler)
        return {"edges": r.edges, "trees": r.trees, "total_weight": r.total_weight_exact, "timings": r.timings}
    if name in ("shards", "index"):
        r = sssp(st, [(rows // 2, cols // 2)], cell=True, device=device, memory=memory, progress=False,
                 method=name, name=name, scheduler=scheduler)
        return {"timings": getattr(r, "timings", None), "stats": getattr(r, "merge_stats", None)}
    if name == "fill":
        r = fill(st, device=device, memory=memory, progress=False, scheduler=scheduler)
        return {"method": r.method, "device": r.device, "timings": r.timings}
    if name == "flow":
        r = flow(st, device=device, memory=memory, progress=False, scheduler=scheduler)
        return {"timings": getattr(r, "timings", None)}
    raise SystemExit(f"unknown step {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--shard", type=int, default=8)
    ap.add_argument("--memory", default="16GB")
    ap.add_argument("--device", default="gpu", help="cpu: the same plumbing on the CPU (a smoke test)")
    ap.add_argument("--configs", default="local,cuda1,cuda2")
    ap.add_argument("--steps", default="mst,shards,fill,flow")
    ap.add_argument("--store", help="an existing store (else synthesised in --dir)")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds: start no step after this")
    ap.add_argument("--warm", type=int, default=0, help="first run the steps untimed on a store of this side "
                    "with the last config (kernels compiled and cached: not in the figures)")
    ap.add_argument("--json")
    args = ap.parse_args()
    from terrain_io.store import TerrainStore
    from terrain_io.synth import synthesize

    t_start = time.perf_counter()
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(parallel.visible_gpus())
    gpus = gpus.split(",")
    rows = []
    if args.store:
        st = TerrainStore.open(args.store)
    else:
        path = Path(args.dir) / f"bench-multigpu-{args.size}.zarr"
        shutil.rmtree(path, ignore_errors=True)
        t0 = time.perf_counter()
        st = synthesize(path, args.size, seed=1, tile=args.tile, shard=args.shard, scheduler="threads")
        print(f"synth {args.size}^2: {time.perf_counter() - t0:.1f} s", flush=True)
    if args.warm:
        warm = synthesize(Path(args.dir) / "bench-multigpu-warm.zarr", args.warm, seed=2, tile=args.tile,
                          shard=args.shard, scheduler="threads", overwrite=True)
        config = args.configs.split(",")[-1]
        t0 = time.perf_counter()
        for name in args.steps.split(","):
            step(name, warm, args.device, "local" if config == "local" else "local-cuda", args.memory)
            parallel.close_clusters()
        print(f"warm-up at {args.warm}^2: {time.perf_counter() - t0:.1f} s", flush=True)
    host = {"host": platform.node(), "cpus": os.cpu_count(), "gpus": gpus, "size": list(st.shape)}
    print(json.dumps(host), flush=True)
    for name in args.steps.split(","):
        for config in args.configs.split(","):
            if time.perf_counter() - t_start > args.deadline:
                print(f"skipped {name} {config}: past the deadline", flush=True)
                rows.append({"step": name, "config": config, "skipped": "deadline"})
                continue
            n = 1 if config == "local" else int(config.removeprefix("cuda"))
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[:n])
            scheduler = "local" if config == "local" else "local-cuda"
            ON_WORKERS[0] = CLUSTER_START[0] = 0.0
            sampler = Sampler()
            sampler.start()
            t0 = time.perf_counter()
            try:
                out = step(name, st, args.device, scheduler, args.memory)
            except Exception as exc:  # noqa: BLE001 - a benchmark reports and goes on
                out = {"error": f"{type(exc).__name__}: {exc}"}
            t1 = time.perf_counter()
            parallel.close_clusters()
            close = time.perf_counter() - t1
            wall = time.perf_counter() - t0
            tasks = ON_WORKERS[0] - CLUSTER_START[0]
            row = {"step": name, "config": config, "wall_s": round(wall, 2),
                   **({"on_workers_s": round(tasks, 2), "client_s": round(wall - ON_WORKERS[0] - close, 2),
                       "cluster_start_s": round(CLUSTER_START[0], 2), "cluster_close_s": round(close, 2)}
                      if scheduler != "local" else {}),
                   **sampler.result(), **out}
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            if args.json:  # after every row: a run cut short keeps what it measured
                Path(args.json).write_text(json.dumps({"host": host, "rows": rows}, default=str, indent=1))


if __name__ == "__main__":
    main()
