"""The cost of store integrity (crc32c per chunk, shard manifests, checked reads): before and after.

Runs the same job with two source trees, alternating, each run in a fresh subprocess:
  - BEFORE: a checkout without checksums (format_version 1), e.g. `git archive 7614cf5 | tar -x -C /tmp/base`,
  - AFTER: this tree (format_version 2).
Jobs: `convert` of an Esri ASCII grid (MB/s of source file) and a full `terrain mst` pass on a store
that each tree made itself (same values), plus `terrain verify` (after only). Prints every time and
the medians.

    python benchmarks/bench_integrity.py --before /tmp/base --size 4096 --reps 5 --workdir /tmp/bench-int
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

CONVERT = r"""
import sys, time, warnings
warnings.simplefilter("ignore")
from terrain_io.convert import convert
t = time.perf_counter()
convert(sys.argv[1], sys.argv[2], overwrite=True)
print(time.perf_counter() - t)
"""

MST = r"""
import sys, time, warnings
warnings.simplefilter("ignore")
from terrain_io.store import TerrainStore
from terrain_io.grid.mst import mst
st = TerrainStore.open(sys.argv[1])
mst(st, progress=False)  # numba compiled (cached) and the page cache warm
t = time.perf_counter()
mst(st, progress=False)
print(time.perf_counter() - t)
"""

VERIFY = r"""
import sys, time
from terrain_io.integrity import verify
t = time.perf_counter()
r = verify(sys.argv[1])
assert r.sound, r.problems
print(time.perf_counter() - t)
"""


def child(tree: Path, code: str, *args) -> float:
    """Wall seconds of the timed part; the CPU seconds of the timed part go to CPU_TIMES."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    timed = code.replace("t = time.perf_counter()", "import resource as _r\n_u = _r.getrusage(_r.RUSAGE_SELF)\n"
                         "t = time.perf_counter()")
    timed += "\n_v = _r.getrusage(_r.RUSAGE_SELF)\nprint(_v.ru_utime + _v.ru_stime - _u.ru_utime - _u.ru_stime)\n"
    out = subprocess.run([sys.executable, "-c", timed, *map(str, args)], env=env, capture_output=True, text=True,
                         cwd=tree)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: {out.stderr.strip()[-2000:]}")
    lines = out.stdout.strip().splitlines()
    CPU_TIMES.append(float(lines[-1]))
    return float(lines[-2])


CPU_TIMES: list[float] = []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="source tree without checksums")
    ap.add_argument("--after", type=Path, default=HERE)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--jobs", default="convert,mst,verify", help="which of convert, mst, verify to time")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/terrain-bench-integrity"))
    args = ap.parse_args()
    wd = args.workdir
    wd.mkdir(parents=True, exist_ok=True)
    asc = wd / f"synth{args.size}.asc"
    if not asc.exists():
        subprocess.run([sys.executable, "-c", "import sys; from terrain_io.synth import synthesize; "
                        "from terrain_io.export import export; "
                        f"s = synthesize('{wd}/src.zarr', {args.size}, seed=1, overwrite=True); "
                        f"export(s.path, 'elevation', '{asc}', decimals=2)"],
                       env=dict(os.environ, PYTHONPATH=str(args.after)), check=True)
        shutil.rmtree(wd / "src.zarr", ignore_errors=True)
    mb = asc.stat().st_size / 1e6
    print(f"# {platform.node()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; ASCII {args.size}^2 = "
          f"{mb:.0f} MB; reps {args.reps}, alternating")
    trees = {"before": args.before, "after": args.after}
    jobs = args.jobs.split(",")
    times = {(k, job): [] for k in trees for job in ("convert", "mst", "verify")}
    cpu = {(k, job): [] for k in trees for job in ("convert", "mst")}
    for rep in range(args.reps):
        for k, tree in (trees.items() if rep % 2 == 0 else reversed(list(trees.items()))):
            store = wd / f"{k}.zarr"
            line = f"rep {rep} {k:<6}:"
            if "convert" in jobs or not store.exists():
                t = child(tree, CONVERT, asc, store)
                times[k, "convert"].append(t)
                cpu[k, "convert"].append(CPU_TIMES[-1])
                line += f" convert {t:.2f} s ({mb / t:.1f} MB/s, cpu {CPU_TIMES[-1]:.2f} s)"
            if "mst" in jobs:
                times[k, "mst"].append(child(tree, MST, store))
                cpu[k, "mst"].append(CPU_TIMES[-1])
                line += f" mst {times[k, 'mst'][-1]:.2f} s (cpu {CPU_TIMES[-1]:.2f} s)"
            if k == "after" and "verify" in jobs:
                times[k, "verify"].append(child(tree, VERIFY, store))
                line += f" verify {times[k, 'verify'][-1]:.2f} s"
            print(line, flush=True)
    med = {key: statistics.median(v) for key, v in times.items() if v}
    for job in ("convert", "mst"):
        if job in jobs:
            b, a = med["before", job], med["after", job]
            extra = f" ({mb / b:.1f} -> {mb / a:.1f} MB/s)" if job == "convert" else ""
            print(f"{job:<8} median before {b:.2f} s, after {a:.2f} s: {100 * (a / b - 1):+.1f}%{extra}")
            b, a = statistics.median(cpu["before", job]), statistics.median(cpu["after", job])
            print(f"{job:<8} median CPU before {b:.2f} s, after {a:.2f} s: {100 * (a / b - 1):+.1f}%")
    if "verify" in jobs:
        size = sum(p.stat().st_size for p in (wd / "after.zarr").rglob("*") if p.is_file())
        print(f"verify   median {med['after', 'verify']:.2f} s for {size / 1e6:.0f} MB "
              f"({size / 1e6 / med['after', 'verify']:.0f} MB/s)")


if __name__ == "__main__":
    main()
