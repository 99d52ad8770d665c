"""1 GPU against 2 (or more): ``--scheduler local-cuda`` on one host, side by side, in fresh processes.

One call makes the synthetic store once (or takes ``--store``), then runs each ``STEP:CONFIG`` of
``--runs`` in a fresh Python process (the client), in the order given:

- steps: ``mst``, ``shards`` (``sssp --method shards``, one source at the centre), ``index``
  (``sssp --method index``), ``fill``, ``flow``;
- configs: ``local`` (the one-process GPU pipeline on GPU 0), ``cuda1``, ``cuda2``, ...:
  ``--scheduler local-cuda`` with ``CUDA_VISIBLE_DEVICES`` = the first 1, 2, ... GPUs (a Dask worker
  per GPU, started for the command and closed after it, as ``terrain CMD --scheduler local-cuda``).

Per run: the process's wall time (interpreter start and imports included), the command's wall time,
the time the client waits inside the Dask task maps (``map_shards``; ``imap_shards``: inside each
``next``): "on workers" (the MST: its runs of the tile phase, then its runs of the expand); the rest
is the client (the MST: the merges of blocks that span runs, the decisions grouped by shard; the
SSSP shard method's scheduling between rounds), the cluster's start and close apart, the command's own phase timings, and -- sampled every 0.2 s from this
process -- the peak RSS of the client and of each of its worker processes (psutil) and the peak used
memory of each GPU (NVML: the device's whole use, any other context on it included). At the end the
ratios of ``cuda1`` to ``cuda2`` (and to ``local``) per step. A run past ``--run-limit`` or the
``--deadline`` is killed (its row says so); runs not started by the deadline are skipped.

    python benchmarks/bench_multigpu.py --size 32768 --json out.json --deadline 300
    CUDA_VISIBLE_DEVICES=0,1 python benchmarks/bench_multigpu.py --device cpu --size 256 --tile 32 --shard 2
      (the same plumbing on the CPU: pretended GPUs, plain distributed workers, a rehearsal)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_RUNS = ("mst:cuda2,mst:cuda1,fill:cuda2,fill:cuda1,flow:cuda2,flow:cuda1,shards:cuda2,shards:cuda1,"
                "mst:local")  # each step's 2-GPU run first: a kernel left to compile counts against 2 GPUs


# --- the child: one command in a fresh process --------------------------------------------------

def child(args) -> None:
    """Run one step on one config; print one line ``RESULT {json}``."""
    from terrain_io import parallel

    on_workers = [0.0]
    cluster_start = [0.0]

    def timed(fn, generator=False):
        """fn's wall time added to on_workers, less a cluster start inside it."""
        def add(t0, started0):
            on_workers[0] += time.perf_counter() - t0 - (cluster_start[0] - started0)

        def run(*a, **k):
            t0, started0 = time.perf_counter(), cluster_start[0]
            try:
                return fn(*a, **k)
            finally:
                add(t0, started0)

        def gen(*a, **k):  # the time inside each next(): the caller may stop short of the end (zip)
            it = fn(*a, **k)
            while True:
                t0, started0 = time.perf_counter(), cluster_start[0]
                try:
                    item = next(it)
                except StopIteration:
                    return
                finally:
                    add(t0, started0)
                yield item
        return gen if generator else run

    def start_timed(fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            started = parallel.LOCAL_CUDA not in parallel._clusters
            try:
                return fn(*a, **k)
            finally:
                if started:
                    cluster_start[0] += time.perf_counter() - t0
        return run

    # patched before the pipelines import them (their modules bind the names at import)
    parallel.local_cuda_address = start_timed(parallel.local_cuda_address)
    parallel.map_shards = timed(parallel.map_shards)
    parallel.imap_shards = timed(parallel.imap_shards, generator=True)

    from terrain_io.store import TerrainStore

    name, config = args.child
    scheduler = "local" if config == "local" else "local-cuda"
    st = TerrainStore.open(args.store)
    t0 = time.perf_counter()
    try:
        out = step(name, st, args.device, scheduler, args.memory, args.unit, args.weight)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports and goes on
        out = {"error": f"{type(exc).__name__}: {exc}"}
    t1 = time.perf_counter()
    parallel.close_clusters()
    close = time.perf_counter() - t1
    wall = time.perf_counter() - t0
    row = {"command_s": round(wall, 2), **out}
    if scheduler != "local":
        row.update(on_workers_s=round(on_workers[0], 2),
                   client_s=round(wall - on_workers[0] - cluster_start[0] - close, 2),
                   cluster_start_s=round(cluster_start[0], 2), cluster_close_s=round(close, 2))
    print("RESULT " + json.dumps(row, default=str), flush=True)


def step(name, st, device, scheduler, memory, unit, weight="absdiff"):
    from terrain_io.grid.fill import fill
    from terrain_io.grid.flow.pipeline import flow
    from terrain_io.grid.mst import mst
    from terrain_io.grid.sssp.engine import sssp

    rows, cols = st.shape
    if name == "mst":
        r = mst(st, device=device, memory=memory, progress=False, scheduler=scheduler)
        return {"edges": r.edges, "trees": r.trees, "total_weight": r.total_weight_exact, "timings": r.timings}
    if name in ("shards", "index"):
        r = sssp(st, [(rows // 2, cols // 2)], weight=weight, cell=True, device=device, memory=memory, progress=False,
                 method=name, name=name, scheduler=scheduler, unit=unit if name == "shards" else None)
        return {"reached": r.reached, "max_distance": r.max_distance, "timings": r.timings,
                "stats": r.merge_stats}
    if name == "fill":
        r = fill(st, device=device, memory=memory, progress=False, scheduler=scheduler)
        return {"method": r.method, "device": r.device, "depressions": r.depressions, "timings": r.timings}
    if name == "flow":
        r = flow(st, device=device, memory=memory, progress=False, scheduler=scheduler)
        return {"timings": getattr(r, "timings", None)}
    raise SystemExit(f"unknown step {name}")


# --- the parent: the store once, then a fresh process per run, sampled --------------------------

class Sampler(threading.Thread):
    """Peak RSS of a process and of each of its descendants, and peak used memory of each GPU."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        import psutil

        self.root = psutil.Process(pid)
        self.rss: dict[int, int] = {}
        self.stop = threading.Event()
        self.gpu: dict[int, int] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception:
            self.handles, self.nvml = [], None

    def run(self):
        while True:
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except Exception:  # the client is gone
                procs = []
            for p in procs:
                try:
                    self.rss[p.pid] = max(self.rss.get(p.pid, 0), p.memory_info().rss)
                except Exception:
                    pass
            for i, h in enumerate(self.handles):
                self.gpu[i] = max(self.gpu.get(i, 0), self.nvml.nvmlDeviceGetMemoryInfo(h).used)
            if self.stop.wait(0.2):
                return

    def result(self, workers: int) -> dict:
        self.stop.set()
        self.join()
        me = self.root.pid
        others = sorted((v for k, v in self.rss.items() if k != me), reverse=True)
        return {"client_rss_gib": round(self.rss.get(me, 0) / 2**30, 2),
                "worker_rss_gib": [round(v / 2**30, 2) for v in others[:workers]],
                "gpu_used_gib": [round(self.gpu[i] / 2**30, 2) for i in sorted(self.gpu)]}


def run_one(args, name: str, config: str, gpus: list[str], limit: float) -> dict:
    n = 1 if config == "local" else int(config.removeprefix("cuda"))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(gpus[:n]), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, __file__, "--child", name, config, "--store", str(args.store), "--device", args.device,
           "--memory", args.memory, "--weight", args.weight, *(["--unit", str(args.unit)] if args.unit else [])]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    killed = False
    try:
        proc.wait(timeout=max(1.0, limit))
    except subprocess.TimeoutExpired:
        killed = True
        os.killpg(proc.pid, 9)  # the client and its workers (its own session)
        proc.wait()
    wall = time.perf_counter() - t0
    reader.join(5)
    row = {"step": name, "config": config, "process_s": round(wall, 2), **sampler.result(max(1, n))}
    if config == "local":
        row["worker_rss_gib"] = []
    result = [ln for ln in lines if ln.startswith("RESULT ")]
    if result:
        row.update(json.loads(result[-1][len("RESULT "):]))
    else:
        row["error"] = (f"killed after {limit:.0f} s" if killed else f"exit {proc.returncode}") + ": " + \
            " | ".join(ln.strip() for ln in lines[-6:])
    return row


def ratios(rows: list[dict]) -> list[str]:
    """cuda1 / cudaN and local / cudaN per step: the command, the time on workers, the distributed
    phase (MST: its tile phase; the SSSP methods: the task maps)."""
    by = {(r["step"], r["config"]): r for r in rows if "error" not in r and "skipped" not in r}
    out = []
    for name in dict.fromkeys(r["step"] for r in rows):
        base = by.get((name, "cuda1"))
        for (s, config), r in by.items():
            if s != name or config in ("cuda1", "local"):
                continue
            parts = []
            for ref_name, ref in (("cuda1", base), ("local", by.get((name, "local")))):
                if ref is None:
                    continue
                parts.append(f"{ref_name}/{config}: command {ref['command_s'] / r['command_s']:.2f}x, "
                             f"process {ref['process_s'] / r['process_s']:.2f}x")
                if ref_name == "cuda1" and r.get("on_workers_s"):
                    parts.append(f"on workers {ref['on_workers_s'] / r['on_workers_s']:.2f}x")
                    tile = [(x.get("timings") or {}).get("tile_phase", 0) - x["cluster_start_s"] for x in (ref, r)]
                    if tile[0] > 0 and tile[1] > 0:  # (the cluster starts inside it)
                        parts.append(f"tile phase {tile[0] / tile[1]:.2f}x")
            if parts:
                out.append(f"{name}: " + "; ".join(parts))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--shard", type=int, default=8)
    ap.add_argument("--memory", default="16GB")
    ap.add_argument("--device", default="gpu", help="cpu: the same plumbing on the CPU (a rehearsal)")
    ap.add_argument("--unit", type=int, help="the shard method's unit side (default: from the budget)")
    ap.add_argument("--weight", default="absdiff", help="the SSSP steps' edge weight (shards, index)")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="STEP:CONFIG,... in the order to run")
    ap.add_argument("--store", help="the store to use; made there (synthetic, seed 1) when it does not exist")
    ap.add_argument("--only-store", action="store_true", help="make the store and stop")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds from the start: start no run after "
                    "this, kill one still running at it")
    ap.add_argument("--run-limit", type=float, default=600.0, help="seconds: kill a run that takes longer")
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=2, metavar=("STEP", "CONFIG"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    t_start = time.perf_counter()
    from terrain_io import parallel
    from terrain_io.store import TerrainStore
    from terrain_io.synth import synthesize

    args.store = Path(args.store or Path(tempfile.gettempdir()) / f"bench-multigpu-{args.size}.zarr")
    if not args.store.exists():
        shutil.rmtree(args.store.with_name(args.store.name + ".tmp"), ignore_errors=True)
        t0 = time.perf_counter()
        synthesize(args.store, args.size, seed=1, tile=args.tile, shard=args.shard)
        print(f"synth {args.size}^2: {time.perf_counter() - t0:.1f} s", flush=True)
    if args.only_store:
        return
    shape = list(TerrainStore.open(args.store).shape)
    gpus = [g for g in (os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(parallel.visible_gpus())).split(",") if g]
    host = {"host": platform.node(), "cpus": os.cpu_count(), "gpus": gpus, "size": shape, "memory": args.memory,
            "device": args.device, "unit": args.unit, "weight": args.weight}
    print(json.dumps(host), flush=True)
    rows = []
    for run in args.runs.split(","):
        name, config = run.split(":")
        left = args.deadline - (time.perf_counter() - t_start)
        n = 1 if config == "local" else int(config.removeprefix("cuda"))
        if left < 5 or n > len(gpus):
            row = {"step": name, "config": config, "skipped": "deadline" if left < 5 else f"{len(gpus)} GPUs"}
        else:
            row = run_one(args, name, config, gpus, min(args.run_limit, left))
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        if args.json:  # after every row: a call cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"host": host, "rows": rows}, default=str, indent=1))
    for line in ratios(rows):
        print(line, flush=True)


if __name__ == "__main__":
    main()
