"""The hydrology commands end to end as a user runs them: CLI wall seconds of each command in a
fresh process (``python -m cli``; reading the store, computing, writing the result and the
vectors included) and its peak RSS, on a ``terrain synth`` store (seed 1, tile 256, shard 8; made
if missing) routed by ``terrain flow`` first.

    python benchmarks/bench_hydro_cli.py --size 16384 --device gpu --threshold 1000 --workdir /tmp/h
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(args: list[str]) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child so far, MiB
    lines = (out.stdout + out.stderr).strip().splitlines() or [""]
    return {"command": " ".join(args[:1] + args[2:]), "wall_s": round(wall, 2), "max_child_rss_mib": round(rss),
            "exit": out.returncode, "line": lines[-1]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=16384)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--threshold", default="1000")
    ap.add_argument("--memory", default=None)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench_hydro_cli"))
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    store = a.workdir / f"synth{a.size}.zarr"
    mem = ["--memory", a.memory] if a.memory else []
    dev = ["--device", a.device]
    if not store.exists():
        synth = ["synth", "-o", str(store), "--size", str(a.size), "--seed", "1", "--tile", "256", "--shard", "8"]
        print(json.dumps(timed(synth)), flush=True)
    for args in (["fill", str(store), *dev, *mem], ["flow", str(store), *dev, *mem],
                 ["basins", str(store), *dev, *mem],
                 ["watershed", str(store), "--cell", f"{a.size // 2},{a.size // 2}", "--snap", "3000", *dev, *mem],
                 ["streams", str(store), "--threshold", a.threshold, *dev, *mem],
                 ["streams", str(store), "--threshold", a.threshold, "-o", str(a.workdir / "streams.gpkg"),
                  "--overwrite", *dev, *mem],
                 ["hand", str(store), "--threshold", a.threshold, *dev, *mem]):
        print(json.dumps(timed(args)), flush=True)


if __name__ == "__main__":
    main()
