"""The hydrology commands end to end as a user runs them: CLI wall seconds of each command in a
fresh process (reading the store, computing, writing the result and the vectors included), its own
peak RSS (wait4) and the phases of the result's ``timings`` attribute, on a ``terrain synth`` store
(seed 0, 10 m cells, tile 256, shard 8) filled and routed by ``terrain fill`` / ``terrain flow``
on the same device. Every kernel is compiled first by the same commands on a 512^2 store (unless
WORK/warm.zarr exists: compiled by an earlier run, e.g. ``pytest -m gpu tests/test_hydro_*.py``).

``--workflow``: the issue's chain at that size (synth, fill, flow, streams with vectors, HAND) and
the sum of its CLI walls; otherwise basins, watershed, streams with vectors and HAND each (``--only``),
each ``--repeat`` times (the sum counts the first run of each).

    python benchmarks/bench_hydro_cli.py --work /tmp/h --size 16384 --device gpu
    python benchmarks/bench_hydro_cli.py --work /tmp/h --size 32768 --memory 8GB --device gpu --workflow
"""
from __future__ import annotations

import json
import os
import shutil

from bench_flow_cli import cli_parser, terrain

GROUPS = {"fill": "fill", "flow": "flow", "basins": "basins", "watershed": "watershed/default", "streams": "streams",
          "hand": "hand"}


def steps(st: str, size: int, work: str, threshold: str, only: list[str]) -> list[list[str]]:
    gpkg = os.path.join(work, f"streams{size}.gpkg")
    chain = [["synth", "-o", st, "--size", str(size)], ["fill", st], ["flow", st]]
    hydro = [["basins", st], ["watershed", st, "--cell", f"{size // 2},{size // 2}", "--snap", "300"],
             ["streams", st, "--threshold", threshold, "-o", gpkg, "--overwrite"], ["hand", st, "--threshold", threshold]]
    return chain + [h for h in hydro if h[0] in only]


def runs(steps: list[list[str]], repeat: int):
    """Each step, the hydrology's ``repeat`` times in a row; with the run's number from 1."""
    for args in steps:
        for i in range(1 if args[0] in ("synth", "fill", "flow") else repeat):
            yield args, i + 1


def main() -> None:
    ap = cli_parser(__doc__)
    ap.add_argument("--threshold", default="1000")
    ap.add_argument("--workflow", action="store_true")
    ap.add_argument("--only", default="basins,watershed,streams,hand", help="the hydrology commands to run")
    ap.add_argument("--keep", action="store_true", help="keep the store (WORK/sSIZE.zarr) for a profile after")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each hydrology command (not the workflow's sum)")
    a = ap.parse_args()
    only = ["streams", "hand"] if a.workflow else a.only.split(",")
    # Python's bytecode cached as a pip install leaves it (pip compiles it): with PYTHONDONTWRITEBYTECODE
    # set (the GPU machine) every command compiled ~290 modules from source again, ~0.8 s of start-up
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.makedirs(a.work, exist_ok=True)
    opts = ["--device", a.device, "-q"] + (["--memory", a.memory] if a.memory else [])
    warm = os.path.join(a.work, "warm.zarr")
    if not os.path.exists(warm):  # every kernel compiled (numba's cache, CuPy's) by the same commands
        for args in steps(warm, 512, a.work, "100", only):
            terrain(*args, *(opts if args[0] != "synth" else ["-q"]))
    st = os.path.join(a.work, f"s{a.size}.zarr")
    total = 0.0
    for args, run in runs(steps(st, a.size, a.work, a.threshold, only), a.repeat):
        try:
            wall, peak, gpu_mib = terrain(*args, *(opts if args[0] != "synth" else ["-q"]))
        except SystemExit as e:  # a failed step: said, and the next one measured
            print(json.dumps({"size": a.size, "failed": str(e)}), flush=True)
            continue
        total += wall if run == 1 else 0.0
        row = {"size": a.size, "command": " ".join(args[:1] + (["-o", ".gpkg"] if args[0] == "streams" else [])),
               "run": run, "cli_wall_s": round(wall, 2), "peak_rss_gib": round(peak / 2**30, 2), "peak_gpu_mib": gpu_mib,
               "memory": a.memory}
        if args[0] in GROUPS:
            with open(os.path.join(st, GROUPS[args[0]], "zarr.json")) as f:
                attrs = json.load(f)["attributes"]
            row["timings"] = attrs.get("timings")
        print(json.dumps(row), flush=True)
    print(json.dumps({"size": a.size, "memory": a.memory, "sum_of_cli_walls_s": round(total, 2)}), flush=True)
    if not a.keep:
        shutil.rmtree(st)


if __name__ == "__main__":
    main()
