"""First run on a cold numba cache: the demo and each command, each in a fresh process with an empty
``NUMBA_CACHE_DIR`` (run from a copy of the sources without ``__pycache__``, as a fresh clone), then
again on the cache it filled (warm). The table gives the CPU time (user + sys of the process and the
children it waited for: the demo compiles in three processes) and the wall time; cold CPU minus warm
CPU is what the first run pays for compiling.

The goal is a cold demo in <= 15 s of wall time on an otherwise idle 2-core machine (``--budget``).
The verdict is on the wall time when the machine was quiet during the run (1-minute load average
below 0.5 a core before and after), else on the CPU time, against what two cores at the demo's
measured parallel efficiency give in the budget (:data:`CORES_BUSY`: CPU budget = budget x
CORES_BUSY; a shared machine inflates both, CPU time much less). Over it: a line ``REGRESSION`` on
stderr and exit 1; ``--results FILE`` appends the run as a row of a Markdown table to FILE, marked
``**REGRESSION**`` when over.

    python benchmarks/bench_first_run.py                 # everything, ~3-5 min on 2 cores
    python benchmarks/bench_first_run.py --only demo --results benchmarks/RESULTS.md

Where one command's compilation goes, kernel by kernel: ``benchmarks/profile_compile.py``.
"""
from __future__ import annotations

import argparse
import datetime
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
# Cores the cold demo keeps busy on an idle 2-core machine: its CPU time over its wall time there
# (1.72 = 31 s CPU in 18 s, RESULTS.md "First run", a quiet run of the three-process demo).
CORES_BUSY = 1.72
QUIET_LOAD = 0.5  # load average a core under which the machine counts as idle


def fresh_copy(dest: Path) -> Path:
    """The package's sources and sample data copied to ``dest`` without ``__pycache__`` (no numba cache
    files, no bytecode): what a fresh clone runs."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc")
    for name in ("cli", "terrain_io", "sample_data"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    return dest


def terrain(args, cache: Path, cwd: Path, root: Path = ROOT) -> tuple[float, float, int, str]:
    """``terrain ARGS`` in a fresh process with ``NUMBA_CACHE_DIR=cache`` from the sources in ``root``:
    (CPU s, wall s, exit code, stderr)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p))
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
        ("flow", ["flow", "{store}"], work / "filled.zarr"),
        ("flow unfilled", ["flow", "{store}"], store),
        ("streams", ["streams", "{store}", "--threshold", "200"], work / "flowed.zarr"),
    ]


def prepare(work: Path) -> None:
    """The stores the commands start from: the sample converted, one with an SSSP result for ``path``,
    one filled (for ``flow``), one routed by ``flow`` (for ``streams``), and a cost raster aligned with
    them (their kernels compiled in a cache of their own, not measured)."""
    cache = work / "setup-cache"
    steps = [["-q", "convert", SAMPLE, "-o", work / "base.zarr"],
             ["-q", "export", work / "base.zarr", "elevation", "-o", work / "cost.tif"]]
    for args in steps:
        _check(terrain(args, cache, work), args)
    shutil.copytree(work / "base.zarr", work / "routed.zarr")
    shutil.copytree(work / "base.zarr", work / "filled.zarr")
    shutil.copytree(work / "base.zarr", work / "flowed.zarr")
    for args in (["-q", "sssp", work / "routed.zarr", "--cell", "--source", "172,201", "--name", "centre"],
                 ["-q", "fill", work / "filled.zarr"], ["-q", "flow", work / "flowed.zarr"]):
        _check(terrain(args, cache, work), args)


def _check(result, args):
    if result[2] != 0:
        raise SystemExit(f"terrain {' '.join(map(str, args))} failed ({result[2]}):\n{result[3]}")


def load_per_core() -> float:
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def verdict(cpu: float, wall: float, quiet: bool, budget: float) -> tuple[str, float, float]:
    """(criterion, measured, limit) of the cold demo: wall on a quiet machine, else CPU."""
    return ("wall", wall, budget) if quiet else ("cpu", cpu, budget * CORES_BUSY)


