"""``terrain flow`` as a user runs it: CLI wall time of a fresh process (kernels compiled before on a
small store), its peak RSS (the child's own ru_maxrss, by wait4) and the pipeline's own phase times (the ``flow``
result's ``timings`` attribute). Stores made with ``terrain synth`` (seed 0, 10 m cells, tile 256,
shard 8) and filled by ``terrain fill`` on the same device, unless ``--condition none``.

    python benchmarks/bench_flow_cli.py --work /tmp/fl --size 16384 --repeat 2 --device gpu
    python benchmarks/bench_flow_cli.py --work /tmp/fl --size 32768 --memory 8GB --device gpu
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def terrain(*args: str) -> tuple[float, int]:
    """Run ``terrain ARGS`` in a fresh process; its wall seconds and peak RSS in bytes (its own
    rusage, by wait4)."""
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "cli", *args])
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"terrain {' '.join(args)}: exit {child.returncode}")
    return wall, usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--memory", default=None)
    ap.add_argument("--condition", default="fill")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the store (default: deleted at the end)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    mem = ["--memory", a.memory] if a.memory else []
    warm = os.path.join(a.work, "warm.zarr")
    if not os.path.exists(warm):
        terrain("synth", "-o", warm, "--size", "1024", "-q")
        terrain("flow", warm, "--device", a.device, "-q", *mem)  # kernels compiled (fill's too)
    st = os.path.join(a.work, f"s{a.size}.zarr")
    made = {}
    if not os.path.exists(st):
        made["synth_s"] = round(terrain("synth", "-o", st, "--size", str(a.size), "-q")[0], 2)
    if a.condition == "fill" and not os.path.exists(os.path.join(st, "fill", "elevation")):
        made["fill_s"] = round(terrain("fill", st, "--device", a.device, "-q", *mem)[0], 2)
    for run in range(a.repeat):
        wall, peak = terrain("flow", st, "--device", a.device, "--condition", a.condition, "-q", *mem)
        with open(os.path.join(st, "flow", "zarr.json")) as f:
            attrs = json.load(f)["attributes"]
        print(json.dumps({"size": a.size, "run": run, "cli_wall_s": round(wall, 2), "device": attrs["device"],
                          "method": attrs["method"], "in_process_s": round(attrs["seconds"], 2),
                          "timings": attrs["timings"], "flat_cells": attrs["flat_cells"],
                          "max_accumulation": attrs["max_accumulation"], "memory": a.memory,
                          "peak_rss_gib": round(peak / 2**30, 2),
                          **made}), flush=True)
    if not a.keep:
        subprocess.run(["rm", "-rf", st], check=True)


if __name__ == "__main__":
    main()
