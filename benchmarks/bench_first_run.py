"""First run on a cold numba cache: the demo and each command, each in a fresh process with an empty
``NUMBA_CACHE_DIR``, then again on the cache it filled (warm). The table gives the CPU time (user +
sys of the process and the children it waited for: the demo compiles in three processes) and the
wall time; cold CPU minus warm CPU is what the first run pays for compiling.

Exits 1 with ``REGRESSION`` when the cold demo exceeds its budget (15 s; ``--budget``). The budget is
on the CPU time by default -- the machine this runs on may be shared, and the demo's CPU time bounds
its wall time from above on one core and from below by half on two -- or on the wall time with
``--budget-on wall`` (an otherwise idle machine).

    python benchmarks/bench_first_run.py                 # everything, ~3-5 min on 2 cores
    python benchmarks/bench_first_run.py --only demo     # the cold demo alone

Where one command's compilation goes, kernel by kernel: ``benchmarks/profile_compile.py``.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data" / "jacksboro_fault_dem.asc"
DEMO_BUDGET_S = 15.0


def terrain(args, cache: Path, cwd: Path) -> tuple[float, float, int, str]:
    """``terrain ARGS`` in a fresh process with ``NUMBA_CACHE_DIR=cache``: (CPU s, wall s, exit code, stderr)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "cli", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, p.returncode, p.stderr


def cases(work: Path) -> list[tuple[str, list, Path | None]]:
    """(name, arguments, the store it needs copied fresh or None)."""
    store = work / "base.zarr"
    return [
        ("demo", ["demo", "-o", "{dir}/demo"], None),
        ("convert", ["convert", SAMPLE, "-o", "{dir}/c.zarr"], None),
        ("mst", ["mst", "{store}"], store),
        ("sssp absdiff", ["sssp", "{store}", "--cell", "--source", "172,201", "--weight", "absdiff", "--name", "a"], store),
        ("sssp surface", ["sssp", "{store}", "--cell", "--source", "172,201", "--weight", "surface", "--name", "a"], store),
        ("sssp cell", ["sssp", "{store}", "--cell", "--source", "172,201", "--weight", "cell", "--cost", work / "cost.tif",
                       "--name", "a"], store),
        ("sssp walk", ["sssp", "{store}", "--cell", "--source", "172,201", "--weight", "walk", "--name", "a"], store),
        ("fill", ["fill", "{store}"], store),
        ("depressions", ["depressions", "{store}"], store),
        ("path", ["path", "{store}", "--name", "centre", "--cell", "--to", "20,30"], work / "routed.zarr"),
    ]


def prepare(work: Path) -> None:
    """The stores the commands start from: the sample converted, one with an SSSP result for ``path``,
    and a cost raster aligned with it (their kernels compiled in a cache of their own, not measured)."""
    cache = work / "setup-cache"
    steps = [["-q", "convert", SAMPLE, "-o", work / "base.zarr"],
             ["-q", "export", work / "base.zarr", "elevation", "-o", work / "cost.tif"]]
    for args in steps:
        _check(terrain(args, cache, work), args)
    shutil.copytree(work / "base.zarr", work / "routed.zarr")
    args = ["-q", "sssp", work / "routed.zarr", "--cell", "--source", "172,201", "--name", "centre"]
    _check(terrain(args, cache, work), args)


def _check(result, args):
    if result[2] != 0:
        raise SystemExit(f"terrain {' '.join(map(str, args))} failed ({result[2]}):\n{result[3]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="case names (e.g. demo mst 'sssp walk')")
    ap.add_argument("--budget", type=float, default=DEMO_BUDGET_S, help="the cold demo's budget, seconds")
    ap.add_argument("--budget-on", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("--no-warm", action="store_true", help="cold runs only")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="terrain-first-run-") as tmp:
        work = Path(tmp)
        chosen = [c for c in cases(work) if not args.only or c[0] in args.only]
        if any(store is not None for _, _, store in chosen):
            prepare(work)
        print(f"{'command':<14} {'cold cpu s':>10} {'cold wall s':>11} {'warm cpu s':>10} {'compile cpu s':>13}")
        demo = None
        for name, template, store in chosen:
            runs = []
            cache = work / f"cache-{name.replace(' ', '-')}"
            for attempt in ("cold", "warm"):
                if attempt == "warm" and args.no_warm:
                    break
                folder = work / f"{name.replace(' ', '-')}-{attempt}"
                folder.mkdir()
                if store is not None:
                    shutil.copytree(store, folder / "s.zarr")
                argv_ = [str(a).format(dir=folder, store=folder / "s.zarr") for a in template]
                result = terrain(argv_, cache, folder)
                _check(result, argv_)
                runs.append(result)
            cold_cpu, cold_wall = runs[0][:2]
            warm = f"{runs[1][0]:10.2f}" if len(runs) > 1 else f"{'-':>10}"
            compile_ = f"{cold_cpu - runs[1][0]:13.2f}" if len(runs) > 1 else f"{'-':>13}"
            print(f"{name:<14} {cold_cpu:10.2f} {cold_wall:11.2f} {warm} {compile_}", flush=True)
            if name == "demo":
                demo = cold_cpu if args.budget_on == "cpu" else cold_wall
    if demo is not None:
        if demo > args.budget:
            print(f"REGRESSION: the cold demo took {demo:.1f} s of {args.budget_on} time, over its budget of "
                  f"{args.budget:.0f} s", file=sys.stderr)
            return 1
        print(f"cold demo within budget: {demo:.1f} s of {args.budget_on} time <= {args.budget:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