def results_row(path: Path, cpu: float, wall: float, warm_cpu: float | None, loads, judged) -> None:
    """Append the cold demo as a row of a Markdown table to ``path``."""
    import subprocess as sp

    commit = sp.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                    text=True).stdout.strip() or "?"
    criterion, value, limit = judged
    flag = "ok" if value <= limit else "**REGRESSION**"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    warm = f"{warm_cpu:.2f}" if warm_cpu is not None else "-"
    row = (f"| {when} | {commit} | {os.cpu_count()} cores, load {loads[0]:.1f} / {loads[1]:.1f} | {wall:.2f} | "
           f"{cpu:.2f} | {warm} | {criterion} {value:.1f} <= {limit:.1f} s: {flag} |\n")
    with open(path, "a") as f:
        f.write(row)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="case names (e.g. demo mst 'sssp walk')")
    ap.add_argument("--budget", type=float, default=DEMO_BUDGET_S, help="the cold demo's wall budget, seconds")
    ap.add_argument("--no-warm", action="store_true", help="cold runs only")
    ap.add_argument("--results", type=Path, help="append the cold demo's row to this Markdown file")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="terrain-first-run-") as tmp:
        work = Path(tmp)
        root = fresh_copy(work / "clone")
        chosen = [c for c in cases(work) if not args.only or c[0] in args.only]
        if any(store is not None for _, _, store in chosen):
            prepare(work)
        print(f"{'command':<14} {'cold cpu s':>10} {'cold wall s':>11} {'warm cpu s':>10} {'compile cpu s':>13}")
        demo = None
        for name, template, store in chosen:
            runs = []
            cache = work / f"cache-{name.replace(' ', '-')}"
            loads = [load_per_core()]
            for attempt in ("cold", "warm"):
                if attempt == "warm" and args.no_warm:
                    break
                folder = work / f"{name.replace(' ', '-')}-{attempt}"
                folder.mkdir()
                if store is not None:
                    shutil.copytree(store, folder / "s.zarr")
                argv_ = [str(a).format(dir=folder, store=folder / "s.zarr") for a in template]
                result = terrain(argv_, cache, folder, root)
                _check(result, argv_)
                runs.append(result)
                if attempt == "cold":
                    loads.append(load_per_core())
            cold_cpu, cold_wall = runs[0][:2]
            warm_cpu = runs[1][0] if len(runs) > 1 else None
            warm = f"{warm_cpu:10.2f}" if warm_cpu is not None else f"{'-':>10}"
            compile_ = f"{cold_cpu - warm_cpu:13.2f}" if warm_cpu is not None else f"{'-':>13}"
            print(f"{name:<14} {cold_cpu:10.2f} {cold_wall:11.2f} {warm} {compile_}", flush=True)
            if name == "demo":
                cores = os.cpu_count() or 1
                quiet = max(loads) < QUIET_LOAD
                demo = (cold_cpu, cold_wall, warm_cpu, [x * cores for x in loads],
                        verdict(cold_cpu, cold_wall, quiet, args.budget))
    if demo is not None:
        cpu, wall, warm_cpu, loads, judged = demo
        if args.results is not None:
            results_row(args.results, cpu, wall, warm_cpu, loads, judged)
        criterion, value, limit = judged
        print(f"cold demo: {wall:.1f} s wall, {cpu:.1f} s CPU (load average {loads[0]:.1f} before, {loads[1]:.1f} "
              f"after); expected on an idle 2-core machine: {cpu / CORES_BUSY:.1f} s wall")
        if value > limit:
            print(f"REGRESSION: the cold demo took {value:.1f} s of {criterion} time, over its budget of "
                  f"{limit:.1f} s ({'the machine was quiet' if criterion == 'wall' else 'a loaded machine: on CPU'})",
                  file=sys.stderr)
            return 1
        print(f"cold demo within budget: {value:.1f} s of {criterion} time <= {limit:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
