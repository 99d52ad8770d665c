"""The hydrology's reads onto the GPU (issue 30), where their time goes: in one process, after the
CUDA context's start (timed first) and a warm-up, each array ``streams`` and ``hand`` read -- the flow
directions, the accumulation narrowed to uint32 or made the stream mask, the elevations -- read by
``upload_held`` the CPU's way (threads decode shards, each copied to the GPU from pageable memory:
``TERRAIN_NVCOMP=0``) and as zstd frames decoded on the GPU (nvCOMP: ``pinned.read_device``), and by
the host's decode alone (no GPU): wall and process CPU seconds (user + sys) a read, one JSON line a
read and round; first the bus: 256 MiB copied to the GPU from pageable and from pinned memory.

``--cli NAME=TREE,...``: then ``terrain streams -o`` and ``terrain hand`` (``--commands``; ``flow``
rewrites the store's flow with the same cells) on STORE instead, a fresh
process each (``bench_flow_cli.terrain``: CLI wall, peak RSS and GPU memory), the trees alternating,
each on PYTHONPATH first (the rest of PYTHONPATH kept), with the result's phases (``timings``).

    python benchmarks/bench_gpu_read.py /tmp/w/s16384.zarr --repeat 2
    python benchmarks/bench_gpu_read.py /tmp/w/s16384.zarr --cli main=/repo,branch=/repo/.wt-x --repeat 2
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import resource
import time
import warnings

import numpy as np


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn) -> tuple[float, float]:
    import cupy

    cupy.cuda.Device().synchronize()
    c, t = cpu_seconds(), time.perf_counter()
    fn()
    cupy.cuda.Device().synchronize()
    return round(time.perf_counter() - t, 3), round(cpu_seconds() - c, 3)


def reads(path: str, repeat: int, threshold: float) -> None:
    t = time.perf_counter()
    import cupy

    cupy.empty(1)
    cupy.cuda.Device().synchronize()
    print(json.dumps({"cuda_start_s": round(time.perf_counter() - t, 3)}), flush=True)
    import cupyx

    host, pinned, dev = np.ones(1 << 28, np.uint8), cupyx.empty_pinned(1 << 28, np.uint8), cupy.empty(1 << 28, np.uint8)
    pinned[...] = 1
    for _ in range(2):  # the bus, 256 MiB to the GPU: from pageable memory (a fresh block's way) and from pinned
        bus = {k: timed(lambda b=b: dev.set(b)) for k, b in (("pageable", host), ("pinned", pinned))}
    print(json.dumps({"bus_256MiB_s": bus}), flush=True)
    from terrain_io.grid.flow.upload import threads, upload_held
    from terrain_io.store import TerrainStore

    st = TerrainStore.open(path)
    source = st.group["flow"].attrs.get("source", "elevation")
    arrays = {"direction": ("flow/direction", None),
              "accumulation_u32": ("flow/accumulation", (np.uint32, lambda b: b.astype(np.uint32))),
              "accumulation_mask": ("flow/accumulation", (np.bool_, lambda b: b >= threshold)),
              "elevation": (source, None)}

    def host_only(name, convert):
        def one(win):
            block = st.read(win, name)
            if convert is not None:
                convert[1](block)

        with concurrent.futures.ThreadPoolExecutor(threads(st)) as pool:
            list(pool.map(one, st.shards()))

    for rnd in range(repeat + 1):  # round 0: the warm-up (kernels loaded, pools grown)
        for key, (name, convert) in arrays.items():
            row = {"read": key, "round": rnd, "threads": threads(st)}
            for way, env in (("cpu_decode", "0"), ("gpu_decode", "1")):
                os.environ["TERRAIN_NVCOMP"] = env
                with warnings.catch_warnings(record=True) as notes:
                    warnings.simplefilter("always")
                    row[way] = timed(lambda: upload_held(st, name, None, convert))
                if notes:
                    row[f"{way}_notes"] = [str(n.message) for n in notes]
            row["host_decode_only"] = timed(lambda: host_only(name, convert))
            print(json.dumps(row), flush=True)


def cli(path: str, trees: str, commands: list[str], repeat: int, threshold: str, work: str, device: str) -> None:
    from bench_flow_cli import terrain

    rest = os.environ.get("PYTHONPATH", "")
    for rnd in range(1, repeat + 1):
        for tree in trees.split(","):
            name, root = tree.split("=", 1)
            os.environ["PYTHONPATH"] = root + (":" + rest if rest else "")
            for cmd in commands:
                args = [cmd, path, "--device", device, "-q"] + (["--threshold", threshold] if cmd != "flow" else [])
                if cmd == "streams":
                    args += ["-o", os.path.join(work, f"streams_{name}.gpkg"), "--overwrite"]
                try:
                    wall, peak, gpu = terrain(*args)
                except SystemExit as exc:  # one run failed: said, and the next one measured
                    print(json.dumps({"tree": name, "command": cmd, "round": rnd, "failed": str(exc)}), flush=True)
                    continue
                with open(os.path.join(path, cmd, "zarr.json")) as f:
                    timings = json.load(f)["attributes"].get("timings")
                print(json.dumps({"tree": name, "command": cmd, "round": rnd, "cli_wall_s": round(wall, 2),
                                  "peak_rss_gib": round(peak / 2**30, 2), "peak_gpu_mib": gpu, "timings": timings}),
                      flush=True)
    os.environ["PYTHONPATH"] = rest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threshold", default="1000")
    ap.add_argument("--cli", help="NAME=TREE,...: the commands' CLI walls of each tree instead")
    ap.add_argument("--work", help="where --cli writes the GeoPackages (default: the store's folder)")
    ap.add_argument("--device", default="gpu", help="--cli's device")
    ap.add_argument("--commands", default="streams,hand", help="--cli's commands, of streams, hand and flow")
    a = ap.parse_args()
    if a.cli:
        cli(a.store, a.cli, a.commands.split(","), a.repeat, a.threshold,
            a.work or os.path.dirname(os.path.abspath(a.store)), a.device)
    else:
        reads(a.store, a.repeat, float(a.threshold))


if __name__ == "__main__":
    main()
