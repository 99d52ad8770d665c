"""``terrain flow`` as a user runs it: CLI wall time of a fresh process (kernels compiled before on a
small store), its peak RSS (the child's own ru_maxrss, by wait4), its peak GPU memory (nvidia-smi's
memory.used sampled every 100 ms, the idle card's included) and the pipeline's own phase times (the
result's ``timings`` attribute). Stores made with ``terrain synth`` (seed 0, 10 m cells, tile 256,
shard 8) and filled by ``terrain fill`` on the same device (measured the same way), unless
``--condition none``; ``--then`` runs hydro's commands on the routed store after it.

    python benchmarks/bench_flow_cli.py --work /tmp/fl --size 16384 --repeat 2 --device gpu
    python benchmarks/bench_flow_cli.py --work /tmp/fl --size 32768 --memory 8GB --device gpu
    python benchmarks/bench_flow_cli.py --work /tmp/fl --size 65536 --memory 16GB --then basins streams hand
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time


class GpuPeak:
    """The most GPU memory in use (MiB, nvidia-smi, every 100 ms) while the block runs; None without nvidia-smi."""

    def __enter__(self):
        self.mib, self._proc = None, None
        if shutil.which("nvidia-smi"):
            self._proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                           "-lms", "100"], stdout=subprocess.PIPE, text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self):
        for line in self._proc.stdout:
            if line.strip().isdigit():
                self.mib = max(self.mib or 0, int(line))

    def __exit__(self, *exc):
        if self._proc:
            self._proc.terminate()
            self._reader.join(5)


def terrain(*args: str) -> tuple[float, int, int | None]:
    """Run ``terrain ARGS`` in a fresh process; its wall seconds, peak RSS in bytes (its own
    rusage, by wait4) and the peak GPU memory in MiB meanwhile."""
    with GpuPeak() as gpu:
        t = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "cli", *args])
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"terrain {' '.join(args)}: exit {child.returncode}")
    return wall, usage.ru_maxrss * 1024, gpu.mib


KEPT = ("device", "method", "timings", "flat_cells", "max_accumulation", "depressions", "filled_cells")


def attrs(store: str, group: str) -> dict:
    """The result group's attributes ({} where it has none)."""
    try:
        with open(os.path.join(store, group, "zarr.json")) as f:
            return json.load(f)["attributes"]
    except (OSError, KeyError):
        return {}


def report(step: str, args, store: str, group: str | None, **more) -> None:
    """Run ``terrain ARGS`` (a fresh process) and print one JSON line: walls, peaks, the result's device,
    method and timings, the free disk."""
    try:
        wall, peak, gpu = terrain(*args)
    except SystemExit as e:  # one step failed: say so, and go on to the next
        print(json.dumps({"step": step, "error": str(e), **more}), flush=True)
        return
    a = attrs(store, group) if group else {}
    print(json.dumps({"step": step, "cli_wall_s": round(wall, 2), "peak_rss_gib": round(peak / 2**30, 2),
                      "peak_gpu_mib": gpu, **{k: a[k] for k in KEPT if k in a},
                      "in_process_s": round(a["seconds"], 2) if "seconds" in a else None,
                      "disk_free_gib": round(shutil.disk_usage(store).free / 2**30, 1), **more}), flush=True)


def cli_parser(doc: str) -> argparse.ArgumentParser:
    """The options the CLI benchmarks share: the work folder, the store's size, the device, the budget."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--memory", default=None)
    return ap


def main() -> None:
    ap = cli_parser(__doc__)
    ap.add_argument("--condition", default="fill")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the store (default: deleted at the end)")
    ap.add_argument("--then", nargs="*", default=[], choices=["basins", "streams", "hand"],
                    help="hydro's commands, in this order, on the routed store")
    ap.add_argument("--threshold", default="1000", help="streams and hand: --threshold (cells)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    mem = ["--memory", a.memory] if a.memory else []
    dev = ["--device", a.device]
    hydro = {"basins": ["basins"], "streams": ["streams", "--threshold", a.threshold],
             "hand": ["hand", "--threshold", a.threshold]}
    warm = os.path.join(a.work, "warm.zarr")
    if not os.path.exists(warm):  # kernels compiled (fill's too), and hydro's asked for
        terrain("synth", "-o", warm, "--size", "1024", "-q")
        terrain("flow", warm, *dev, "-q", *mem)
        for cmd in a.then:
            terrain(hydro[cmd][0], warm, *hydro[cmd][1:], *dev, "-q", *mem)
    st = os.path.join(a.work, f"s{a.size}.zarr")
    if not os.path.exists(st):
        report("synth", ("synth", "-o", st, "--size", str(a.size), "-q"), st, None, size=a.size)
    if a.condition == "fill" and not os.path.exists(os.path.join(st, "fill", "elevation")):
        report("fill", ("fill", st, *dev, "-q", *mem), st, "fill", size=a.size, memory=a.memory)
    for run in range(a.repeat):
        report("flow", ("flow", st, *dev, "--condition", a.condition, "-q", *mem), st, "flow", size=a.size,
               run=run, memory=a.memory)
    for cmd in a.then:
        report(cmd, (hydro[cmd][0], st, *hydro[cmd][1:], *dev, "-q", *mem), st, cmd, size=a.size, memory=a.memory)
    if not a.keep:
        subprocess.run(["rm", "-rf", st], check=True)


if __name__ == "__main__":
    main()
