"""Conversion throughput and peak memory: `terrain convert` vs GDAL/rasterio + zarr, side by side.

Makes a synthetic DEM (`terrain synth`), exports it as an Esri ASCII grid (2 decimals) and as an
uncompressed tiled GeoTIFF, then converts each file to a Zarr store with
  - ours: terrain_io.convert.convert (streaming, bounded memory),
  - peer A: GDAL's own translation to Zarr (rasterio.shutil.copy(driver="Zarr"), i.e. gdal_translate -of Zarr),
  - peer B: rasterio read of the whole raster + one zarr array write (what a script would do),
each in a fresh subprocess so that its peak RSS is its own. Prints MB/s of source file and peak RSS.

    python benchmarks/bench_convert.py --ascii-size 12288 --tiff-size 16384 --workdir /tmp/bench
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
kind, src, out = sys.argv[1:4]
t = time.perf_counter()
if kind == "terrain":
    from terrain_io.convert import convert
    convert(src, out, overwrite=True)
elif kind == "gdal-zarr":
    import rasterio, rasterio.shutil
    with rasterio.Env(GDAL_NUM_THREADS="ALL_CPUS"):
        rasterio.shutil.copy(src, out, driver="Zarr", COMPRESS="ZSTD", BLOCKSIZE="256,256")
elif kind == "rasterio+zarr":
    import numpy as np, rasterio, zarr
    from zarr.codecs import ZstdCodec
    with rasterio.open(src) as ds:
        a = ds.read(1)
    zarr.create_array(out, shape=a.shape, chunks=(256, 256), shards=(2048, 2048), dtype=a.dtype,
                      compressors=ZstdCodec(level=1), overwrite=True)[...] = a
seconds = time.perf_counter() - t
from terrain_io.memory import peak_rss
print(json.dumps({"seconds": seconds, "peak_rss": peak_rss()}))
"""


def run_child(kind: str, src: Path, out: Path) -> dict:
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, str(src), str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_inputs(workdir: Path, ascii_size: int, tiff_size: int) -> tuple[Path, Path]:
    from terrain_io.export import export
    from terrain_io.synth import synthesize

    workdir.mkdir(parents=True, exist_ok=True)
    asc, tif = workdir / f"synth{ascii_size}.asc", workdir / f"synth{tiff_size}.tif"
    if not asc.exists():
        store = synthesize(workdir / f"synth{ascii_size}.zarr", ascii_size, seed=1, overwrite=True)
        export(store.path, "elevation", asc, decimals=2)
    if not tif.exists():
        import numpy as np
        import rasterio
        from rasterio.transform import from_origin

        from terrain_io.synth import synth_array

        profile = dict(driver="GTiff", width=tiff_size, height=tiff_size, count=1, dtype="float32", tiled=True,
                       blockxsize=256, blockysize=256, BIGTIFF="YES", nodata=float("nan"),
                       transform=from_origin(0, tiff_size * 10.0, 10.0, 10.0), crs="EPSG:32617")
        band = 2048
        with rasterio.open(tif, "w", **profile) as ds:
            for r0 in range(0, tiff_size, band):
                block = synth_array(min(band, tiff_size - r0), tiff_size, seed=1, r0=r0)
                ds.write(block, 1, window=rasterio.windows.Window(0, r0, tiff_size, block.shape[0]))
    return asc, tif


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ascii-size", type=int, default=12288)
    ap.add_argument("--tiff-size", type=int, default=16384)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/terrain-bench-convert"))
    ap.add_argument("--peers", default="gdal-zarr,rasterio+zarr")
    args = ap.parse_args()
    asc, tif = make_inputs(args.workdir, args.ascii_size, args.tiff_size)
    print(f"# {platform.node()} {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print(f"{'input':<24}{'MB':>8}  {'tool':<15}{'seconds':>9}{'MB/s':>9}{'peak RSS MB':>13}{'vs ours':>9}")
    for src in (asc, tif):
        mb = src.stat().st_size / 1e6
        ours = None
        for kind in ["terrain"] + args.peers.split(","):
            r = run_child(kind, src, args.workdir / "out.zarr")
            if "error" in r:
                print(f"{src.name:<24}{mb:>8.0f}  {kind:<15} failed: {r['error'][:60]}")
                continue
            ours = ours or r
            ratio = r["seconds"] / ours["seconds"]
            print(f"{src.name:<24}{mb:>8.0f}  {kind:<15}{r['seconds']:>9.2f}{mb / r['seconds']:>9.1f}"
                  f"{r['peak_rss'] / 1e6:>13.0f}{ratio:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
